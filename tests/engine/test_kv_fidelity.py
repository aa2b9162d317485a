"""The packed-KV fidelity self-test: measured once per model and precision, stored with the
model, and obeyed by chats (auto picks the smallest precision that passed; a fixed one
that failed is warned about)."""

import json

import pytest

from brisk.engine.api.events import EngineWarned, PrefillProgressed, TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.kv import fidelity
from brisk.engine.kv.packed_cache import PackedKVCache
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model


@pytest.fixture()
def lm(tmp_path):
    # head_dim 64 so value groups of 32 fit; a fresh folder per test (results are stored in it)
    return load_folder(make_tiny_model(tmp_path / "m", "llama", context_length=4096, hidden_size=256))


def stored(lm, results):
    fidelity.FidelityStore(lm.path).save(results)


def result(passed, top1=1.0, kl=0.0):
    return {
        "top1_agreement": top1,
        "mean_kl": kl,
        "generated": 64,
        "passed": passed,
        "why": "kept 64 of 64 next-token choices" if passed else "changed 9 of 64 next-token choices",
    }


def turn(lm, **kw):
    settings = ChatSettings(model="m", temperature=0.0, max_tokens=6, **kw)
    session = Session(lm, settings)
    events = list(session.send("The quick brown fox jumps over the lazy dog. " * 8))
    return session, events, [e for e in events if isinstance(e, TurnFinished)][0]


def test_the_selftest_measures_stores_and_is_not_run_twice(lm, monkeypatch):
    store = fidelity.FidelityStore(lm.path)
    results = fidelity.run_selftest(lm, store, [(8, 8), (4, 4)], group_size=32)
    for key in ("K8/V8 g32", "K4/V4 g32"):
        r = results[key]
        assert r["generated"] == fidelity.POSITIONS and 0 <= r["top1_agreement"] <= 1 and r["mean_kl"] >= 0
        assert r["passed"] == (r["top1_agreement"] >= 0.99 and r["mean_kl"] <= 0.05)
    assert json.loads((lm.path / "kv_fidelity.json").read_text())["results"] == results
    monkeypatch.setattr(fidelity, "compare", lambda *a, **k: pytest.fail("measured again"))
    assert fidelity.run_selftest(lm, store, [(4, 4)], group_size=32) == results


def test_auto_uses_the_smallest_precision_that_passed_without_measuring(lm, monkeypatch):
    stored(lm, {"K4/V4 g32": result(False, top1=0.86), "K8/V4 g32": result(True)})
    monkeypatch.setattr(fidelity, "compare", lambda *a, **k: pytest.fail("measured again"))
    session, events, done = turn(lm, kv_auto=True)
    assert (done.metrics.k_bits, done.metrics.v_bits) == (8, 4)
    assert done.metrics.kv_check.startswith("K8/V4 passed")
    assert {(c.k_bits, c.v_bits) for c in session.cache.layers} == {(8, 4)}
    assert not [e for e in events if isinstance(e, EngineWarned)]


def test_auto_keeps_16_bit_kv_when_nothing_passed(lm):
    stored(lm, {f"K{k}/V{v} g32": result(False, top1=0.5) for k, v in fidelity.CANDIDATES})
    session, _, done = turn(lm, kv_auto=True)
    assert (done.metrics.k_bits, done.metrics.v_bits) == (16, 16)
    assert not any(isinstance(c, PackedKVCache) for c in session.cache.layers)
    assert "16-bit" in done.metrics.kv_check


def test_a_chosen_precision_that_failed_is_used_but_warned_about(lm):
    stored(lm, {"K4/V4 g32": result(False, top1=0.86)})
    session, events, done = turn(lm, kv_bits=4)
    warnings = [e.message for e in events if isinstance(e, EngineWarned)]
    assert any("changed 9 of 64" in w and "auto" in w for w in warnings)
    assert (done.metrics.k_bits, done.metrics.v_bits) == (4, 4)


def test_first_use_runs_the_check_and_says_so(lm):
    _, events, done = turn(lm, kv_bits=8)
    notices = [e for e in events if isinstance(e, EngineWarned) and e.kind == "notice"]
    assert notices and "once per model" in notices[0].message
    phases = [e.phase for e in events if isinstance(e, PrefillProgressed)]
    assert phases[0] == "kv_check" and phases[-1] == "prompt"  # the window says what the wait is
    assert "K8/V8 g32" in fidelity.FidelityStore(lm.path).load()
    _, again, _ = turn(lm, kv_bits=8)
    assert not [e for e in again if isinstance(e, EngineWarned) and e.kind == "notice"]
    assert "kv_check" not in [e.phase for e in again if isinstance(e, PrefillProgressed)]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"method": "old-packing", "results": {"K4/V4 g32": result(True)}}),
        json.dumps({"method": fidelity.METHOD, "results": {"K4/V4 g32": {"top1": "x"}}}),
    ],
)
def test_a_damaged_or_stale_results_file_is_measured_again(lm, content):
    (lm.path / "kv_fidelity.json").write_text(content)
    assert fidelity.FidelityStore(lm.path).load() == {}
    results = fidelity.run_selftest(lm, fidelity.FidelityStore(lm.path), [(8, 8)], group_size=32)
    assert "K8/V8 g32" in results


def test_a_read_only_model_folder_still_answers(lm, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError("read-only")

    monkeypatch.setattr(fidelity.os, "replace", refuse)
    _, _, done = turn(lm, kv_bits=8)
    assert done.metrics.kv_check.startswith("K8/V8")


def test_verdict_explains_both_ways():
    ok, why = fidelity.verdict({"top1_agreement": 1.0, "mean_kl": 0.01, "generated": 64})
    assert ok and "kept 64 of 64" in why
    bad, why = fidelity.verdict({"top1_agreement": 56 / 64, "mean_kl": 0.3, "generated": 64})
    assert not bad and "changed 8 of 64" in why and "KL 0.300" in why


def test_a_model_that_cannot_pack_values_is_never_measured_and_auto_stays_16_bit(tiny_llama, monkeypatch):
    """tiny_llama's head dimension (16) takes no value group of 32: nothing to test, no notice."""
    monkeypatch.setattr(fidelity, "compare", lambda *a, **k: pytest.fail("measured"))
    session = Session(tiny_llama, ChatSettings(model="tiny-llama", temperature=0.0, max_tokens=4, kv_auto=True))
    events = list(session.send("hello there"))
    done = [e for e in events if isinstance(e, TurnFinished)][0]
    assert (done.metrics.k_bits, done.metrics.v_bits) == (16, 16)
    assert not [e for e in events if isinstance(e, EngineWarned)]
