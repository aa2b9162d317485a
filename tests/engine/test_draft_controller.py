"""The draft controller and the autopilot's costs, without a model: when drafting pays, probes
and their backoff, the verify-time fit, slow start, scouts, and the saving a draft's catch-up
is weighed against (the decoder's side of it is in test_speculative.py)."""

import math

import pytest

from brisk.engine.accel.speculative.autopilot import SpeculationAutopilot
from brisk.engine.accel.speculative.controller import DraftLengthController, PairCosts
from brisk.engine.accel.speculative.lookup import LookupOffer

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent


def feed(controller, *, plain_s, draft_s, verify_s, alpha, cycles=40):
    for _ in range(cycles):
        k = controller.choose()
        if k == 0:
            controller.observe_plain(plain_s)
        else:
            accepted = min(k, round(alpha * k))
            controller.observe_cycle(
                drafted=k, proposed=k, accepted=accepted, draft_s=draft_s * k, verify_s=verify_s(k)
            )
    return controller


def test_controller_drafts_when_it_pays_and_stops_when_it_loses():
    cheap = feed(
        DraftLengthController("auto", 3), plain_s=0.1, draft_s=0.01, verify_s=lambda k: 0.1 + 0.005 * k, alpha=0.9
    )
    assert cheap.choose() >= 3
    costly = feed(
        DraftLengthController("auto", 3), plain_s=0.1, draft_s=0.08, verify_s=lambda k: 0.1 + 0.05 * k, alpha=0.3
    )
    assert costly.choose() == 0


def test_controller_probes_again_with_backoff():
    c = DraftLengthController("auto", 3)
    picks = []
    for _ in range(400):
        k = c.choose()
        picks.append(k)
        if k:
            c.observe_cycle(drafted=k, proposed=k, accepted=0, draft_s=0.08, verify_s=0.2)
        else:
            c.observe_plain(0.1)
    probes = [i for i, k in enumerate(picks) if k]
    assert len(probes) >= 3
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]


def test_expected_tokens_formula():
    from brisk.engine.accel.speculative.controller import expected_tokens

    assert expected_tokens(0.0, 4) == 1
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def losing_pilot(**kw) -> SpeculationAutopilot:
    """An autopilot that has measured its draft keeping nothing: drafting cannot pay."""
    pilot = SpeculationAutopilot("auto", 3, has_draft=True, lookup=False, cost_ratio=0.3, **kw)
    pilot.observe_plain(0.1, 3)
    for _ in range(6):
        pilot.observe_cycle(drafted=1, proposed=1, accepted=0, draft_s=0.03, verify_s=0.14)
    return pilot


def test_the_saving_a_catch_up_is_weighed_against_follows_acceptance():
    losing = losing_pilot()
    assert losing.saving_per_token() == 0.0
    winning = losing_pilot()
    for _ in range(20):
        winning.observe_cycle(drafted=3, proposed=3, accepted=3, draft_s=0.09, verify_s=0.14)
    assert 0.0 < winning.saving_per_token() < 0.1  # seconds a token, of a 0.1 s plain step
    assert winning.saving_per_token(0.2) == winning.saving_per_token()  # slower than plain: plain is the bar
    assert winning.saving_per_token(0.03) == 0.0  # lookups at a third of a step: drafting cannot beat them
    assert SpeculationAutopilot("auto", 3, has_draft=True, lookup=False).saving_per_token() == math.inf


def test_controller_fits_verify_time_through_measured_lengths():
    c = DraftLengthController("auto", 3)
    for _ in range(3):
        c.observe_plain(0.3)
    c.observe_cycle(drafted=1, proposed=1, accepted=1, draft_s=0.2, verify_s=0.45)
    assert c.verify_time(4) == pytest.approx(0.45 + 3 * 0.05 * 0.3)  # one length: a small per-position cost
    c.observe_cycle(drafted=3, proposed=3, accepted=3, draft_s=0.6, verify_s=0.55)
    assert c.verify_time(2) == pytest.approx(0.5)  # two lengths: the line through them
    c.observe_cycle(drafted=3, proposed=3, accepted=3, draft_s=6.0, verify_s=5.5)  # a stall: 10x both
    assert c.verify_time(3) == pytest.approx(0.7 * 0.55 + 0.3 * 1.5 * 0.55)  # counted as 1.5x expected
    assert c.t_draft.value < 0.3


def test_a_verify_measured_faster_than_the_plain_step_bounds_the_extrapolation():
    """A plain step timed across a trace (27 ms for SmolLM2's 10 ms step) and never retimed
    while lookups win floored every unmeasured verify length at it: a 12 ms one-token verify
    then made k = 1 look best for a whole quote (one lookup token a pass, half the speed)."""
    c = SpeculationAutopilot("auto", 4, has_draft=False, lookup=True, position_cost=0.3)
    for _ in range(3):
        c.observe_plain(0.027)
    c.observe_verify(1, 0.012)
    assert c.verify_time(4) == pytest.approx(0.012 + 3 * 0.3 * 0.012)
    offer = LookupOffer(list(range(12)), 16)
    for _ in range(20):  # a quote: every proposed token kept
        c.observe_lookup_scout(offer, offer.tokens[0])
    assert c.pick(offer, draft_usable=False)[1] > 1


def test_after_a_rejection_the_next_draft_is_at_most_twice_as_long():
    """Slow start: α, a slow average, still says 0.9 when the text turns free; the next
    cycle drafts at most 2n + 1 after one that kept n."""
    c = feed(
        DraftLengthController("auto", 3),
        plain_s=0.3,
        draft_s=0.02,
        verify_s=lambda k: 0.3 + 0.01 * k,
        alpha=1.0,
        cycles=60,
    )
    assert c.choose() == 8
    c.observe_cycle(drafted=8, proposed=8, accepted=1, draft_s=0.16, verify_s=0.38)
    assert c.alpha > 0.8 and c.choose() == 3
    c.observe_cycle(drafted=3, proposed=3, accepted=3, draft_s=0.06, verify_s=0.33)
    assert c.choose() == 7


def test_fully_accepted_probes_lengthen_until_long_drafts_pay():
    """Draft at 2/3 of a target step, verify 1.5x: one token never pays, four always-accepted do."""
    c = feed(
        DraftLengthController("auto", 3),
        plain_s=0.3,
        draft_s=0.2,
        verify_s=lambda k: 0.45 + 0.01 * k,
        alpha=1.0,
        cycles=120,
    )
    assert c.choose() >= 4


def test_a_scout_that_finds_low_acceptance_skips_the_probe():
    """Draft and verify costs known from an earlier conversation: a scout measuring low
    acceptance backs off without a probe; one measuring high acceptance drafts."""
    pair, costs = ("target", "draft"), PairCosts()
    first = feed(
        DraftLengthController("auto", 3, cost_ratio=0.2, pair=pair, costs=costs),
        plain_s=0.3,
        draft_s=0.1,
        verify_s=lambda k: 0.45 + 0.01 * k,
        alpha=1.0,
        cycles=120,
    )
    assert first.choose() > 0  # it drafted, measuring the costs
    for rate, drafts in ((0.2, False), (1.0, True)):
        c = DraftLengthController("auto", 3, cost_ratio=0.2, pair=pair, costs=costs)
        for _ in range(3):
            c.observe_plain(0.3)
        assert c.draft_ratio() == pytest.approx(0.1 / 0.3)  # measured earlier, not the weight-bytes guess
        picks = []
        for _ in range(12):
            if c.scout_due():
                c.observe_scout(rate * 8, 8)
            k = c.choose()
            picks.append(k)
            if k:
                break
            c.observe_plain(0.3)
        assert any(picks) == drafts
        if not drafts:
            assert c.probe_gap > 8 and not c.scout_due()  # backed off: the next scout comes later


def test_once_measured_costs_say_no_draft_can_pay_auto_stops_scouting_and_probing():
    """Qwen-1.5B with a 0.5B draft on this CPU: a compiled plain step 90 ms, a draft step 61 ms,
    a verify of k tokens ~120 + 50k ms. Even with every draft kept no k beats plain decoding,
    so after the first probes measured that, a scout (the draft reading 16 tokens: ~0.7 s)
    or a probe can only lose time."""
    c = DraftLengthController("auto", 3, cost_ratio=0.3)  # the weight-bytes guess says it could pay
    scouts_after, cycles_after, measured_at = 0, 0, None
    for step in range(400):
        if c.scout_due():
            c.observe_scout(8.0, 8)  # the draft would have proposed everything
            scouts_after += measured_at is not None
        k = c.choose()
        if k:
            c.observe_cycle(drafted=k, proposed=k, accepted=k, draft_s=0.061 * k, verify_s=0.12 + 0.05 * k)
            cycles_after += measured_at is not None
        else:
            c.observe_plain(0.09)
        if measured_at is None and c.t_draft.value is not None and not c.could_pay():
            measured_at = step
    assert measured_at is not None and measured_at < 100
    assert scouts_after == 0 and cycles_after == 0
    assert c.note().startswith("drafting stopped: measured, a draft step costs ~0.68x")  # said in the turn's status
