"""SpecPrefill's pooled attention on the CPU by a native kernel (kernels/csrc/pooled_attention.cpp).

The draft scores prompt tokens by how its query rows attend to them: per head, softmax over
the keys each row saw, average-pooled along the prompt, then the maximum over heads
(engine/accel/specprefill/scoring.py). MLX's CPU softmax pays a scalar exp per element, ~13 ns:
with 136 rows over an 8K prompt that was ~6 of the ~8 s a Qwen-0.5B draft spent scoring.
The kernel takes the logits MLX's product made and does the rest in one node, with the
vectorized exp the attention kernels use.

- `pooled_attention_max_reference`: the definition in MLX ops (what a GPU runs).
- `pooled_attention_max_native`: the kernel, a lazy MLX primitive; raises NativeUnsupported
  where it does not run (no primitives module, not float32, another device).
- `pooled_attention_max`: the kernel where it runs, else the reference.
"""

from __future__ import annotations

import mlx.core as mx

from brisk.kernels import mlx_extension
from brisk.kernels.native_attention import NativeUnsupported, threads


def average_pool(scores: mx.array, kernel: int) -> mx.array:
    """Average pool along the last axis, same length, zero padding (counted)."""
    pad = kernel // 2
    padded = mx.pad(scores, [(0, 0)] * (scores.ndim - 1) + [(pad, pad)])
    csum = mx.concatenate([mx.zeros(scores.shape[:-1] + (1,)), mx.cumsum(padded, axis=-1)], axis=-1)
    return (csum[..., kernel:] - csum[..., :-kernel]) / kernel


def check_bounds(logits: mx.array, visible_first: int, start: int, end: int, kernel: int) -> None:
    """What both paths refuse (the native binding says the same): MLX's ops would otherwise
    answer a slice past the keys or an even kernel with a shorter or longer row, silently."""
    if logits.ndim != 3 or logits.shape[0] < 1:
        raise ValueError(f"pooled_attention_max takes (heads, rows, keys) logits, not shape {tuple(logits.shape)}")
    if visible_first < 1 or kernel < 1 or kernel % 2 == 0 or not 0 <= start <= end <= logits.shape[2]:
        raise ValueError(
            f"pooled_attention_max: visible_first {visible_first} (>= 1), kernel {kernel} (odd), "
            f"keys [{start}, {end}) of {logits.shape[2]}"
        )


def pooled_attention_max_reference(logits: mx.array, visible_first: int, start: int, end: int, kernel: int) -> mx.array:
    """(rows, end - start): of scaled float32 logits (heads, rows, seen), where row r saw the
    first visible_first + r keys, the maximum over heads of softmax over those keys,
    average-pooled over keys [start, end) with zeros outside them. A row is NaN where a
    head's softmax is (a NaN, +inf or no finite logit among the keys it saw)."""
    check_bounds(logits, visible_first, start, end, kernel)
    rows, seen = logits.shape[1], logits.shape[2]
    sees = min(visible_first, seen) + mx.arange(rows)  # capped: past the keys is all of them (and int32)
    # where, not + -inf: a key the row did not see is out, even a NaN or +inf one (+inf - inf is NaN)
    seen_logits = mx.where(mx.arange(seen)[None] < sees[:, None], logits.astype(mx.float32), -mx.inf)
    probs = mx.softmax(seen_logits, axis=-1)
    return average_pool(probs[..., start:end], kernel).max(axis=0)


def pooled_attention_max_native(logits: mx.array, visible_first: int, start: int, end: int, kernel: int) -> mx.array:
    # The device first: on a GPU (a Mac's default) nothing is compiled or loaded.
    if mx.default_device() != mx.cpu or logits.dtype != mx.float32 or logits.ndim != 3:
        raise NativeUnsupported("the native pooled attention takes float32 (heads, rows, keys) logits on the CPU")
    check_bounds(logits, visible_first, start, end, kernel)
    primitives = mlx_extension.load()
    if primitives is None:
        raise NativeUnsupported(mlx_extension.unavailable_reason())
    return primitives.pooled_attention_max(logits, visible_first, start, end, kernel, threads())


def pooled_attention_max(logits: mx.array, visible_first: int, start: int, end: int, kernel: int) -> mx.array:
    """The kernel where it runs (the CPU, with the primitives module), else the reference."""
    try:
        return pooled_attention_max_native(logits, visible_first, start, end, kernel)
    except NativeUnsupported:
        return pooled_attention_max_reference(logits, visible_first, start, end, kernel)
