"""RMSNorm and RoPE on the CPU as one native node each (kernels/csrc/norm_rope.cpp).

MLX's CPU runs `mx.fast.rms_norm` and `mx.fast.rope` as graphs of plain ops (about 11 and 30
nodes). A 30-layer model's decode step held ~2,500 of them, a few microseconds each: more
than its 4-bit weights took to read. The kernels follow MLX's arithmetic and agree with it
to a few ulp.

- `rms_norm_reference` / `rope_reference`: MLX's own ops, the definitions.
- `rms_norm_native` / `rope_native`: the kernels, lazy MLX primitives; raise
  NativeUnsupported for what they do not take (no primitives module, not float32, other
  ranks).
- `NativeRMSNorm`, `NativeRoPE`, `NativeLlama3RoPE`: the layers kernels/native_layers.py swaps in.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import Llama3RoPE

from brisk.kernels import mlx_extension
from brisk.kernels.native_attention import NativeUnsupported


def rms_norm_reference(x, weight, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, weight, eps)


def rope_reference(x, dims: int, *, traditional: bool, base, scale: float, offset, freqs=None) -> mx.array:
    return mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=offset, freqs=freqs)


def _primitives():
    primitives = mlx_extension.load()
    if primitives is None:
        raise NativeUnsupported(mlx_extension.unavailable_reason())
    return primitives


def rms_norm_native(x, weight, eps: float) -> mx.array:
    if x.dtype != mx.float32 or weight.dtype != mx.float32:
        raise NativeUnsupported("the native RMSNorm takes float32")
    try:
        return _primitives().rms_norm(x, weight, float(eps))
    except ValueError as declined:
        raise NativeUnsupported(str(declined)) from None


def rope_native(x, dims: int, *, traditional: bool, base, scale: float, offset, freqs=None) -> mx.array:
    """mx.fast.rope for float32 x of rank 3 or 4; `offset` an int or an integer array (one
    offset, or one per batch entry: sparse prefill's per-token positions)."""
    if isinstance(offset, bool) or not isinstance(offset, (int, mx.array)):
        raise NativeUnsupported(f"an offset of type {type(offset).__name__}")
    if x.dtype != mx.float32:
        raise NativeUnsupported("the native RoPE takes float32")
    start, offsets = (offset, None) if isinstance(offset, int) else (0, offset)
    try:
        return _primitives().rope(x, dims, traditional, float(base or 1.0), float(scale), start, offsets, freqs)
    except ValueError as declined:
        raise NativeUnsupported(str(declined)) from None


def _on_cpu(layer) -> bool:
    return layer._route.native and mx.default_device() == mx.cpu


class NativeRMSNorm(nn.RMSNorm):
    """nn.RMSNorm as one native node on the CPU."""

    def __call__(self, x):
        if _on_cpu(self):
            try:
                return rms_norm_native(x, self["weight"], self.eps)
            except NativeUnsupported:
                pass
        return super().__call__(x)


class NativeRoPE(nn.RoPE):
    """nn.RoPE as one native node on the CPU."""

    def __call__(self, x, offset=0):
        if _on_cpu(self):
            try:
                return rope_native(
                    x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale, offset=offset
                )
            except NativeUnsupported:
                pass
        return super().__call__(x, offset)


class NativeLlama3RoPE(Llama3RoPE):
    """mlx-lm's Llama3RoPE (its own frequency table) as one native node on the CPU."""

    def __call__(self, x, offset=0):
        if _on_cpu(self):
            try:
                return rope_native(
                    x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset, freqs=self._freqs
                )
            except NativeUnsupported:
                pass
        return super().__call__(x, offset)
