"""SpecPrefill: exactness, original positions, selection rules, fallback, multi-turn."""

import sys

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from brisk.engine.accel.positions import ShiftedRoPE, install_position_shift, position_shift
from brisk.engine.accel.specprefill.scoring import (
    OBSERVATION_WINDOW,
    POOL_KERNEL,
    DraftScorer,
    SparsePrefillDeclined,
    capture_attention,
    score_tokens,
    select_chunks,
    sparse_prefill,
)
from brisk.engine.api.events import EngineWarned, PrefillProgressed, TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.loader import load_folder
from brisk.kernels.pooled_attention import average_pool
from tests.tiny_models import make_tiny_model, make_tiny_model_by_key

# "-q4"/"-q8": the same architecture with quantized weights (MLX's quantized layers)
ARCHS = ["llama", "qwen2", "qwen3", "gemma3_text", "gpt_oss", "nemotron_h", "llama-q4", "qwen3-q8"]
DOC = (
    "Report on regional water use. The northern districts used more water while the southern "
    "reservoirs stayed full. Engineers proposed new pipes. "
) * 6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp")
    return {arch: load_folder(make_tiny_model_by_key(root / arch, arch, seed=1, context_length=2048)) for arch in ARCHS}


def turn(session, text):
    events = list(session.send(text))
    done = [e for e in events if isinstance(e, TurnFinished)]
    assert done, events
    return events, done[0]


def greedy(**kw):
    return ChatSettings(**{"model": "m", "temperature": 0.0, "max_tokens": 8, "prefill_step_size": 64, **kw})


@pytest.mark.parametrize("arch", ARCHS)
def test_keep_all_equals_full_prefill_also_after_a_cached_prefix(models, arch):
    lm = models[arch]
    dense = Session(lm, greedy())
    sparse = Session(lm, greedy(sparse_prefill="on", sparse_keep=1.0), draft=lm)
    for text in (DOC, "Which districts used more water? " + DOC[:200]):
        _, d = turn(dense, text)
        _, s = turn(sparse, text)
        assert s.metrics.sparse_outcome == "used", s.metrics.sparse_prefill
        assert s.token_ids == d.token_ids


def masked_dense_logits(model, tokens, visible):
    """Full forward where only `visible` keys can be attended (plus causality)."""
    keep = mx.array(visible)
    patched = []
    for name in {type(m).__module__ for _, m in model.named_modules()}:
        module = sys.modules[name]
        original = getattr(module, "scaled_dot_product_attention", None)
        if original is None:
            continue

        def masked(q, k, v, *args, _original=original, **kwargs):
            n, length = k.shape[2], q.shape[2]
            causal = mx.arange(n - length, n)[:, None] >= mx.arange(n)[None]
            kwargs["mask"] = causal & keep[None, :n]
            return _original(q, k, v, *args, **kwargs)

        setattr(module, "scaled_dot_product_attention", masked)
        patched.append((module, original))
    try:
        return model(mx.array(tokens)[None])[0, -1]
    finally:
        for module, original in patched:
            setattr(module, "scaled_dot_product_attention", original)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("prefix", [0, 40])
@pytest.mark.parametrize("step", [16, 24])  # 24: passes that hold the end of one run and the start of the next
def test_kept_tokens_sit_at_their_original_positions(models, arch, prefix, step):
    """Sparse prefill == a dense pass in which dropped tokens are invisible: so every kept
    token, and the first decoded one, ran at its original RoPE position."""
    model = models[arch].model
    tokens = [(i * 37) % 380 + 3 for i in range(prefix + 200)]
    runs = [(0, 32), (64, 96), (150, 199)]  # of the 200 new tokens; the last one runs separately
    cache = make_prompt_cache(model)
    if prefix:
        model(mx.array(tokens[:prefix])[None], cache=cache)
    list(sparse_prefill(model, cache, tokens[prefix:], runs, base=prefix, step=step))
    with position_shift(model, len(tokens) - 1 - cache[0].offset):
        sparse_logits = model(mx.array(tokens[-1:])[None], cache=cache)[0, -1]
    visible = [True] * prefix + [any(s <= i < e for s, e in runs) or i == 199 for i in range(200)]
    reference = masked_dense_logits(model, tokens, visible)
    assert mx.allclose(sparse_logits, reference, atol=1e-4, rtol=1e-4).item()
    full = model(mx.array(tokens)[None])[0, -1]
    assert not mx.allclose(sparse_logits, full, atol=1e-3).item()  # dropping tokens did matter


def test_decoding_continues_at_the_original_length(models):
    lm = models["llama"]
    session = Session(lm, greedy(sparse_prefill="on", sparse_keep=0.3, max_tokens=4), draft=lm)
    install_position_shift(lm.model)
    rope = lm.model.model.layers[0].self_attn.rope
    assert isinstance(rope, ShiftedRoPE)
    seen = []
    inner = rope.rope
    rope.rope = lambda x, offset=0, **kw: (seen.append((x.shape[2], offset)), inner(x, offset=offset, **kw))[1]
    try:
        _, done = turn(session, DOC)
    finally:
        rope.rope = inner
    m = done.metrics
    assert m.sparse_outcome == "used" and m.kept_tokens < m.prompt_tokens
    # The draft (the same model here) runs first; then the target reads the kept runs a token
    # a row (an array of positions, traced: not read here), the last prompt token among them;
    # its answer goes on at M, M+1, ... although the cache holds fewer slots.
    runs = [i for i, (_, offset) in enumerate(seen) if not isinstance(offset, int)]
    assert runs, "the target read no kept run"
    after = [offset for _, offset in seen[runs[-1] + 1 :]]
    assert after and all(m.prompt_tokens <= offset < m.prompt_tokens + 4 for offset in after)
    assert session.cache.layers[0].offset < m.prompt_tokens


def test_model_is_unchanged_for_later_full_prefills(models):
    lm = models["qwen2"]
    before = turn(Session(lm, greedy()), DOC)[1].token_ids
    turn(Session(lm, greedy(sparse_prefill="on", sparse_keep=0.2), draft=lm), DOC)
    assert turn(Session(lm, greedy()), DOC)[1].token_ids == before


def test_a_second_turn_reuses_the_sparse_cache_and_an_edit_inside_it_resets(models):
    lm = models["llama"]
    session = Session(lm, greedy(sparse_prefill="on", sparse_keep=0.2), draft=lm)
    _, first = turn(session, DOC)
    _, second = turn(session, "And the south?")
    # the whole sparse first prompt is reused (a random model's answer may re-tokenize differently)
    assert second.metrics.cached_tokens >= first.metrics.prompt_tokens
    events = list(session.edit(0, DOC + " Extra."))
    edited = [e for e in events if isinstance(e, TurnFinished)][0]
    assert edited.metrics.cached_tokens == 0  # the edit lands inside the sparse region


def test_failure_falls_back_to_full_prefill_with_a_warning(models, monkeypatch):
    lm = models["llama"]
    _, reference = turn(Session(lm, greedy()), DOC)

    def broken(*args, **kwargs):
        raise RuntimeError("simulated scoring failure")

    monkeypatch.setattr(DraftScorer, "importance_steps", broken)
    events, done = turn(Session(lm, greedy(sparse_prefill="on"), draft=lm), DOC)
    warnings = [e for e in events if isinstance(e, EngineWarned)]
    assert warnings and "simulated scoring failure" in warnings[0].message
    assert done.metrics.sparse_prefill.startswith("fallback")
    assert done.token_ids == reference.token_ids


def test_a_sparse_turn_reports_each_phase_in_order_with_its_own_count(models):
    """The draft reads the prompt, chooses what to keep, then the model reads the kept part:
    each phase counts its own tokens, so the window can show each with its own progress."""
    lm = models["llama"]
    events, done = turn(Session(lm, greedy(sparse_prefill="on", sparse_keep=0.3), draft=lm), DOC)
    progress = [e for e in events if isinstance(e, PrefillProgressed)]
    phases = [p.phase for p in progress]
    order = [phase for i, phase in enumerate(phases) if i == 0 or phases[i - 1] != phase]
    assert order == ["prompt", "draft", "select", "kept", "prompt"]
    draft = [p for p in progress if p.phase == "draft"]
    # the draft reads all but the observation window, whose queries it keeps (scoring.py)
    window = OBSERVATION_WINDOW
    assert draft[0].done == 0 and draft[-1].done == draft[-1].total == done.metrics.prompt_tokens - window
    assert [p.done for p in draft] == sorted(p.done for p in draft)
    kept = [p for p in progress if p.phase == "kept"]
    assert kept[-1].total == done.metrics.kept_tokens < done.metrics.prompt_tokens


def test_auto_respects_the_threshold(models):
    lm = models["llama"]
    _, done = turn(Session(lm, greedy(sparse_prefill="auto", sparse_threshold=10_000), draft=lm), DOC)
    assert done.metrics.sparse_prefill.startswith("off:") and "threshold" in done.metrics.sparse_prefill


def test_no_draft_means_no_sparse_prefill(models):
    _, done = turn(Session(models["llama"], greedy(sparse_prefill="on")), DOC)
    assert done.metrics.sparse_prefill == "off: no draft model"


def test_selection_keeps_first_last_top_and_window():
    importance = mx.array([0.0] * 320)
    importance[100:110] = 5.0  # chunk 3 is the important one
    sel = select_chunks(importance, keep=0.1)  # 10 chunks -> 1 by score, + first + last
    assert sel.runs == [(0, 32), (96, 128), (288, 320)]
    windowed = select_chunks(importance, keep=0.1, window=64)
    assert windowed.runs[-1] == (256, 320)


def test_chunks_align_to_the_end_and_keep_the_first_32_tokens():
    importance = mx.zeros((100,))  # 100 = 4 + 3 * 32: a 4-token remainder first
    sel = select_chunks(importance, keep=0.01)
    assert sel.runs == [(0, 36), (68, 100)]  # remainder + next chunk (first 32 tokens), last full chunk


def test_auto_keeps_few_chunks_when_importance_is_peaked_and_declines_when_flat():
    peaked = mx.concatenate([mx.full((32,), 10.0), mx.full((2048 - 32,), 0.001)])
    sel = select_chunks(peaked, keep=None)
    assert sel.keep_fraction <= 0.15
    with pytest.raises(SparsePrefillDeclined, match="flat"):
        select_chunks(mx.ones((2048,)), keep=None)


def test_capture_sees_every_attention_layer_including_hybrids(models):
    for arch, n_attention in (("llama", 2), ("nemotron_h", 2), ("gpt_oss", 2)):
        lm = models[arch]
        sink = []
        with capture_attention(lm.model, sink):
            lm.model(mx.array([[5, 6, 7]]))
        assert len(sink) == n_attention, arch
        q, k, scale = sink[0]
        assert q.ndim == 4 and k.ndim == 4 and scale > 0


def test_projection_takes_the_max_over_overlapping_characters():
    from brisk.engine.accel.translate import project

    draft_spans = [(0, 3), (3, 5), (5, 9), (9, 10)]
    target_spans = [(0, 4), (4, 9), (9, 10), (10, 10)]
    assert project([1.0, 2.0, 5.0, 0.5], draft_spans, target_spans) == [2.0, 5.0, 0.5, 0.0]


def test_cross_tokenizer_draft_scores_for_the_target(models, tmp_path):
    """A draft with another vocabulary: importance comes through character offsets; with
    keep 1.0 the answer equals a full prefill, and with keep 0.3 tokens are dropped."""
    target = models["llama"]
    draft = load_folder(make_tiny_model(tmp_path / "d", "qwen2", seed=4, context_length=2048, tokenizer_vocab=300))
    assert draft.info.tokenizer_fingerprint != target.info.tokenizer_fingerprint
    _, dense = turn(Session(target, greedy()), DOC)
    _, same = turn(Session(target, greedy(sparse_prefill="on", sparse_keep=1.0), draft=draft), DOC)
    assert same.metrics.sparse_outcome == "used" and same.token_ids == dense.token_ids
    _, sparse = turn(Session(target, greedy(sparse_prefill="on", sparse_keep=0.3), draft=draft), DOC)
    assert sparse.metrics.sparse_outcome == "used"
    assert sparse.metrics.kept_tokens < 0.5 * sparse.metrics.prompt_tokens


@pytest.mark.parametrize("arch", ["llama", "nemotron_h"])
def test_draft_cache_never_keeps_lookahead_tokens(models, arch):
    """The draft cache ends holding exactly the prompt: trimmed, or for a recurrent one restored
    from its snapshot (tests/engine/test_specprefill_draft_cache.py reads on from it)."""
    draft = models[arch]
    scorer = DraftScorer(draft)
    tokens = draft.tokenizer.encode(DOC)
    scorer.importance(tokens, 0, 64)
    held = tokens if arch == "llama" else tokens[:-1]  # recurrent: the drafter's prompt, its last token pending
    assert scorer.cache.tokens == held
    assert all(c.offset == len(held) for c in scorer.cache.layers if hasattr(c, "offset"))


def test_counting_document_spreads_green_items_and_scores_cities_and_counts():
    from brisk.bench.counting import GREEN_CITIES, counting_document, score_answer
    from brisk.engine.api.errors import InvalidSettings

    text, cities = counting_document(120, 12, seed=7)
    lines = text.split("\n")[1:121]
    green_rows = [i for i, line in enumerate(lines) if " green " in line]
    assert [row // 10 for row in green_rows] == list(range(12))  # one per stretch of 10 entries
    assert [lines[i].split(" to ")[1].rstrip(".") for i in green_rows] == cities
    assert sorted(cities) == sorted(GREEN_CITIES)  # each named once, nowhere else
    assert all(text.count(c) == 1 for c in cities)
    perfect = score_answer(", ".join(cities) + f". There are {len(cities)} of them.", cities)
    assert perfect == {"recall": 1.0, "precision": 1.0, "count_right": True}
    half = score_answer(", ".join(cities[:6]) + ", Oslo. That makes 7.", cities)
    assert half["recall"] == 0.5 and half["precision"] == 6 / 7 and not half["count_right"]
    assert score_answer("none", cities) == {"recall": 0.0, "precision": 0.0, "count_right": False}
    with pytest.raises(InvalidSettings, match="--green"):
        counting_document(40, 13, seed=1)


def test_a_position_shift_belongs_to_one_model(models):
    """The shift is state of the model whose RoPEs are wrapped, not of the process: shifting
    one model leaves another's positions alone."""
    a, b = models["llama"].model, models["qwen2"].model
    install_position_shift(a)
    install_position_shift(b)
    rope_a, rope_b = a.model.layers[0].self_attn.rope, b.model.layers[0].self_attn.rope
    x = mx.random.normal((1, 2, 3, 16))  # (B, H, L, head_dim) of both tiny models
    with position_shift(a, 7):
        shifted, untouched = rope_a(x, offset=1), rope_b(x, offset=1)
    assert mx.allclose(shifted, rope_a(x, offset=8)).item()
    assert mx.allclose(untouched, rope_b(x, offset=1)).item()
    assert not mx.allclose(shifted, rope_a(x, offset=1)).item()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text"])
def test_lookahead_steps_scored_together_equal_each_step_scored_alone(models, arch):
    """score_tokens scores every lookahead step's queries at once, each step masked to the keys
    it saw; the definition is step by step: softmax over the cache as that step left it,
    pooled, max over heads and layers, then the mean over steps."""
    lm = models[arch]
    prompt = list(range(3, 160))
    start, end, steps = 20, len(prompt), 4

    def prefilled():
        cache = make_prompt_cache(lm.model)
        mx.eval(lm.model(mx.array([prompt]), cache=cache))
        return cache

    got = score_tokens(lm.model, prefilled(), 9, start, end, steps=steps)
    cache, token, total = prefilled(), mx.array([[9]]), None
    for _ in range(steps):
        captured = []
        with capture_attention(lm.model, captured):
            logits = lm.model(token, cache=cache)
        per_layer = []
        for q, k, scale in captured:
            if k.shape[2] < end:
                continue  # a sliding window that does not span the prompt
            b, hq, _, d = q.shape
            rows = q.astype(mx.float32).reshape(b, k.shape[1], hq // k.shape[1], d) * scale
            probs = mx.softmax(rows @ k.astype(mx.float32).swapaxes(-1, -2), axis=-1)
            per_layer.append(average_pool(probs[..., start:end], POOL_KERNEL).max(axis=(0, 1, 2)))
        step = mx.stack(per_layer).max(axis=0)
        total = step if total is None else total + step
        token = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
    assert got.shape == (end - start,)
    assert mx.allclose(got, total / steps, rtol=1e-5, atol=1e-7).item()


def _window_then_steps(lm, prompt, window, steps, start, end):
    """The definition of scoring with an observation window: each of the prompt's last
    `window` tokens attends to the prompt up to itself, each lookahead step to the cache as it
    left it; pooled over [start, end), max over heads and layers, mean over all rows."""
    cache = make_prompt_cache(lm.model)
    mx.eval(lm.model(mx.array([prompt[:-window]]), cache=cache))
    rows = []  # per row: the max over layers
    captured = []
    with capture_attention(lm.model, captured):
        logits = lm.model(mx.array([prompt[-window:]]), cache=cache)
    for i in range(window):
        seen = len(prompt) - window + i + 1
        per_layer = []
        for q, k, scale in captured:
            b, hq, _, d = q.shape
            row = q[:, :, i : i + 1].astype(mx.float32).reshape(b, k.shape[1], hq // k.shape[1], d) * scale
            probs = mx.softmax(row @ k[:, :, :seen].astype(mx.float32).swapaxes(-1, -2), axis=-1)
            probs = mx.pad(probs, [(0, 0)] * 3 + [(0, end - seen)])  # keys it did not see: 0
            per_layer.append(average_pool(probs[..., start:end], POOL_KERNEL).max(axis=(0, 1, 2)))
        rows.append(mx.stack(per_layer).max(axis=0))
    token = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
    for _ in range(steps):
        captured = []
        with capture_attention(lm.model, captured):
            logits = lm.model(token, cache=cache)
        per_layer = []
        for q, k, scale in captured:
            b, hq, _, d = q.shape
            row = q.astype(mx.float32).reshape(b, k.shape[1], hq // k.shape[1], d) * scale
            probs = mx.softmax(row @ k.astype(mx.float32).swapaxes(-1, -2), axis=-1)
            per_layer.append(average_pool(probs[..., start:end], POOL_KERNEL).max(axis=(0, 1, 2)))
        rows.append(mx.stack(per_layer).max(axis=0))
        token = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
    return mx.stack(rows).mean(axis=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_prompts_last_tokens_score_beside_the_lookahead_steps(models, arch):
    """DraftScorer reads the prompt's last OBSERVATION_WINDOW tokens with their queries kept
    (real text, where a question sits) and scores them with the lookahead steps, each row
    masked to the keys it saw; the draft's cache still ends holding exactly the prompt."""
    from brisk.engine.accel.specprefill.scoring import LOOKAHEAD_STEPS

    lm = models[arch]
    prompt = [3 + (7 * i) % 200 for i in range(150)]
    start = 10
    scorer = DraftScorer(lm)
    got = scorer.importance(prompt, start, 64)
    want = _window_then_steps(lm, prompt, OBSERVATION_WINDOW, LOOKAHEAD_STEPS, start, len(prompt))
    assert got.shape == (len(prompt) - start,)
    # the draft reads the prompt at coarse precision (kernels/coarse.py): ~0.1% apart
    assert mx.allclose(got, want, rtol=1e-2, atol=1e-6).item()
    assert all(c.offset == len(prompt) for c in scorer.cache.layers if hasattr(c, "offset"))
    # a second turn that extends the prompt reuses the cache and scores only the new tokens
    longer = prompt + [5 + i % 90 for i in range(70)]
    again = scorer.importance(longer, len(prompt), 64)
    # fewer new tokens than the window: the window is the new tokens
    want = _window_then_steps(lm, longer, min(OBSERVATION_WINDOW, 70), LOOKAHEAD_STEPS, len(prompt), len(longer))
    assert mx.allclose(again, want, rtol=1e-2, atol=1e-6).item()


def test_observed_queries_must_match_the_drafts_layers(models):
    lm = models["llama"]
    cache = make_prompt_cache(lm.model)
    mx.eval(lm.model(mx.array([list(range(3, 80))]), cache=cache))
    with pytest.raises(ValueError, match="attention layers"):
        score_tokens(lm.model, cache, 9, 0, 77, steps=2, observed=[mx.zeros((1, 4, 2, 16))] * 7)


@pytest.mark.parametrize("path", ["native", "reference"])
def test_scoring_holds_one_block_of_query_rows_at_a_time(monkeypatch, path):
    """The window's 128 rows and the lookahead steps are scored ROW_BLOCK at a time: at 32K
    tokens a draft's float32 probabilities for all rows at once were ~250 MB a tensor (and
    lazily, all layers together, 10 GB). Here: 8K keys, 136 rows, 14 query heads. The native
    kernel holds only the block's logits; MLX's ops (a GPU's path) a few tensors of its size."""
    from brisk.engine.accel.specprefill import scoring
    from brisk.kernels import mlx_extension, pooled_attention

    if path == "native" and (mx.default_device() != mx.cpu or mlx_extension.load() is None):
        pytest.skip(f"the native kernel does not run here: {mlx_extension.unavailable_reason()}")
    if path == "reference":
        monkeypatch.setattr(scoring, "pooled_attention_max", pooled_attention.pooled_attention_max_reference)
    seen, hq, hkv, d, rows = 8192, 14, 2, 64, OBSERVATION_WINDOW + 8
    keys = mx.random.normal((1, hkv, seen + 8, d), key=mx.random.key(0)).astype(mx.float16)
    queries = [mx.random.normal((1, hq, OBSERVATION_WINDOW, d), key=mx.random.key(1)).astype(mx.float16)]
    queries += [mx.random.normal((1, hq, 1, d), key=mx.random.key(2 + i)).astype(mx.float16) for i in range(8)]
    mx.eval(keys, queries)

    def peak_and_scores(row_block):
        monkeypatch.setattr(scoring, "ROW_BLOCK", row_block)
        mx.synchronize()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        scores = scoring.layer_importance(queries, keys, d**-0.5, 0, seen, 8)
        mx.eval(scores)
        return mx.get_peak_memory() - before, scores

    one_tensor_all_rows = hq * rows * (seen + 8) * 4  # float32 logits or probabilities of every row at once
    blocked, by_block = peak_and_scores(32)
    at_once, all_rows = peak_and_scores(rows)
    assert by_block.shape == all_rows.shape == (rows, seen)
    assert mx.allclose(by_block, all_rows, rtol=1e-5, atol=1e-9).item()  # the same scores
    if path == "reference":
        assert at_once > 3 * one_tensor_all_rows  # what the blocks avoid (327 MB here)
        assert blocked < 1.5 * one_tensor_all_rows  # (84 MB here: a few block-sized tensors)
    else:
        assert at_once > one_tensor_all_rows  # every row's logits (72 MB here)
        assert blocked < 0.5 * one_tensor_all_rows  # one block's logits, the keys in float32


@pytest.mark.parametrize("path", ["native", "reference"])
def test_a_draft_whose_attention_overflows_falls_back_to_a_full_prefill(models, tmp_path, monkeypatch, path):
    """One head's queries past float32's range: its softmax is NaN. NaN scores would rank chunks
    at random (the native kernel's old answer for them looked usable); the scorer refuses them,
    its cache still ends holding the prompt, and the turn runs a full prefill with a warning."""
    from brisk.engine.accel.specprefill import scoring
    from brisk.kernels import pooled_attention

    if path == "reference":
        monkeypatch.setattr(scoring, "pooled_attention_max", pooled_attention.pooled_attention_max_reference)
    draft = load_folder(make_tiny_model_by_key(tmp_path / "d", "llama", seed=1, context_length=2048))
    attention = draft.model.model.layers[-1].self_attn
    weight = attention.q_proj.weight  # (4 heads x 16, 64)
    attention.q_proj.weight = mx.concatenate([weight[:16] * 1e38, weight[16:]])
    tokens = draft.tokenizer.encode(DOC)
    scorer = DraftScorer(draft)
    with pytest.raises(ValueError, match="not finite"):
        scorer.importance(tokens, 0, 64)
    assert all(c.offset == len(tokens) for c in scorer.cache.layers if hasattr(c, "offset"))
    target = models["llama"]
    _, dense = turn(Session(target, greedy()), DOC)
    _, sparse = turn(Session(target, greedy(sparse_prefill="on", sparse_keep=0.3), draft=draft), DOC)
    assert sparse.metrics.sparse_outcome == "fallback" and sparse.token_ids == dense.token_ids
