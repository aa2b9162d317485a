"""UniPrefill's prefill: the whole prompt goes through one layer at a time, and at each
drop layer the target scores its own tokens and only the survivors go on.

Layer-segment-major order is what makes dropping possible (a drop needs every token's
key at that layer), so the model's own forward is driven layer by layer:

1. A dry run of the model's `__call__` with every layer replaced by a recorder that
   returns its input: it gives the embedded input and the arguments (mask, cache, ...)
   the model hands each layer, built by the model's own code. A model that changes the
   hidden state between layers is detected (a layer's input is not the previous
   layer's output) and declined: driving its layers alone would compute something else.
2. Each layer runs the current tokens in chunks of `step` (its cache grows chunk by
   chunk, so the causal mask and memory are as in dense chunked prefill), every token at
   its original RoPE position (engine/accel/positions.py).
3. After a drop layer (attention and MLP: the MLP is per token, so gathering after it
   keeps the same survivors' states as gathering before it, at one layer's MLP of extra
   work), its attention's queries and keys are scored (selection.py) and hidden states
   and positions are gathered to the survivors. Layers up to the drop layer hold every
   token's KV; later layers only the survivors', compacted in order.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx
import numpy as np

from brisk.engine.accel.attention_capture import capture_attention
from brisk.engine.accel.positions import install_position_shift, token_positions
from brisk.engine.accel.uniprefill.selection import QUERY_WINDOW, key_mass, select_blocks


class UniPrefillUnsupported(Exception):
    """This model (or this cache) cannot be prefilled this way; the reason is the message."""


@dataclass(frozen=True)
class DropReport:
    layer: int
    before: int  # new tokens entering the drop
    kept: int
    kept_runs: list[tuple[int, int]]  # [start, end) of the new tokens still present after it


class _Recorder:
    """Stands in for a layer during the dry run: records its call, returns its input
    (attributes the model's loop reads, such as `use_sliding`, come from the layer)."""

    def __init__(self, layer, calls: list, index: int):
        self._layer, self._calls, self._index = layer, calls, index

    def __getattr__(self, name):
        return getattr(self._layer, name)

    def __call__(self, x, *args, **kwargs):
        self._calls.append((self._index, x, args, kwargs))
        return x


def _layer_lists(model) -> list[list]:
    """Every list inside the model that holds its layers (some models loop over a
    slice of them, e.g. mlx-lm's pipeline_layers)."""
    layer_ids = {id(layer) for layer in model.layers}
    found: list[list] = []
    for _, module in model.named_modules():
        for value in module.values():
            if isinstance(value, list) and value and all(id(v) in layer_ids for v in value):
                if not any(value is f for f in found):
                    found.append(value)
    return found


def record_layer_calls(model, cache, tokens: mx.array) -> list[tuple[mx.array, tuple, dict]]:
    """(input, args, kwargs) of each layer's call in the model's own forward, lazily."""
    originals = list(model.layers)
    calls: list = []
    stand_ins = {id(layer): _Recorder(layer, calls, i) for i, layer in enumerate(originals)}
    lists = [(lst, list(lst)) for lst in _layer_lists(model)]
    try:
        for lst, _ in lists:
            lst[:] = [stand_ins[id(layer)] for layer in lst]
        model(tokens, cache=cache)
    finally:
        for lst, saved in lists:
            lst[:] = saved
    if [c[0] for c in calls] != list(range(len(originals))):
        raise UniPrefillUnsupported(f"{type(model).__module__} does not call each layer once, in order")
    for (_, previous, _, _), (index, x, _, _) in zip(calls, calls[1:]):
        if x is not previous:
            raise UniPrefillUnsupported(
                f"{type(model).__module__} changes the hidden state between layers "
                f"{index - 1} and {index}; its layers cannot be driven one by one"
            )
    return [(x, args, kwargs) for _, x, args, kwargs in calls]


def _cache_of(args: tuple, kwargs: dict, cache: list):
    """The entry of `cache` a layer's call was handed (None for layers without one)."""
    ids = {id(c) for c in cache}
    return next((a for a in (*args, *kwargs.values()) if id(a) in ids), None)


def _position_dependent(args: tuple, kwargs: dict) -> bool:
    """Whether a layer's call carries an array built for the full, contiguous sequence
    (an explicit mask: sliding windows)."""
    return any(isinstance(a, mx.array) for a in (*args, *kwargs.values()))


def _windowed(layer_cache) -> bool:
    """A sliding-window layer whose mask its own cache can rebuild for any chunk (mlx-lm
    sizes these caches to the window)."""
    return hasattr(layer_cache, "max_size") and hasattr(layer_cache, "make_mask")


def _with_mask(args: tuple, kwargs: dict, mask) -> tuple[tuple, dict]:
    """The layer's arguments with its mask (an array, or "causal") replaced by `mask`."""

    def swap(a):
        return mask if isinstance(a, mx.array) or (isinstance(a, str) and a == "causal") else a

    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}


def runs_of(index: np.ndarray) -> list[tuple[int, int]]:
    """Sorted indices as [start, end) runs."""
    if not len(index):
        return []
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(index)]])
    return [(int(index[s]), int(index[e - 1]) + 1) for s, e in zip(starts, ends)]


class UniPrefill:
    """One prefill of `tokens` (new tokens at prompt positions `base`...) into `cache`.
    `run()` yields after each layer; `reports` holds one DropReport per drop layer."""

    def __init__(self, model, cache: list, *, drop_layers: list[int] | None, p: float, step: int):
        self.model, self.cache = model, cache
        self.drop_layers = sorted(set(drop_layers)) if drop_layers is not None else None
        self.p, self.step = p, step
        self.reports: list[DropReport] = []
        self.layer_tokens: list[int] = []  # tokens each layer processed
        self.layer_caches: list = []  # the cache entry each layer uses (None: it has none)
        self.tail = QUERY_WINDOW  # last tokens always kept
        # prompt positions every drop layer keeps (the router's `auto`: the passages the
        # question points at, engine/accel/question_focus.py)
        self.keep_positions: np.ndarray = np.zeros(0, dtype=np.int64)

    def keep_runs(self, runs: list[tuple[int, int]]) -> None:
        """Every drop layer keeps the prompt positions [start, end) of `runs`."""
        kept = [np.arange(s, e) for s, e in runs if e > s]
        self.keep_positions = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)

    def run(self, tokens: list[int], base: int) -> Iterator[int]:
        calls = record_layer_calls(self.model, self.cache, mx.array(tokens)[None])
        self.layer_caches = [_cache_of(args, kwargs, self.cache) for _, args, kwargs in calls]
        if self.drop_layers is None:
            self.drop_layers = default_drop_layers([spans_prompt(c) for c in self.layer_caches])
        self._check(calls)
        h = calls[0][0]
        positions = np.arange(base, base + len(tokens))
        index = np.arange(len(tokens))
        for i, (_, args, kwargs) in enumerate(calls):
            self.layer_tokens.append(len(index))
            h, queries, keys = self._layer(i, h, args, kwargs, positions)
            if i in self.drop_layers:
                kept = self._select(queries, keys, positions)
                h = h[:, mx.array(kept)]
                mx.eval(h)
                self.reports.append(DropReport(i, len(index), len(kept), runs_of(index[kept])))
                positions, index = positions[kept], index[kept]
            yield i + 1

    def _check(self, calls) -> None:
        """UniPrefillUnsupported when the model's layout does not allow it (before any work)."""
        n = len(calls)
        if install_position_shift(self.model) and len(self.cache) != n:
            raise UniPrefillUnsupported(f"{n} layers with RoPE but {len(self.cache)} cache entries")
        if not self.drop_layers:
            raise UniPrefillUnsupported("no drop layers")
        bad = [i for i in self.drop_layers if not 0 <= i < n - 1]
        if bad:
            raise UniPrefillUnsupported(f"drop layers {bad} outside 0..{n - 2}")
        windowed = [i for i in self.drop_layers if not spans_prompt(self.layer_caches[i])]
        if windowed:
            raise UniPrefillUnsupported(f"drop layers {windowed} have no full-attention cache to score the prompt with")
        first_drop = self.drop_layers[0]
        late = [
            i
            for i in range(first_drop + 1, n)
            if _position_dependent(*calls[i][1:]) and not _windowed(self.layer_caches[i])
        ]
        if late:
            raise UniPrefillUnsupported(
                f"layers {late[:4]} after the first drop layer ({first_drop}) take a mask "
                "built for the whole prompt that their cache cannot rebuild for the survivors"
            )
        # Sliding-window layers after a drop see the last `window` survivors (the released
        # code's window over the compacted sequence); the last `window` tokens always stay,
        # so in decode that is exactly the last `window` positions.
        windows = [c.max_size for c in self.layer_caches[first_drop + 1 :] if _windowed(c)]
        self.tail = max([QUERY_WINDOW, *windows])

    def _layer(self, i: int, h, args, kwargs, positions: np.ndarray):
        """Run layer i over the current tokens, chunk by chunk; for a drop layer also the
        last QUERY_WINDOW query rows and the layer's keys, captured from its attention."""
        layer, layer_cache = self.model.layers[i], self.layer_caches[i]
        n = h.shape[1]
        windowed = _windowed(layer_cache)
        whole = _position_dependent(args, kwargs) and not windowed  # a mask for the whole sequence: one call
        bounds = [(0, n)] if whole else [(s, min(s + self.step, n)) for s in range(0, n, self.step)]
        captured: list = []
        scoring = i in (self.drop_layers or ())
        outs = []
        for s, e in bounds:
            call_args, call_kwargs = args, kwargs
            if windowed:  # the chunk's window mask, from the layer's own cache (as the model builds it)
                call_args, call_kwargs = _with_mask(args, kwargs, layer_cache.make_mask(e - s))
            with (
                token_positions(self.model, mx.array(positions[s:e], mx.int32)),
                capture_attention(self.model, captured) if scoring else nullcontext(),
            ):
                out = layer(h[:, s:e], *call_args, **call_kwargs)
            mx.eval(out, layer_cache.state if layer_cache is not None else [])
            outs.append(out)
            if scoring:  # only the calls holding the last QUERY_WINDOW queries are needed
                captured[:] = captured[-(QUERY_WINDOW // self.step + 2) :]
        h = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=1)
        mx.eval(h)
        if not scoring:
            return h, None, None
        if not captured:
            raise UniPrefillUnsupported(f"layer {i} has no attention through mlx-lm's shared SDPA to score with")
        queries = mx.concatenate([q for q, _, _ in captured], axis=2)[:, :, -QUERY_WINDOW:]
        return h, (queries, captured[-1][2]), _float_keys(captured[-1][1], self.layer_caches[i])

    def _select(self, queries, keys, positions: np.ndarray) -> np.ndarray:
        q, scale = queries
        mass = key_mass(q, keys, scale)[-len(positions) :]
        kept = select_blocks(np.array(mass), positions, self.p, tail=self.tail)
        if len(self.keep_positions):
            kept = np.union1d(kept, np.flatnonzero(np.isin(positions, self.keep_positions)))
        return kept


def default_drop_layers(full_attention: list[bool]) -> list[int]:
    """The released Llama-3.1-8B setting scaled to depth: from about 22% of the layers,
    every eighth of them, up to about 85% (32 layers: 7, 11, 15, 19, 23, 27); each moved
    to the next full-attention layer. Hybrids may end up with none (then it declines)."""
    n = len(full_attention)
    stride = max(1, round(n / 8))
    chosen: list[int] = []
    for target in range(round(0.22 * n), int(0.85 * n) + 1, stride):
        layer = next((i for i in range(target, n - 1) if full_attention[i]), None)
        if layer is not None and layer not in chosen:
            chosen.append(layer)
    return chosen


def spans_prompt(layer_cache) -> bool:
    """Whether a layer's cache keeps every token's key (full attention, packed or not):
    sliding windows and recurrent state do not."""
    return hasattr(layer_cache, "offset") and not hasattr(layer_cache, "max_size") and hasattr(layer_cache, "keys")


def _float_keys(keys, layer_cache) -> mx.array:
    """The keys the attention read: packed layers (the int4/int8 KV cache) hand over a
    layout (kernels/packed_kv.py), dequantized here."""
    if isinstance(keys, mx.array):
        return keys
    return keys.dequantize(mx.float32)
