"""Attention computed on a packed (int4/int8, affine, grouped) KV cache.

After Open-TQ-Metal (2026): K and V stay quantized (per group of 32 or 64: packed
integers, a scale and a bias); attention reads them through `mx.quantized_matmul`, which
dequantizes inside the dot products, so no full-precision copy of K or V is made.

- `quantized_attention_reference`: dequantize, then plain softmax attention (the oracle).
- `quantized_attention_single`: one pass, GQA query heads folded into matmul rows so each
  packed K/V head is read once per step, not once per query head (mlx-lm broadcasts).
- `quantized_attention_split`: the same over blocks of keys with an online softmax
  (running max and sum, log-sum-exp merge), so the (heads, queries, keys) score matrix
  is never materialized at long context (prefill and multi-token verify).
- `quantized_attention_dequantized`: for many query rows (prefill chunks, verify) the
  fused matmul is the wrong tool on the CPU (810 ms vs 82 ms at 1536 rows x 4096 keys):
  dequantizing costs ~2 ns per element, so this layer's K/V are dequantized transiently
  and attended as Open-TQ-Metal does for multi-token prefill: by Brisk's fused float
  kernel on the CPU (kernels/fused_attention.py), MLX's SDPA elsewhere.
- `quantized_attention`: the dispatcher. On the CPU, decode-like steps go to the native
  kernel (kernels/native_attention.py, built on first use) when it can be had; otherwise,
  and on every GPU backend (no Metal/CUDA kernel here yet), the portable MLX paths above,
  which our tests run.

Shapes: queries (B, Hq, L, D); packed keys/values are mx.quantize outputs of
(B, Hkv, S, D) tensors. Masks follow mlx-lm: None, "causal" (queries are the last L of
the S positions), or an array broadcastable to (B, Hq, L, S), boolean or additive.
"""

from __future__ import annotations

import mlx.core as mx

from brisk.kernels.fused_attention import attend
from brisk.kernels.native_attention import MAX_ROWS as NATIVE_KERNEL_MAX_ROWS
from brisk.kernels.native_attention import NativeUnsupported, quantized_attention_native
from brisk.kernels.native_attention import available as native_available

# Above this many score elements (B·Hq·L·S) the split path bounds memory.
DEFAULT_MAX_SCORE_ELEMENTS = 1 << 22
# Keys per block in the split path: large enough to amortize per-block dispatch.
DEFAULT_KEY_BLOCK = 4096
# Query rows per KV head up to which the fused quantized matmul beats dequantize + BLAS
# on the CPU (measured crossover between 3 and 6 rows at 4096 keys).
FUSED_MAX_ROWS = 4
# Query rows per KV head up to which the native CPU kernel takes the step (decode and
# speculative verify; its limit): it reads each packed row once for all of them. Verify
# passes of 3-9 tokens on a GQA-7 model (21-63 rows) ran 3-6x faster there than on the
# portable paths (Qwen-0.5B shapes, 2K and 8K keys).
NATIVE_MAX_ROWS = NATIVE_KERNEL_MAX_ROWS

Packed = tuple[mx.array, mx.array, mx.array]  # (packed uint32, scales, biases)


def _dequantize(packed: Packed, group_size: int, bits: int, dtype=mx.float32) -> mx.array:
    # mx.dequantize computes in the scales' dtype: upcast float16 scales/biases first
    # (they are 1/16 the size of the data, so this is cheap).
    weights, scales, biases = packed
    return mx.dequantize(weights, scales.astype(dtype), biases.astype(dtype), group_size=group_size, bits=bits)


def _mask_as_additive(mask, q_len: int, k_len: int, dtype) -> mx.array | None:
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unknown mask {mask!r}")
        q_pos = mx.arange(k_len - q_len, k_len)[:, None]
        mask = q_pos >= mx.arange(k_len)[None]  # (L, S)
    if mask.dtype == mx.bool_:
        return mx.where(mask, mx.array(0.0, dtype), mx.array(mx.finfo(dtype).min, dtype))
    return mask.astype(dtype)


def quantized_attention_reference(
    queries, q_keys: Packed, q_values: Packed, *, scale: float, mask=None, group_size: int = 32, bits: int = 4
) -> mx.array:
    keys = _dequantize(q_keys, group_size, bits)  # (B, Hkv, S, D)
    values = _dequantize(q_values, group_size, bits)
    rep = queries.shape[1] // keys.shape[1]
    keys, values = mx.repeat(keys, rep, axis=1), mx.repeat(values, rep, axis=1)  # (B, Hq, S, D)
    scores = (queries.astype(mx.float32) * scale) @ keys.astype(mx.float32).swapaxes(-1, -2)
    additive = _mask_as_additive(mask, queries.shape[2], keys.shape[2], mx.float32)
    if additive is not None:
        scores = scores + additive
    return (mx.softmax(scores, axis=-1) @ values.astype(mx.float32)).astype(queries.dtype)


def _fold(queries, n_kv: int):
    """(B, Hq, L, D) -> (B, Hkv, rep·L, D): query heads sharing a KV head become rows."""
    b, hq, length, d = queries.shape
    return queries.reshape(b, n_kv, (hq // n_kv) * length, d)


def _folded_mask(mask, queries, k_len: int, n_kv: int, dtype):
    """The additive mask laid out like the folded rows: (B|1, Hkv|1, rep·L, S)."""
    additive = _mask_as_additive(mask, queries.shape[2], k_len, dtype)
    if additive is None:
        return None
    b, hq, length, _ = queries.shape
    rep = hq // n_kv
    while additive.ndim < 4:
        additive = additive[None]
    if additive.shape[1] == 1:  # shared by all heads: repeat rows per folded head
        rows = mx.broadcast_to(additive[:, :, None], (additive.shape[0], 1, rep, length, k_len))
        return rows.reshape(additive.shape[0], 1, rep * length, k_len)
    per_head = mx.broadcast_to(additive, (additive.shape[0], hq, length, k_len))
    return per_head.reshape(additive.shape[0], n_kv, rep * length, k_len)


def quantized_attention_single(
    queries, q_keys: Packed, q_values: Packed, *, scale: float, mask=None, group_size: int = 32, bits: int = 4
) -> mx.array:
    b, hq, length, _ = queries.shape
    n_kv, k_len = q_keys[0].shape[1], q_keys[0].shape[2]
    rows = _fold(queries * scale, n_kv)
    scores = mx.quantized_matmul(rows, *q_keys, transpose=True, group_size=group_size, bits=bits)
    additive = _folded_mask(mask, queries, k_len, n_kv, scores.dtype)
    if additive is not None:
        scores = scores + additive
    probs = mx.softmax(scores, axis=-1, precise=True)  # (B, Hkv, rep·L, S)
    out = mx.quantized_matmul(probs, *q_values, transpose=False, group_size=group_size, bits=bits)
    return out.reshape(b, hq, length, out.shape[-1])


def quantized_attention_split(
    queries,
    q_keys: Packed,
    q_values: Packed,
    *,
    scale: float,
    mask=None,
    group_size: int = 32,
    bits: int = 4,
    block: int = DEFAULT_KEY_BLOCK,
) -> mx.array:
    b, hq, length, _ = queries.shape
    n_kv, k_len = q_keys[0].shape[1], q_keys[0].shape[2]
    rows = _fold(queries * scale, n_kv)
    additive = _folded_mask(mask, queries, k_len, n_kv, rows.dtype)
    running: tuple[mx.array, mx.array, mx.array] | None = None  # max, sum, output so far
    for start in range(0, k_len, block):
        stop = min(start + block, k_len)
        scores = mx.quantized_matmul(
            rows, *_key_block(q_keys, start, stop), transpose=True, group_size=group_size, bits=bits
        )
        if additive is not None:
            scores = scores + additive[..., start:stop]
        block_max = scores.max(axis=-1, keepdims=True)
        new_max = block_max if running is None else mx.maximum(running[0], block_max)
        probs = mx.exp(scores - new_max)
        partial = mx.quantized_matmul(
            probs, *_key_block(q_values, start, stop), transpose=False, group_size=group_size, bits=bits
        )
        if running is None:
            running = (new_max, probs.sum(axis=-1, keepdims=True), partial)
        else:
            correction = mx.exp(running[0] - new_max)  # rescale what earlier blocks summed
            total = running[1] * correction + probs.sum(axis=-1, keepdims=True)
            running = (new_max, total, running[2] * correction + partial)
    if running is None:
        raise ValueError("attention over no keys")
    out = running[2] / running[1]
    return out.reshape(b, hq, length, out.shape[-1])


def _key_block(packed: Packed, start: int, stop: int) -> Packed:
    """Keys (or values) [start, stop) of a packed layout."""
    data, scales, biases = packed
    return data[..., start:stop, :], scales[..., start:stop, :], biases[..., start:stop, :]


def quantized_attention_dequantized(
    queries, q_keys: Packed, q_values: Packed, *, scale: float, mask=None, group_size: int = 32, bits: int = 4
) -> mx.array:
    keys = _dequantize(q_keys, group_size, bits, queries.dtype)  # (B, Hkv, S, D), this layer only
    values = _dequantize(q_values, group_size, bits, queries.dtype)
    return attend(queries, keys, values, scale=scale, mask=mask)


def quantized_attention(
    queries,
    q_keys: Packed,
    q_values: Packed,
    *,
    scale: float,
    mask=None,
    group_size: int = 32,
    bits: int = 4,
    max_score_elements: int = DEFAULT_MAX_SCORE_ELEMENTS,
    fused_max_rows: int = FUSED_MAX_ROWS,
    native: bool = True,
) -> mx.array:
    """Pick the path: the native kernel for decode-like steps on the CPU; else fused (one
    pass while the scores are small, split keys beyond); dequantize + SDPA for many rows."""
    b, hq, length, _ = queries.shape
    n_kv, k_len = q_keys[0].shape[1], q_keys[0].shape[2]
    kwargs = dict(scale=scale, mask=mask, group_size=group_size, bits=bits)
    if native and (hq // n_kv) * length <= NATIVE_MAX_ROWS and mx.default_device() == mx.cpu and native_available():
        try:
            return quantized_attention_native(queries, q_keys, q_values, **kwargs)
        except NativeUnsupported:
            pass  # a mask array or an unusual shape: the portable paths below
    if (hq // n_kv) * length > fused_max_rows:
        return quantized_attention_dequantized(queries, q_keys, q_values, **kwargs)
    if b * hq * length * k_len <= max_score_elements:
        return quantized_attention_single(queries, q_keys, q_values, **kwargs)
    return quantized_attention_split(queries, q_keys, q_values, **kwargs)
