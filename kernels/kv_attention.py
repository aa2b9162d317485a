"""Attention over a KV cache whose keys and values may each be dense or packed
(kernels/packed_kv.py: per-token groups, or KIVI's per-channel keys with dense recent rows).

- `kv_attention_reference`: dequantize both, then plain softmax attention (the oracle).
- `kv_attention_fused`: few query rows (decode, verify) on any backend: the scores of
  each part of the keys come from `mx.quantized_matmul` on the packed data (channel-packed
  keys are stored so that q·Kᵀ is a plain transpose=False product), so no full-precision K
  or V is made; GQA query heads are folded into matmul rows.
- `kv_attention_dequantized`: many rows (prefill chunks): dequantize this layer's K/V
  transiently and attend with the fused float kernel on the CPU (kernels/fused_attention.py),
  else MLX's SDPA (the fused matmul is the wrong tool for many rows on the CPU; see
  quantized_attention.py).
- `kv_attention`: the dispatcher. On the CPU, decode-like steps go to the native kernel
  (kernels/native_attention.py) when it can be had.

Shapes and masks as in quantized_attention.py: queries (B, Hq, L, D); masks None, "causal"
(queries are the last L of the S positions) or an array broadcastable to (B, Hq, L, S).
"""

from __future__ import annotations

import mlx.core as mx

from brisk.kernels.fused_attention import attend
from brisk.kernels.native_attention import NativeUnsupported, kv_attention_native
from brisk.kernels.native_attention import available as native_available
from brisk.kernels.packed_kv import ChannelPacked, Dense, KVLayout, TokenPacked
from brisk.kernels.quantized_attention import FUSED_MAX_ROWS, NATIVE_MAX_ROWS, _fold, _folded_mask, _mask_as_additive


def _select_by_row(packed: mx.array | None, dense: mx.array | None, keys: ChannelPacked, limits: list[int]):
    """Scores against packed keys (…, rows, P) and dense recent keys (…, rows, R) -> (…, rows,
    S): key j of row r from the packed scores when j < limits[r], else from the dense ones."""
    if packed is None or dense is None:  # one part only (a step reads at least one)
        return dense if packed is None else packed
    length, first = keys.length, keys.recent_from
    if len(set(limits)) == 1:  # one boundary for every row: just join the two parts there
        cut = limits[0]
        return mx.concatenate([packed[..., :cut], dense[..., cut - first :]], axis=-1)
    lead = packed.shape[:-1]
    packed = mx.concatenate([packed, mx.zeros((*lead, length - packed.shape[-1]), packed.dtype)], axis=-1)
    dense = mx.concatenate([mx.zeros((*lead, first), dense.dtype), dense], axis=-1)
    take_packed = mx.arange(length)[None] < mx.array(limits)[:, None]  # (rows, S)
    return mx.where(take_packed, packed, dense)


def _scores(rows: mx.array, keys: KVLayout, limits: list[int] | None = None) -> mx.array:
    """rows (B, Hkv, R, D) · keysᵀ -> (B, Hkv, R, S), reading packed keys in place;
    `limits` gives each row's packed limit for channel-packed keys."""
    dtype = rows.dtype
    if isinstance(keys, Dense):
        return rows @ keys.array.astype(dtype).swapaxes(-1, -2)
    if isinstance(keys, TokenPacked):
        return mx.quantized_matmul(
            rows,
            keys.data,
            keys.scales.astype(dtype),
            keys.biases.astype(dtype),
            transpose=True,
            group_size=keys.group,
            bits=keys.bits,
        )
    packed = dense = None
    if keys.packed:
        packed = mx.quantized_matmul(
            rows,
            keys.data,
            keys.scales.astype(dtype),
            keys.biases.astype(dtype),
            transpose=False,
            group_size=32,
            bits=keys.bits,
        )
    if keys.recent is not None and keys.recent.shape[2]:
        dense = rows @ keys.recent.astype(dtype).swapaxes(-1, -2)
    return _select_by_row(packed, dense, keys, limits or [keys.recent_from] * rows.shape[-2])


def _folded_limits(keys: KVLayout, rep: int, length: int) -> list[int] | None:
    """Each folded row's packed limit (rows are query heads sharing a KV head, then positions)."""
    return keys.row_limits(length) * rep if isinstance(keys, ChannelPacked) else None


def kv_attention_reference(queries, keys: KVLayout, values: KVLayout, *, scale: float, mask=None) -> mx.array:
    b, hq, length, _ = queries.shape
    n_kv = values.heads
    v = mx.repeat(values.dequantize(), hq // n_kv, axis=1)
    outputs = []
    for head in range(hq):  # plainly, one query head at a time against its KV head
        kv = head // (hq // n_kv)
        q = queries[:, head : head + 1].astype(mx.float32) * scale  # (B, 1, L, D)
        if isinstance(keys, ChannelPacked):
            rows = [
                q[:, :, i : i + 1] @ keys.dequantize(limit=lim)[:, kv : kv + 1].swapaxes(-1, -2)
                for i, lim in enumerate(keys.row_limits(length))
            ]
            scores = mx.concatenate(rows, axis=2)
        else:
            scores = q @ keys.dequantize()[:, kv : kv + 1].swapaxes(-1, -2)
        outputs.append(scores)
    scores = mx.concatenate(outputs, axis=1)
    additive = _mask_as_additive(mask, length, scores.shape[-1], mx.float32)
    if additive is not None:
        scores = scores + additive
    return (mx.softmax(scores, axis=-1) @ v).astype(queries.dtype)


def _weighted_values(probs: mx.array, values: KVLayout) -> mx.array:
    dtype = probs.dtype
    if isinstance(values, TokenPacked):
        return mx.quantized_matmul(
            probs,
            values.data,
            values.scales.astype(dtype),
            values.biases.astype(dtype),
            transpose=False,
            group_size=values.group,
            bits=values.bits,
        )
    return probs @ values.dequantize(dtype)


def kv_attention_fused(queries, keys: KVLayout, values: KVLayout, *, scale: float, mask=None) -> mx.array:
    b, hq, length, _ = queries.shape
    n_kv = values.heads
    rows = _fold(queries.astype(mx.float32) * scale, n_kv)
    scores = _scores(rows, keys, _folded_limits(keys, hq // n_kv, length))
    additive = _folded_mask(mask, queries, scores.shape[-1], n_kv, scores.dtype)
    if additive is not None:
        scores = scores + additive
    probs = mx.softmax(scores, axis=-1, precise=True)
    out = _weighted_values(probs, values)
    return out.reshape(b, hq, length, out.shape[-1]).astype(queries.dtype)


def kv_attention_dequantized(queries, keys: KVLayout, values: KVLayout, *, scale: float, mask=None) -> mx.array:
    """Every row must read the keys alike (channel-packed keys without per-row limits)."""
    if isinstance(keys, ChannelPacked):
        if keys.varies_by_row():
            raise ValueError("rows with their own packed limits need the fused path")
        k = keys.dequantize(queries.dtype, limit=keys.row_limits(1)[0])
    else:
        k = keys.dequantize(queries.dtype)
    v = values.dequantize(queries.dtype)
    return attend(queries, k, v, scale=scale, mask=mask)


def kv_attention(
    queries, keys: KVLayout, values: KVLayout, *, scale: float, mask=None, native: bool = True
) -> mx.array:
    """The native kernel for decode-like steps on the CPU; fused matmuls for a few rows
    elsewhere; dequantize + SDPA for many rows."""
    rows = queries.shape[1] // values.heads * queries.shape[2]
    if native and rows <= NATIVE_MAX_ROWS and mx.default_device() == mx.cpu and native_available():
        try:
            return kv_attention_native(queries, keys, values, scale=scale, mask=mask)
        except NativeUnsupported:
            pass  # a mask array or an unusual shape: the portable paths below
    by_row = isinstance(keys, ChannelPacked) and keys.varies_by_row()
    if rows > FUSED_MAX_ROWS and not by_row:
        return kv_attention_dequantized(queries, keys, values, scale=scale, mask=mask)
    return kv_attention_fused(queries, keys, values, scale=scale, mask=mask)


__all__ = [
    "ChannelPacked",
    "Dense",
    "TokenPacked",
    "kv_attention",
    "kv_attention_dequantized",
    "kv_attention_fused",
    "kv_attention_reference",
]
