"""SpecPrefill: a small draft model picks the prompt tokens that matter; the target
prefills only those, at their original positions.

Reference: "SpecPrefill: Speculative Prefilling for Faster Long-Context LLM Inference"
(Liu et al., 2025), as ported to MLX in "SpecPrefill on Unified Memory" (2026).

1. The draft prefills the new part of the prompt (its own prompt cache, like the target's),
   all but its last OBSERVATION_WINDOW (128) tokens, whose queries it keeps as it reads them.
2. Lookahead: the draft decodes LOOKAHEAD_STEPS tokens greedily; every attention layer's
   post-RoPE query is captured where mlx-lm's model code hands it to the shared
   `scaled_dot_product_attention`, so the capture does not depend on how the module
   builds its queries (plain, q_norm, gated, no RoPE).
3. Importance of each new prompt token: softmax(q·Kᵀ·scale) in float32 (GQA heads folded)
   for every query row (the prompt's last tokens, then the lookahead steps), average-pooled
   along tokens (kernel 13), max over heads and layers, mean over rows. Layers whose keys
   do not span the prompt (sliding windows) are skipped.
   Why the window (continuation perplexity, 2K, keep 0.2, Qwen-0.5B drafting for itself):
   8 greedy steps say little about what the next hundred tokens need; the prompt's own last
   tokens (SnapKV's observation window) are real text, and 32 of them took argparse.py
   from 1.83x dense to 1.33x. The mean over layers helped that draft more
   (1.27x) but hurt SmolLM2's (135M) on three of four texts, so the max stays. On texts
   not tuned on (Apache-2.0, shutil.py, man tar, README + docs; geometric mean, next 128
   tokens): 1.20x -> 1.15x with that draft, 1.22x -> 1.16x with SmolLM2 drafting.
   Longer contexts (2026-11-28, AMD EPYC, Qwen-0.5B target, keep 0.2, next 256 tokens,
   `brisk bench sparse-ppl --cuts 3`: each text cut in 3 windows from its start to its end,
   15 windows in all; held-out shutil.py, man tar, README + docs, logging/__init__.py and
   man find), geometric mean of the ratios with a 32-token window: drafting for itself
   1.103 at 6K, 1.096 at 7K, 1.074 at 8K; SmolLM2 drafting (cross tokenizer; its 8K window
   cannot hold an 8K Qwen prompt in its own tokens) 1.091 at 6K, 1.111 at 7K.
   Why 128 rows: on the tuning texts (man bash, argparse.py, GPL-3, 9 windows at 6K) 32,
   64, 128 and 256 rows gave 1.090, 1.092, 1.075, 1.082 drafting for itself and 1.115,
   1.120, 1.104, 1.104 with SmolLM2 (32 rows with the mean over layers: 1.074 and 1.130;
   over heads: 1.087 and 1.122). The held-out windows with 128 rows: 1.058, 1.077, 1.082
   drafting for itself (6K, 7K, 8K), 1.079 and 1.099 with SmolLM2 (6K, 7K). Their softmax,
   pool and max over heads are one native node on the CPU (kernels/pooled_attention.py):
   in MLX's ops they took an 8K prompt's scoring from 2.7 s (32 rows) to 8.6 s; natively 2.3 s.
   Single windows range 0.97-1.62: one continuation moves the ratio more than the length
   does. The floor is the budget, not the scorer: on man bash at 6K (a tuning text, 1.68
   with 32 rows, 1.46 with 128) the target's own attention over the real next 256 tokens,
   as the importance, still gives 1.14 (1.10 with 8-token chunks), and over their first 32
   tokens 1.65; 16-64 lookahead steps or a kept window of the last 128-1216 tokens did not help.
4. Selection in 32-token chunks (aligned to the end of the prompt) by mean importance:
   the top ⌈k·M/32⌉, plus the first 32 tokens (attention sinks), the chunk with the last
   prompt token (its logits give the first answer token; reference implementations drop
   it), and for sliding-window targets the last `window` tokens. `auto` keeps the fewest chunks holding a share of the
   importance mass instead, or declines when that share needs most of the prompt.
5. The target prefills kept runs with their original RoPE positions (engine/accel/positions.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx

from brisk.engine.accel.attention_capture import capture_attention
from brisk.engine.accel.positions import install_position_shift, token_positions
from brisk.engine.accel.speculative.rewind import CacheCheckpoint
from brisk.engine.api.events import PrefillProgressed, result_of
from brisk.engine.runtime.mx_values import float_list, item_int
from brisk.kernels.coarse import coarse_products
from brisk.kernels.pooled_attention import pooled_attention_max

LOOKAHEAD_STEPS = 8  # the paper's setting
OBSERVATION_WINDOW = 128  # the prompt's last tokens whose queries also score (UniPrefill reads 128 too)
CHUNK = 32  # selection granularity (tokens)
ROW_BLOCK = 32  # query rows scored together (bounds the scoring's memory)
POOL_KERNEL = 13  # smooths single-token spikes before chunking
DEFAULT_KEEP = 0.2
DEFAULT_THRESHOLD = 8192  # `auto` only acts on prompts at least this long
# `auto`: keep chunks holding this share of the importance mass, never fewer than
# AUTO_MIN_KEEP; if that needs more than AUTO_MAX_KEEP, importance is too flat to drop
# anything safely (e.g. counting across a whole document) and a full prefill runs.
AUTO_MASS = 0.9
AUTO_MIN_KEEP = 0.1
AUTO_MAX_KEEP = 0.6


class SparsePrefillDeclined(Exception):
    """Not an error: the turn runs a full prefill and metrics say why. `flat`: the guard
    against exhaustive tasks declined (importance spread over most of the prompt)."""

    def __init__(self, message: str, *, flat: bool = False):
        super().__init__(message)
        self.flat = flat


@dataclass(frozen=True)
class Selection:
    runs: list[tuple[int, int]]  # kept [start, end) ranges of the new tokens, in order
    kept: int
    total: int
    keep_fraction: float


def layer_importance(
    steps_queries: list, keys, scale: float, start: int, end: int, after: int | None = None
) -> mx.array | None:
    """Pooled attention over keys [start, end) of every query row at one layer: (rows,
    end - start), max over heads. `steps_queries` are (B, Hq, rows, D) blocks in the order
    the keys were written (the prompt's last tokens, then one per lookahead step); `keys` are
    the layer's after the last of them, and row i saw only the first len(keys) - rows + i + 1.
    `after`: how many of the keys follow the prompt (the lookahead tokens; default: one a row).
    Rows go ROW_BLOCK at a time, each block evaluated: a block's float32 probabilities over
    a 32K prompt are ~60 MB a tensor, all rows at once ~4x that, and all layers lazily together GBs."""
    steps = sum(q.shape[2] for q in steps_queries)  # query rows, each a token that attended
    if not isinstance(keys, mx.array) or keys.shape[2] - (steps if after is None else after) < end:
        return None  # packed or sliding-window cache: it does not span the prompt
    b, hq, _, d = steps_queries[0].shape
    hkv, seen = keys.shape[1], keys.shape[2]
    all_rows = mx.concatenate(steps_queries, axis=2).astype(mx.float32) * scale  # (B, Hq, steps, D)
    keys_float = keys.astype(mx.float32)
    mx.eval(all_rows, keys_float)  # once, not again in every block's graph
    keys_t = keys_float.swapaxes(-1, -2)
    blocks = []
    for first in range(0, steps, ROW_BLOCK):
        rows = min(ROW_BLOCK, steps - first)
        q = all_rows[:, :, first : first + rows].reshape(b, hkv, (hq // hkv) * rows, d)  # a head's rows in order
        # row i of the block saw the keys before it (the prompt's) and its own; the logits are
        # not named, so MLX may reuse their buffer (on the reference path, a GPU's)
        visible_first = seen - steps + 1 + first
        block = pooled_attention_max((q @ keys_t).reshape(b * hq, rows, seen), visible_first, start, end, POOL_KERNEL)
        mx.eval(block)
        blocks.append(block)
    return mx.concatenate(blocks, axis=0)


def score_tokens(
    draft_model,
    cache,
    first_token: int,
    start: int,
    end: int,
    steps: int = LOOKAHEAD_STEPS,
    observed: list | None = None,
) -> mx.array:
    """Importance of cached positions [start, end) from `steps` greedy lookahead steps and,
    when given, `observed`: per attention layer, the queries of the last prompt tokens as
    they were read (B, Hq, W, D). The lookahead tokens are taken back out of `cache`
    afterwards, also when scoring fails: trimmed, or for layers that cannot trim (recurrent
    state, a sliding window that wraps) restored from a snapshot taken before the steps.
    Where some layer can be neither (`CacheCheckpoint.possible` is False), the caller must
    forget the cache. The steps only decode; all queries are scored together at the end (per
    step and layer, the small products and MLX's exp were 0.4 s of SmolLM2's 2.3 s scoring at 2K)."""
    from mlx_lm.models.cache import trim_prompt_cache

    if steps < 1:
        raise ValueError("scoring needs at least one lookahead step")
    checkpoint = CacheCheckpoint(cache, steps) if CacheCheckpoint.possible(cache) else None
    token = mx.array([[first_token]])
    queries: list[list[mx.array]] = []  # per layer, each step's captured queries
    captured: list = []
    fed = 0
    try:
        for _ in range(steps):
            captured = []
            with capture_attention(draft_model, captured):
                logits = draft_model(token, cache=cache)
            fed += 1
            if not queries:
                queries = [[q] for q in observed] if observed else [[] for _ in captured]
                if len(queries) != len(captured):
                    raise ValueError("observed queries do not match the draft's attention layers")
            for per_layer, (q, _, _) in zip(queries, captured):
                per_layer.append(q)
            token = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
            mx.eval(token, [q for q, _, _ in captured])
        most = None  # max over layers so far, (rows, end - start); one layer's scores alive at a time
        for qs, (_, k, sc) in zip(queries, captured):
            layer = layer_importance(qs, k, sc, start, end, fed)
            if layer is not None:
                most = layer if most is None else mx.maximum(most, layer)
                mx.eval(most)
        if most is None:
            raise NotImplementedError("no attention layer of the draft spans the prompt")
        total = most.mean(axis=0)  # mean over query rows
        if not mx.all(mx.isfinite(total)).item():
            # a draft whose queries or keys overflowed: NaN scores would rank chunks at random
            raise ValueError("the draft's attention is not finite (NaN or infinite scores); it cannot rank the prompt")
    finally:
        if checkpoint is not None:
            checkpoint.restore(fed)  # to where each layer stood: a step that failed partway fed only some
        else:
            trim_prompt_cache(cache, fed)
    return total


def select_chunks(
    importance: mx.array, *, keep: float | None, window: int | None = None, mass: float = AUTO_MASS
) -> Selection:
    """Chunks to keep. keep=None is `auto` (importance mass); raises SparsePrefillDeclined."""
    scores = float_list(importance)
    total = len(scores)
    # Chunks are aligned to the end, so the last one is a full 32 tokens ending with the
    # question; a short remainder, if any, is the first chunk.
    bounds = [(max(0, e - CHUNK), e) for e in range(total, 0, -CHUNK)][::-1]
    n_chunks = len(bounds)
    chunk_scores = [sum(scores[s:e]) / (e - s) for s, e in bounds]
    order = sorted(range(n_chunks), key=lambda i: -chunk_scores[i])
    if keep is None:
        masses = [chunk_scores[i] * (bounds[i][1] - bounds[i][0]) for i in order]
        goal, acc, needed = mass * sum(masses), 0.0, 0
        for m in masses:
            acc += m
            needed += 1
            if acc >= goal:
                break
        fraction = needed / n_chunks
        if fraction > AUTO_MAX_KEEP:
            raise SparsePrefillDeclined(
                f"auto: importance is flat ({fraction:.0%} of chunks hold {mass:.0%} of it); full prefill", flat=True
            )
        n_keep = max(needed, math.ceil(AUTO_MIN_KEEP * n_chunks))
    else:
        n_keep = math.ceil(keep * total / CHUNK)
    # the first 32 tokens (attention sinks) and the last chunk (the question) always stay
    sinks = {i for i, (s, _) in enumerate(bounds) if s < CHUNK}
    chosen = set(order[:n_keep]) | sinks | {n_chunks - 1}
    if window:
        chosen |= {i for i, (_, e) in enumerate(bounds) if e > total - window}
    runs: list[tuple[int, int]] = []
    for i in sorted(chosen):
        s, e = bounds[i]
        if runs and runs[-1][1] == s:
            runs[-1] = (runs[-1][0], e)
        else:
            runs.append((s, e))
    kept = sum(e - s for s, e in runs)
    return Selection(runs, kept, total, kept / total)


def sparse_prefill(
    model, cache, tokens: list[int], runs: list[tuple[int, int]], *, base: int, step: int
) -> Iterator[int]:
    """Prefill tokens[s:e] for each run, each token at its logical position base + its index
    (yields tokens done).

    The kept tokens of all runs go through the model `step` at a time, each with its own
    RoPE position: a run of 32 tokens does not cost a forward pass of its own (short passes
    are what quantized matmuls do worst). Slots stay in order, so the causal mask over
    them is the one the kept tokens need."""
    install_position_shift(model)
    if not any(hasattr(layer, "offset") for layer in cache):
        raise NotImplementedError("the target's cache has no positional layer to map from")
    kept = [i for s, e in runs for i in range(s, e)]
    for c in range(0, len(kept), step):
        index = kept[c : c + step]
        with token_positions(model, mx.array([base + i for i in index], dtype=mx.int32)):
            model(mx.array([tokens[i] for i in index])[None], cache=cache)
        mx.eval([x.state for x in cache])
        yield c + len(index)


class DraftScorer:
    """The draft side of SpecPrefill for one conversation: its model, its prompt cache
    (reused across turns like the target's), and the scoring of new prompt tokens."""

    def __init__(self, draft, cache=None):
        from brisk.engine.kv import PromptCache

        self.draft = draft
        # `is None`, not `or`: an empty PromptCache is falsy (it has a length), and a fresh
        # one here left the pair's cache empty, so the draft re-read the whole prompt each turn
        self.cache = cache if cache is not None else PromptCache(draft.model)

    def importance_across(self, target_tokenizer, tokens: list[int], start: int, step: int) -> mx.array:
        return result_of(self.importance_across_steps(target_tokenizer, tokens, start, step))

    def importance(self, tokens: list[int], start: int, step: int) -> mx.array:
        return result_of(self.importance_steps(tokens, start, step))

    def importance_across_steps(self, target_tokenizer, tokens: list[int], start: int, step: int):
        """Importance of target tokens[start:] scored by a draft with another tokenizer:
        the draft reads the same text, and each target token takes the highest importance
        of the draft tokens sharing its characters (engine/accel/translate.py). A generator
        of progress events; returns the scores."""
        from brisk.engine.accel.translate import encode_document, project, text_and_spans

        text, target_spans = text_and_spans(target_tokenizer, tokens)
        draft_ids, draft_spans = encode_document(self.draft.tokenizer, text)  # as the drafter encodes it
        char_start = target_spans[start][0]
        draft_start = next(i for i, (_, e) in enumerate(draft_spans) if e > char_start)  # (never a BOS)
        scores = float_list((yield from self.importance_steps(draft_ids, draft_start, step)))
        return mx.array(project(scores, draft_spans[draft_start:], target_spans[start:]))

    def importance_steps(self, tokens: list[int], start: int, step: int):
        """Importance of tokens[start:], in the draft's own token ids. A generator of progress
        events (the draft reading the prompt, then choosing); returns the scores."""
        if len(tokens) > self.draft.context_length:
            raise SparsePrefillDeclined(f"the draft holds {self.draft.context_length} tokens, the prompt {len(tokens)}")
        # the new tokens' last ones are read with their queries kept (the observation window)
        window = max(1, min(OBSERVATION_WINDOW, len(tokens) - start))
        to_read = len(tokens) - window - self.cache.reuse(tokens[:-window], keep_last=False)
        yield PrefillProgressed(0, to_read, "draft")
        # The draft's reading only ranks tokens: its products take llama.cpp's precision
        # (kernels/coarse.py), set only while a chunk is built, not across our yields.
        chunks = self.cache.sync(tokens[:-window], step)
        while True:
            with coarse_products():
                done = next(chunks, None)
            if done is None:
                break
            yield PrefillProgressed(done, to_read, "draft")
        yield PrefillProgressed(0, len(tokens) - start, "select")
        layers = self.cache.layers
        # The drafter reads a prompt to its last token but one (the last goes into its first
        # proposal, for the logits). A cache that cannot trim is left holding that, through a
        # mark before the last token: trimming it later would start the draft over.
        hold_back = CacheCheckpoint.possible(layers) and not CacheCheckpoint.trims(layers, window + LOOKAHEAD_STEPS)
        captured: list = []
        mark = None
        # a forward that fails partway leaves its first layers a window ahead of the rest
        before = CacheCheckpoint(layers, window) if CacheCheckpoint.possible(layers) else None
        try:
            with capture_attention(self.draft.model, captured):
                if hold_back and window > 1:
                    self.draft.model(mx.array(tokens[-window:-1])[None], cache=layers)
                if hold_back:
                    mark = CacheCheckpoint(layers, 1 + LOOKAHEAD_STEPS)
                logits = self.draft.model(mx.array(tokens[-1 if mark else -window :])[None], cache=layers)
        except BaseException:
            if before is None:
                self.cache.reset()
            else:
                before.restore(0)
            raise
        del before
        self.cache.tokens = list(tokens)
        first = item_int(mx.argmax(logits[0, -1]))
        calls = len(captured) // 2 if mark and window > 1 else 0  # attention calls of the first read
        observed = [q for q, _, _ in captured[calls:]]
        if calls:
            observed = [mx.concatenate([a[0], b], axis=2) for a, b in zip(captured[:calls], observed)]
        # Not held through the scoring: the window's logits (128 rows of the vocabulary, ~78 MB
        # for a Qwen draft) and its captured keys (views of the cache's buffers: held, the
        # lookahead's first write copies every layer's keys).
        del logits, captured
        try:
            return score_tokens(self.draft.model, self.cache.layers, first, start, len(tokens), observed=observed)
        finally:
            if not CacheCheckpoint.possible(self.cache.layers):
                self.cache.reset()  # the lookahead tokens could not be taken back out
            elif mark is not None:
                mark.restore(1)
                self.cache.tokens = list(tokens[:-1])
