"""How keys and values are held in a packed KV cache, and how each layout is packed and read.

Three layouts, each for a (B, H, S, D) tensor of keys or values:
- `Dense`: the array itself (16-bit KV, or a part that is not packed).
- `TokenPacked`: each token's D channels in groups of `group` (mx.quantize's layout along
  the last axis). Good for values: a token's values are used together.
- `ChannelPacked`: keys as KIVI (Liu et al., 2024) packs them. Each channel is quantized
  over groups of `TOKEN_GROUP` tokens, so an outlier channel (Qwen2 has several) gets its
  own scale and bias instead of stretching the grid of every channel beside it. The packed
  integers are stored channel-major, (B, H, D, tokens), exactly as mx.quantize packs the
  transposed keys, so q·Kᵀ is one `mx.quantized_matmul(q, ..., transpose=False)`. Tokens
  that do not yet fill a group stay `recent`: dense float16 rows after the packed ones.

Scales and biases are float16 whatever the activation dtype (5 bits per element at int4,
group 32).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

TOKEN_GROUP = 32  # tokens per group of a channel-packed key (one tile of the native kernel)
SCALE_DTYPE = mx.float16


def _pack(x: mx.array, group: int, bits: int) -> tuple[mx.array, mx.array, mx.array]:
    """Affine-quantize `x` in groups of `group` along its last axis (mx.quantize: one fused
    op, which matters once per layer per decode step), scales and biases stored float16."""
    data, scales, biases = mx.quantize(x, group_size=group, bits=bits)
    return data, scales.astype(SCALE_DTYPE), biases.astype(SCALE_DTYPE)


def _unpack(data, scales, biases, group: int, bits: int, dtype) -> mx.array:
    return mx.dequantize(data, scales.astype(dtype), biases.astype(dtype), group_size=group, bits=bits)


@dataclass(frozen=True)
class Dense:
    array: mx.array  # (B, H, S, D)

    @property
    def length(self) -> int:
        return self.array.shape[2]

    @property
    def heads(self) -> int:
        return self.array.shape[1]

    def dequantize(self, dtype=mx.float32) -> mx.array:
        return self.array.astype(dtype)


@dataclass(frozen=True)
class TokenPacked:
    data: mx.array  # (B, H, S, D·bits/32) uint32
    scales: mx.array  # (B, H, S, D/group)
    biases: mx.array
    bits: int
    group: int

    @classmethod
    def pack(cls, x: mx.array, *, bits: int, group: int) -> "TokenPacked":
        return cls(*_pack(x, group, bits), bits, group)

    @property
    def length(self) -> int:
        return self.data.shape[2]

    @property
    def heads(self) -> int:
        return self.data.shape[1]

    def dequantize(self, dtype=mx.float32) -> mx.array:
        return _unpack(self.data, self.scales, self.biases, self.group, self.bits, dtype)


@dataclass(frozen=True)
class ChannelPacked:
    data: mx.array  # (B, H, D, P·bits/32) uint32 for the first P tokens (P a multiple of TOKEN_GROUP)
    scales: mx.array  # (B, H, D, P/TOKEN_GROUP)
    biases: mx.array
    bits: int
    recent: mx.array | None  # (B, H, R, D) dense keys of tokens recent_from .. recent_from + R
    recent_from: int = 0  # <= P: the last packed groups may be held both ways
    # Per query row (the last L positions): keys before the limit are read packed, the rest
    # dense. None: every row reads packed keys up to recent_from. Rows of one verify pass
    # thus see each key exactly as a one-token decode step at their position would.
    limits: tuple[int, ...] | None = None

    @classmethod
    def pack(cls, keys: mx.array, *, bits: int, recent: mx.array | None = None) -> "ChannelPacked":
        """Pack (B, H, P, D) keys, P a multiple of TOKEN_GROUP; `recent` rows follow them."""
        return cls(*_pack(keys.swapaxes(-1, -2), TOKEN_GROUP, bits), bits, recent, keys.shape[2])

    @property
    def packed(self) -> int:
        return self.scales.shape[-1] * TOKEN_GROUP

    @property
    def length(self) -> int:
        return self.recent_from + (0 if self.recent is None else self.recent.shape[2])

    @property
    def heads(self) -> int:
        return self.data.shape[1]

    def row_limits(self, rows: int) -> list[int]:
        return list(self.limits) if self.limits is not None else [self.recent_from] * rows

    def dequantize_packed(self, dtype=mx.float32) -> mx.array:
        return _unpack(self.data, self.scales, self.biases, TOKEN_GROUP, self.bits, dtype).swapaxes(-1, -2)

    def dequantize(self, dtype=mx.float32, limit: int | None = None) -> mx.array:
        """The keys as a row with this packed `limit` (default recent_from) reads them."""
        limit = self.recent_from if limit is None else limit
        parts = [self.dequantize_packed(dtype)[..., :limit, :]] if limit else []
        if self.recent is not None and self.length > limit:
            parts.append(self.recent[..., limit - self.recent_from :, :].astype(dtype))
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)

    def varies_by_row(self) -> bool:
        return self.limits is not None and len(set(self.limits)) > 1


KVLayout = Dense | TokenPacked | ChannelPacked
