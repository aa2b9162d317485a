"""Speculation costs kept across restarts (engine/accel/speculative/costs_file.py): a pair
measured once never scouts or probes again to learn that it cannot pay, and a damaged
file is ignored, never an error."""

import json

import pytest

from brisk.engine.accel.speculative.controller import MAX_STORED_SAMPLES, DraftLengthController, PairCosts
from brisk.engine.accel.speculative.costs_file import FILE_NAME, VERSION, StoredPairCosts

PAIR = ("qwen-1.5b", "qwen-0.5b", "native")


def learn_that_no_draft_pays(costs: PairCosts, plain_s: float) -> DraftLengthController:
    """The measurements of test_speculative's no-draft-can-pay case (Qwen-1.5B + 0.5B on
    this CPU): draft step 0.68 plain steps, a verify of k tokens 1.3 + 0.55 k."""
    c = DraftLengthController("auto", 3, cost_ratio=0.3, pair=PAIR, costs=costs)
    for _ in range(400):
        if c.scout_due():
            c.observe_scout(8.0, 8)
        k = c.choose()
        if k:
            c.observe_cycle(
                drafted=k, proposed=k, accepted=k, draft_s=0.68 * plain_s * k, verify_s=(1.3 + 0.55 * k) * plain_s
            )
        else:
            c.observe_plain(plain_s)
        if c.t_draft.value is not None and not c.could_pay():
            return c
    raise AssertionError("the controller never measured that no draft pays")


def test_a_pair_measured_before_a_restart_decodes_plainly_from_the_start(tmp_path):
    path = tmp_path / FILE_NAME
    first = StoredPairCosts(path)
    measured = learn_that_no_draft_pays(first, plain_s=0.09)
    first.save()
    assert path.is_file()

    # A restart, on a machine now twice as loaded: the costs carry over in plain steps.
    again = DraftLengthController("auto", 3, cost_ratio=0.3, pair=PAIR, costs=StoredPairCosts(path))
    for _ in range(3):
        again.observe_plain(0.18)
    assert again.draft_ratio() == pytest.approx(0.68, rel=0.05)
    for m in range(1, 5):  # the same verify costs, in plain steps
        assert again.verify_time(m) == pytest.approx(2 * measured.verify_time(m), rel=0.05)
    assert not again.could_pay()
    picks = []
    for _ in range(300):
        assert not again.scout_due()
        picks.append(again.choose())
        again.observe_plain(0.18)
    assert not any(picks)
    assert again.plain_run() >= 1 << 20  # one pipelined run for the whole answer

    # Without the file the same start scouts and probes again.
    fresh = DraftLengthController("auto", 3, cost_ratio=0.3, pair=PAIR, costs=StoredPairCosts(tmp_path / "none.json"))
    for _ in range(3):
        fresh.observe_plain(0.18)
    assert fresh.could_pay()


def test_save_writes_only_what_changed_and_loads_back_the_same(tmp_path):
    path = tmp_path / FILE_NAME
    costs = StoredPairCosts(path)
    costs.save()
    assert not path.exists()  # nothing measured: nothing written
    costs.for_pair(PAIR).update(draft_steps=0.5, verify_steps={1: 1.4, 4: 2.6})
    costs.for_pair(("qwen-1.5b", None, "native"))["verify_steps"][3] = 2.1  # lookup-only: no draft
    costs.save()
    loaded = StoredPairCosts(path)
    assert loaded.pairs() == costs.pairs()
    before = path.stat().st_mtime_ns
    loaded.save()
    assert path.stat().st_mtime_ns == before


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff\xfe binary garbage",
        b"{not json",
        b"[]",
        json.dumps({"version": 99, "pairs": []}).encode(),
        json.dumps({"version": VERSION, "pairs": "x"}).encode(),
    ],
)
def test_a_damaged_file_is_ignored_and_replaced_at_the_next_save(tmp_path, content):
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    costs = StoredPairCosts(path)
    assert costs.pairs() == {}
    costs.for_pair(PAIR)["draft_steps"] = 0.4
    costs.save()
    assert StoredPairCosts(path).for_pair(PAIR)["draft_steps"] == 0.4


def test_malformed_entries_are_dropped_and_the_rest_kept(tmp_path):
    good = {"target": "a", "draft": "b", "verify": "native", "draft_steps": 0.5, "verify_steps": {"2": 1.6}}
    bad = [
        {**good, "target": 3},
        {**good, "draft_steps": -1.0},
        {**good, "draft_steps": True},
        {**good, "verify_steps": {"2": float("nan")}},
        {**good, "verify_steps": {"2": "fast"}},
        {**good, "verify_steps": {"-1": 1.0}},
        {**good, "verify_steps": [1.0]},
        {**good, "draft_samples": -3},
        {**good, "draft_samples": 2.5},
        {**good, "verify_samples": {"2": True}},
        {**good, "verify_samples": {"5": 4}},  # counts for a cost it does not hold
        {**good, "verify_samples": [4]},
        "not an entry",
    ]
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps({"version": VERSION, "pairs": [*bad, good]}, allow_nan=True))
    costs = StoredPairCosts(path)
    assert costs.pairs() == {
        ("a", "b", "native"): {"draft_steps": 0.5, "verify_steps": {2: 1.6}, "draft_samples": 0, "verify_samples": {}}
    }


def test_one_slow_turn_moves_the_stored_costs_a_little_and_the_draft_is_still_tried(tmp_path):
    """Qwen-1.5B with its 0.5B draft here: a turn of 46 draft cycles stored a draft step at
    0.39 target steps; the next turn, on a loaded machine, timed one cycle at 0.75 and wrote
    it over them, and from then on every chat (across restarts too) read "drafting cannot
    pay" and never started the draft again. The stored costs are means over the cycles that
    measured them."""
    path = tmp_path / FILE_NAME
    first = StoredPairCosts(path)
    steady = DraftLengthController("auto", 3, cost_ratio=0.3, pair=PAIR, costs=first)
    for _ in range(3):
        steady.observe_plain(0.1)
    for _ in range(40):  # a draft step 0.4 of a plain one, a verify of k tokens 1.2 + 0.3 k
        steady.observe_cycle(drafted=4, proposed=4, accepted=4, draft_s=0.04 * 4, verify_s=0.12 + 0.03 * 4)
        steady.observe_cycle(drafted=1, proposed=1, accepted=1, draft_s=0.04, verify_s=0.12 + 0.03)
    first.save()

    after_restart = StoredPairCosts(path)
    slow = DraftLengthController("auto", 3, cost_ratio=0.3, pair=PAIR, costs=after_restart)
    for _ in range(3):
        slow.observe_plain(0.1)
    assert slow.could_pay()
    slow.observe_cycle(drafted=1, proposed=1, accepted=1, draft_s=0.075, verify_s=0.3)  # the loaded machine
    after_restart.save()

    later = DraftLengthController("auto", 3, cost_ratio=0.3, pair=PAIR, costs=StoredPairCosts(path))
    for _ in range(3):
        later.observe_plain(0.1)
    assert later.draft_ratio() == pytest.approx(0.4, abs=0.03)
    assert later.verify_time(1) == pytest.approx(0.15, rel=0.1)
    assert later.could_pay()  # with 0.75 and a verify of 3 steps written over them it could not
    # the counts are kept, up to a cap (a machine that changes is followed)
    entry = later.known
    assert entry["draft_samples"] == entry["verify_samples"][1] == entry["verify_samples"][4] == MAX_STORED_SAMPLES


def test_a_file_from_before_the_counts_weighs_each_cost_as_one_cycle(tmp_path):
    entry = {"target": PAIR[0], "draft": PAIR[1], "verify": PAIR[2], "draft_steps": 0.4, "verify_steps": {"1": 1.5}}
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps({"version": VERSION, "pairs": [entry]}))
    c = DraftLengthController("auto", 3, cost_ratio=0.3, pair=PAIR, costs=StoredPairCosts(path))
    for _ in range(3):
        c.observe_plain(0.1)
    assert c.draft_ratio() == pytest.approx(0.4)
    c.observe_cycle(drafted=1, proposed=1, accepted=1, draft_s=0.06, verify_s=0.15)
    assert c.draft_ratio() == pytest.approx((0.4 + 0.6) / 2)  # one cycle each
    assert c.known["draft_samples"] == 2


def test_a_version_1_file_is_measured_again(tmp_path):
    """Version 1 timed a draft step with the catch-up its proposal read first folded in (a
    0.5B draft read as ~5x its 1.5B target), and a pair stored as unable to pay is never
    measured again: its costs are dropped, not trusted."""
    entry = {"target": "a", "draft": "b", "verify": "native", "draft_steps": 4.9, "verify_steps": {"2": 1.3}}
    path = tmp_path / FILE_NAME
    path.write_text(json.dumps({"version": 1, "pairs": [entry]}))
    assert VERSION > 1 and StoredPairCosts(path).pairs() == {}


def test_a_home_that_cannot_be_written_keeps_the_costs_for_this_run(tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    costs = StoredPairCosts(blocked / FILE_NAME)  # its folder is a file: every write fails
    costs.for_pair(PAIR)["draft_steps"] = 0.4
    costs.save()  # logged, not raised
    assert costs.for_pair(PAIR)["draft_steps"] == 0.4


def test_every_turn_hands_its_measurements_to_the_store(tmp_path):
    """Session saves its PairCosts after each turn, also one that failed."""
    from brisk.engine.api.events import EngineErrored, TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model_by_key

    saves = []

    class Counting(PairCosts):
        def save(self):
            saves.append(len(self.pairs()))

    lm = load_folder(make_tiny_model_by_key(tmp_path / "m", "llama", seed=1))
    session = Session(lm, ChatSettings(model=lm.id, temperature=0.0, max_tokens=4), pair_costs=Counting())
    assert any(isinstance(e, TurnFinished) for e in session.send("Hello"))
    assert saves == [1]  # the lookup arm's verify costs for this model, once per turn
    session.settings = ChatSettings(model=lm.id, temperature=-1.0)  # a turn that fails its settings check
    events = list(session.send("Again"))
    assert any(isinstance(e, EngineErrored) for e in events), events
    assert len(saves) == 2
