"""UniPrefill: exactness at p = 1, the scoring and selection rules, survivors' positions and
keys, per-layer caches in decode, composition (prompt cache, speculative decoding, int4 KV,
saved caches, cancel) and clear declines."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from brisk.engine.accel.router import route_prefill
from brisk.engine.accel.uniprefill.flops import flops_saved
from brisk.engine.accel.uniprefill.prefill import (
    UniPrefill,
    UniPrefillUnsupported,
    default_drop_layers,
    record_layer_calls,
    runs_of,
)
from brisk.engine.accel.uniprefill.selection import BLOCK, QUERY_WINDOW, SINKS, key_mass, select_blocks
from brisk.engine.api.conversation import CancelToken
from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.events import EngineWarned, PrefillProgressed, TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.kv import PromptCache
from brisk.engine.models.loader import load_folder
from brisk.engine.turn.dense_prefill import prefill_chunks
from tests.tiny_models import make_tiny_model_by_key

ARCHS = ["llama", "qwen2", "qwen3", "gemma3_text", "gpt_oss", "nemotron_h", "llama-q4", "qwen3-q8"]
SUPPORTED = ["llama", "qwen2", "qwen3", "nemotron_h", "llama-q4", "qwen3-q8"]
DOC = (
    "Report on regional water use. The northern districts used more water while the southern "
    "reservoirs stayed full. Engineers proposed new pipes, auditors asked for figures. "
) * 14


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("uni")
    built = {
        arch: load_folder(make_tiny_model_by_key(root / arch, arch, seed=2, context_length=4096)) for arch in ARCHS
    }
    # head_dim 64, so the int4 KV cache's groups of 32 fit
    built["wide"] = load_folder(
        make_tiny_model_by_key(root / "wide", "qwen2", seed=2, context_length=4096, hidden_size=256)
    )
    # sliding-window and full layers alternating: full layers have sliding ones after them
    built["gemma-alternating"] = load_folder(
        make_tiny_model_by_key(root / "ga", "gemma3_text", seed=2, context_length=4096, sliding_window_pattern=2)
    )
    return built


def greedy(**kw):
    return ChatSettings(**{"model": "m", "temperature": 0.0, "max_tokens": 8, "prefill_step_size": 128, **kw})


def turn(session, text, cancel=None):
    events = list(session.send(text, cancel=cancel))
    done = [e for e in events if isinstance(e, TurnFinished)]
    return events, (done[0] if done else None)


def random_tokens(n, seed=0, vocab=300):
    return [int(t) for t in np.random.RandomState(seed).randint(3, vocab, n)]


# --- scoring and selection ---------------------------------------------------------------


def test_key_mass_is_the_causal_softmax_summed_over_rows_and_heads():
    rng = np.random.RandomState(0)
    q = rng.randn(1, 4, 5, 8).astype(np.float32)
    k = rng.randn(1, 2, 12, 8).astype(np.float32)
    got = np.array(key_mass(mx.array(q), mx.array(k), 0.3))
    want = np.zeros(12)
    for h in range(4):
        for i in range(5):
            row = q[0, h, i] @ k[0, h // 2].T * 0.3
            row[12 - 5 + i + 1 :] = -np.inf  # row i sees keys up to S - Lq + i
            p = np.exp(row - row.max())
            want += p / p.sum()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got.sum() == pytest.approx(4 * 5, rel=1e-5)


def test_blocks_are_kept_while_the_mass_before_them_is_at_most_p():
    n = 12 * BLOCK
    positions = np.arange(1000, 1000 + n)  # past the sinks: only the window is forced
    block_mass = np.array([0.30, 0.25, 0.2, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01, 0.0, 0.0, 0.0])
    mass = np.repeat(block_mass / BLOCK, BLOCK)
    kept = select_blocks(mass, positions, 0.7)
    blocks = sorted(set(kept // BLOCK))
    # before-mass: 0, .30, .55, .75 -> blocks 0, 1, 2 (the one crossing .7) kept, 3 not;
    # the last two blocks hold the 128-token query window
    assert blocks == [0, 1, 2, 10, 11]
    assert select_blocks(mass, positions, 0.0).tolist() == list(range(BLOCK)) + list(range(n - QUERY_WINDOW, n))
    assert len(select_blocks(mass, positions, 1.0)) == n


def test_sinks_and_the_query_window_always_stay_and_short_prompts_drop_nothing():
    n = 10 * BLOCK
    mass = np.zeros(n)
    mass[5 * BLOCK : 6 * BLOCK] = 1.0  # all the mass in one middle block
    kept = set(select_blocks(mass, np.arange(n), 0.5).tolist())
    assert set(range(SINKS)) <= kept and set(range(n - QUERY_WINDOW, n)) <= kept
    assert set(range(5 * BLOCK, 6 * BLOCK)) <= kept
    assert not kept & set(range(SINKS, 5 * BLOCK))
    assert len(select_blocks(np.ones(256), np.arange(256), 0.1)) == 256


def test_default_drop_layers_follow_the_released_llama_setting():
    assert default_drop_layers([True] * 32) == [7, 11, 15, 19, 23, 27]
    assert default_drop_layers([True] * 28) == [6, 10, 14, 18, 22]
    assert default_drop_layers([False, True, False, False, True]) == [1]  # full-attention layers only
    assert default_drop_layers([False, True]) == []  # the last layer: nothing after it to shrink


def test_runs_and_flops():
    assert runs_of(np.array([0, 1, 2, 7, 8, 11])) == [(0, 3), (7, 9), (11, 12)]
    config = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
    assert flops_saved(config, [100, 100], 0) == 0.0
    assert 0.45 < flops_saved(config, [100, 0], 0) == 0.5


# --- exactness and positions -------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_p_one_equals_dense_prefill_token_for_token_also_after_a_cached_prefix(models, arch):
    lm = models[arch]
    dense = Session(lm, greedy())
    uni = Session(lm, greedy(uniprefill="on", uniprefill_p=1.0))
    for text in (DOC, "Which districts used more water? " + DOC[:900]):
        _, d = turn(dense, text)
        events, u = turn(uni, text)
        assert u.token_ids == d.token_ids
        if arch in SUPPORTED:
            assert u.metrics.prefill_method == "uniprefill", u.metrics.prefill_route
            assert u.metrics.drops and all(n == k for _, n, k in u.metrics.drops)
        else:  # these tiny hybrids have no full-attention layer before their last: declined, lose nothing
            assert u.metrics.prefill_method == "dense"
            assert "no drop layers" in u.metrics.prefill_route
            assert any(isinstance(e, EngineWarned) and e.kind == "uniprefill" for e in events)


@pytest.mark.parametrize("p", [1.0, 0.3])
def test_sliding_window_layers_after_a_drop_see_the_last_window_of_survivors(models, p):
    """Gemma 3 with full layers between sliding ones: p = 1 is exact; with drops the last
    `window` tokens stay (so decode's window is the true one) and a second turn and a
    multi-token verify line up with the compacted sliding layers."""
    lm = models["gemma-alternating"]
    uni = Session(lm, greedy(uniprefill="on", uniprefill_p=p))
    dense = Session(lm, greedy())
    for text in (DOC, "And the south? " + DOC[:500]):
        _, u = turn(uni, text)
        _, d = turn(dense, text)
        assert u.metrics.prefill_method == "uniprefill", u.metrics.prefill_route
        if p == 1.0:
            assert u.token_ids == d.token_ids
    first = [layer for layer, n, k in u.metrics.drops if k < n]
    if p < 1.0:
        assert first, u.metrics.drops
        window = lm.model.args.sliding_window
        kept_runs = u.metrics.coverage["layers"][-1][1]
        assert kept_runs[-1][1] - kept_runs[-1][0] >= window  # the tail window is whole


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3-q8"])
def test_survivors_keep_their_keys_and_positions_and_decode_resumes_at_the_true_length(models, arch):
    """With a drop after layer 0, layer 1's keys of the survivors are a per-token function
    of layer 0's output at their original positions: the dense run's keys there, up to the
    rounding of kernels that differ with the chunk's rows."""
    lm = models[arch]
    tokens = random_tokens(900, seed=3)
    dense = PromptCache(lm.model)
    dense.reuse(tokens)
    list(prefill_chunks(lm.model, dense.layers, tokens[:-1], 128))
    cache = PromptCache(lm.model)
    cache.reuse(tokens)
    runner = UniPrefill(lm.model, cache.layers, drop_layers=[0], p=0.5, step=128)
    list(runner.run(tokens[:-1], base=0))
    kept = np.concatenate([np.arange(s, e) for s, e in runner.reports[0].kept_runs])
    assert 256 <= len(kept) < len(tokens) - 1
    layer = cache.layers[1]
    got = layer.keys[..., : layer.offset, :]
    want = dense.layers[1].keys[..., mx.array(kept), :]
    # Equal up to rounding (a wrong position differs by O(1)). The two runs chunk tokens
    # differently: prefill attention takes sgemm tiles for 64+ rows, and passes of 32 rows or
    # fewer round x to integers for quantized weights, so the float16 keys may differ by an ulp.
    assert mx.allclose(got, want, rtol=2e-3, atol=2e-4).item()
    cache.mark_sparse(tokens[:-1])
    for i, c in enumerate(cache.layers):  # every layer places the next token at the true length
        assert c.offset + cache.shift + (cache.layer_shifts or [0] * 2)[i] == len(tokens) - 1


def test_drops_shrink_later_layers_and_the_answer_uses_true_positions(models):
    lm = models["qwen3"]
    s = Session(lm, greedy(uniprefill="on", uniprefill_p=0.3, drop_layers=[0]))
    events, done = turn(s, DOC)
    m = done.metrics
    assert m.prefill_method == "uniprefill" and m.drops[0][0] == 0
    layer, before, kept = m.drops[0]
    assert before == m.prompt_tokens - 1 and kept < before
    generated = s.cache.layers[0].offset - before
    assert [c.offset for c in s.cache.layers] == [before + generated, kept + generated]
    assert 0 < m.flops_saved < 0.5 and m.uniprefill_s > 0
    cover = m.coverage
    assert cover["layers"][0][0] == 0 and sum(e - s for s, e in cover["layers"][0][1]) == kept
    assert cover["new_tokens"] == before and cover["read_share"] == pytest.approx(kept / before)
    assert cover["skipped"] and all(text for _, _, text in cover["skipped"])
    kept_runs = cover["layers"][0][1]
    for start, end, _ in cover["skipped"]:  # skipped passages lie between kept runs
        assert all(end <= s or start >= e for s, e in kept_runs)
    progress = [e.done for e in events if isinstance(e, PrefillProgressed)]
    assert progress == sorted(progress)
    # the next turn reuses the sparse layers and prefills only what is new
    _, second = turn(s, "And the south?")
    assert second.metrics.cached_tokens >= m.prompt_tokens
    assert second.metrics.prefilled_tokens < 60  # the new message, not the document again
    assert s.cache.layers[0].offset - s.cache.layers[1].offset == before - kept


# --- composition -------------------------------------------------------------------------


@pytest.mark.parametrize("arch, draft", [("llama", "llama-q4"), ("gemma-alternating", "gemma-alternating")])
def test_speculative_decoding_on_top_is_still_exact(models, arch, draft):
    lm = models[arch]
    settings = dict(uniprefill="on", uniprefill_p=0.4, max_tokens=12)
    _, plain = turn(Session(lm, greedy(**settings)), DOC)
    _, spec = turn(Session(lm, greedy(**settings, spec_decode="on", num_draft=3), draft=models[draft]), DOC)
    assert spec.metrics.prefill_method == "uniprefill" and spec.metrics.draft_tokens > 0
    assert spec.token_ids == plain.token_ids


def test_int4_kv_cache_composes_and_a_second_turn_scores_packed_keys(models):
    lm = models["wide"]
    s = Session(lm, greedy(uniprefill="on", uniprefill_p=0.5, kv_bits=4))
    _, first = turn(s, DOC)
    _, second = turn(s, DOC[:1200])
    for m in (first.metrics, second.metrics):
        assert m.prefill_method == "uniprefill" and m.drops[0][2] < m.drops[0][1], m.prefill_route
    assert second.metrics.cached_tokens > 0
    assert all(getattr(c, "bits", None) == 4 for c in s.cache.layers)


def test_a_saved_cache_continues_exactly_like_the_live_one(models, tmp_path):
    lm = models["qwen3"]
    settings = greedy(uniprefill="on", uniprefill_p=0.4)
    live = Session(lm, settings)
    turn(live, DOC)
    live.save_cache(tmp_path / "c.safetensors")
    reopened = Session(lm, settings, messages=list(live.messages))
    reopened.load_cache(tmp_path / "c.safetensors")
    assert reopened.cache.layer_shifts == live.cache.layer_shifts and live.cache.layer_shifts
    _, a = turn(live, "Summarize.")
    _, b = turn(reopened, "Summarize.")
    assert b.metrics.cached_tokens == a.metrics.cached_tokens > 0
    assert a.token_ids == b.token_ids


def test_cancel_between_layers_loses_nothing_and_the_next_turn_works(models):
    lm = models["llama"]
    s = Session(lm, greedy(uniprefill="on", uniprefill_p=0.5))
    cancel = CancelToken()
    events = []
    for event in s.send(DOC, cancel=cancel):
        events.append(event)
        if isinstance(event, PrefillProgressed) and event.done > 0:
            cancel.cancel()
    finished = [e for e in events if isinstance(e, TurnFinished)]
    assert finished and finished[0].metrics.finish_reason == "cancelled"
    assert s.cached_tokens == 0  # the half-built layers were dropped, not kept inconsistent
    assert all(getattr(c, "offset", 0) == 0 for c in s.cache.layers or [])
    _, again = turn(s, "Try again: " + DOC[:600])
    assert again.metrics.finish_reason in ("stop", "length")
    assert again.metrics.cached_tokens == 0 and again.metrics.prefill_method == "uniprefill"
    _, before, kept = again.metrics.drops[0]
    assert s.cache.layers[0].offset - s.cache.layers[1].offset == before - kept


# --- routing, settings, declines ---------------------------------------------------------


def allow_uniprefill(monkeypatch, lm) -> None:
    """The doc-qa table shows UniPrefill keeping every question kind for `lm` at 4K (auto
    reads densely without such a row: engine/accel/quality_table.py)."""
    from brisk.engine.accel import quality_table as qt

    key = qt.model_key(lm.config, lm.info.parameters)
    row = qt.Evidence("uniprefill", kinds=frozenset(qt.OTHER + ("aggregation", "quote", "code")))
    monkeypatch.setitem(qt.TABLE, key, {"4K": (row,)})


def test_router_reasons(models, monkeypatch):
    lm = models["llama"]
    tokens = random_tokens(1000)
    route = lambda **kw: route_prefill(None, lm, None, tokens, 0, greedy(**kw))  # noqa: E731
    assert route().method == "dense" and "off" in route().reason
    assert route(uniprefill="on").method == "uniprefill"
    auto = route(uniprefill="auto", uniprefill_threshold=4096)
    assert auto.method == "dense" and "break-even" in auto.reason
    assert route(uniprefill="auto", uniprefill_threshold=512).method == "dense"  # no doc-qa evidence
    allow_uniprefill(monkeypatch, lm)
    assert route(uniprefill="auto", uniprefill_threshold=512).method == "uniprefill"
    assert route_prefill(None, lm, None, tokens[:200], 0, greedy(uniprefill="on")).method == "dense"


def test_auto_acts_from_the_break_even_measured_for_the_models_architecture(models, monkeypatch):
    from brisk.engine.accel.uniprefill import plan

    lm = models["qwen3"]  # no row of its own: the general defaults
    tokens = random_tokens(1000)
    route = lambda **kw: route_prefill(None, lm, None, tokens, 0, greedy(uniprefill="auto", **kw))  # noqa: E731
    assert route().method == "dense" and f"break-even {plan.DEFAULT_BREAK_EVEN}" in route().reason
    assert plan.default_p(lm.config) == plan.DEFAULT_P
    monkeypatch.setitem(plan.BY_ARCHITECTURE, "qwen3", plan.ModelDefaults(p=0.97, break_even=512))
    allow_uniprefill(monkeypatch, lm)
    assert route().method == "uniprefill"  # 1,000 new tokens: past the architecture's own break-even
    assert route(uniprefill_threshold=2048).method == "dense"  # the chat's own threshold wins
    assert plan.default_p(lm.config) == 0.97
    assert plan.make_uniprefill(lm, [], greedy()).p == 0.97
    assert plan.make_uniprefill(lm, [], greedy(uniprefill_p=0.9)).p == 0.9


def test_chats_saved_with_the_old_fixed_threshold_take_the_models_break_even():
    assert ChatSettings.from_dict({"uniprefill_threshold": 4096}).uniprefill_threshold is None
    assert ChatSettings.from_dict({"uniprefill_threshold": 2000}).uniprefill_threshold == 2000
    assert ChatSettings.from_dict({}).uniprefill_threshold is None
    with pytest.raises(InvalidSettings, match="uniprefill_threshold"):
        ChatSettings.from_dict({"uniprefill_threshold": -1})
    with pytest.raises(InvalidSettings, match="uniprefill_threshold"):
        ChatSettings.from_dict({"uniprefill_threshold": "4096"})


def test_settings_are_checked():
    with pytest.raises(InvalidSettings, match="uniprefill_p"):
        ChatSettings(uniprefill_p=1.5).validate()
    with pytest.raises(InvalidSettings, match="drop_layers"):
        ChatSettings(drop_layers=[3, "x"]).validate()
    with pytest.raises(InvalidSettings, match="drop_layers"):
        ChatSettings.from_dict({"drop_layers": [True]})
    assert ChatSettings.from_dict({"drop_layers": [7, 11], "uniprefill": "auto"}).drop_layers == [7, 11]


def test_cli_prefill_spellings():
    from brisk.engine.host.cli import prefill_modes

    assert prefill_modes("uniprefill", None) == ("off", "on")
    assert prefill_modes("specprefill", None) == ("on", "off")
    assert prefill_modes("auto", None) == ("auto", "auto")
    assert prefill_modes(None, "on") == ("on", "off")  # --sparse-prefill keeps its meaning


def test_a_drop_layer_outside_the_model_declines_with_a_warning(models):
    lm = models["llama"]
    events, done = turn(Session(lm, greedy(uniprefill="on", drop_layers=[5])), DOC)
    assert done.metrics.prefill_method == "dense" and "outside" in done.metrics.prefill_route
    assert any(isinstance(e, EngineWarned) for e in events)
    _, dense = turn(Session(lm, greedy()), DOC)
    assert done.token_ids == dense.token_ids


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def __call__(self, x, mask=None, cache=None):
        return self.proj(x)


class _Rescaling(nn.Module):
    """A model that scales the hidden state between layers (as some do per layer)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.layers = [_Block(), _Block()]

    def __call__(self, tokens, cache=None):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h) * 0.5
        return h


def test_a_model_that_changes_the_hidden_state_between_layers_is_declined():
    with pytest.raises(UniPrefillUnsupported, match="between layers"):
        record_layer_calls(_Rescaling(), [None, None], mx.array([[1, 2, 3]]))


def test_turning_sparse_prefill_off_rereads_the_sparse_region_densely(models):
    """'Read it all' regenerates with both sparse modes off: the sparse cache must not be
    reused (a regenerate reused all 3,148 sparse tokens in 0.7 s before)."""
    lm = models["qwen3"]
    s = Session(lm, greedy(uniprefill="on", uniprefill_p=0.3))
    _, sparse = turn(s, DOC)
    assert sparse.metrics.prefill_method == "uniprefill"
    s.settings = greedy()
    redo = [e for e in s.regenerate() if isinstance(e, TurnFinished)][0]
    assert redo.metrics.cached_tokens == 0 and redo.metrics.prefill_method == "dense"
    _, dense = turn(Session(lm, greedy()), DOC)
    assert redo.token_ids == dense.token_ids
    _, follow = turn(s, "More?")  # a dense cache is reused as usual
    assert follow.metrics.cached_tokens > 0
