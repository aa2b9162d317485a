"""Float attention on the CPU by the fused native kernel (kernels/csrc/attention.cpp).

MLX's CPU attention materialises the scores and pays ~22 ns per exp: softmax was most of
prefill (shared/CPU.md), and a 2K-context decode step spent more in attention than in its
4-bit weights. The kernel streams keys and values in blocks with an online softmax.

- `attention_reference`: MLX's own `mx.fast.scaled_dot_product_attention`, the definition.
- `attention_native`: the kernel, a lazy MLX primitive; raises NativeUnsupported for what it
  does not take (a mask array, other dtypes, head dims not a multiple of 8 or over 256, no
  primitives module). Attention sinks (gpt-oss) it takes.
- `scaled_dot_product_attention`: a drop-in for mlx-lm's function of that name, which every
  mlx-lm model module imports; `use_fused_attention(model)` rebinds it in the model's modules.
  Packed (quantized) KV caches keep their own path (engine/kv/packed_cache.py).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import mlx.core as mx
from mlx_lm.models import base as mlx_lm_base

from brisk.kernels import mlx_extension
from brisk.kernels.coarse import COARSE
from brisk.kernels.native_attention import NativeUnsupported, threads

MLX_LM_SDPA = mlx_lm_base.scaled_dot_product_attention


class _Switch:
    native = True


SWITCH = _Switch()  # process-wide: the rebound name is shared by every model of an architecture


def attention_reference(queries, keys, values, *, scale: float, mask=None, sinks=None) -> mx.array:
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask, sinks=sinks)


def attention_native(queries, keys, values, *, scale: float, mask=None, sinks=None, length=None) -> mx.array:
    """softmax(q k^T * scale) v for float32 (B, H, L, D) queries and (B, Hkv, S, D) keys/values
    (float32, or float16 as a half-precision KV cache stores them); with `length` (an integer
    array, read when the graph runs) over the first `length` keys only."""
    primitives = mlx_extension.load()
    if primitives is None:
        raise NativeUnsupported(mlx_extension.unavailable_reason())
    if mask is not None and not (isinstance(mask, str) and mask == "causal"):
        raise NativeUnsupported("a mask array (sliding window, padding or sparse positions)")
    if queries.dtype != mx.float32 or keys.dtype != values.dtype or keys.dtype not in (mx.float32, mx.float16):
        raise NativeUnsupported("the fused attention takes float32 queries over float32 or float16 keys and values")
    try:
        return primitives.attention(
            queries, keys, values, float(scale), mask is not None, sinks, length, threads(), COARSE.active
        )
    except ValueError as declined:
        raise NativeUnsupported(str(declined)) from None


def attend(queries, keys, values, *, scale: float, mask=None) -> mx.array:
    """The kernel where it takes the call (the CPU, float32, a causal or no mask), else MLX's
    SDPA. For K/V dequantized from a packed cache (prefill chunks): with MLX's CPU SDPA, which
    materialises the scores and pays a slow exp, a packed cache read a 4K prompt in twice
    the time of a float one (Qwen-0.5B)."""
    if SWITCH.native and mx.default_device() == mx.cpu:
        try:
            return attention_native(queries, keys, values, scale=scale, mask=mask)
        except NativeUnsupported:
            pass
    return attention_reference(queries, keys, values, scale=scale, mask=mask)


def scaled_dot_product_attention(queries, keys, values, cache, scale: float, mask, sinks=None) -> mx.array:
    """mlx-lm's function, with float attention on the CPU sent to the fused kernel. A cache
    with a `length` (engine/decode/compiled.py's fixed buffers) counts only that many keys."""
    length = getattr(cache, "length", None)
    if SWITCH.native and not hasattr(cache, "bits") and mx.default_device() == mx.cpu:
        try:
            return attention_native(queries, keys, values, scale=scale, mask=mask, sinks=sinks, length=length)
        except NativeUnsupported:
            pass
    if length is not None:  # one query (the compiled decode step): the buffer's tail masked off
        if mask is not None:
            raise ValueError("a fixed-length cache takes one query at a time, with no mask")
        mask = mx.arange(keys.shape[2]) < length
    return MLX_LM_SDPA(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


def use_fused_attention(model) -> int:
    """Rebind mlx-lm's shared attention in the modules `model`'s layers come from; returns how
    many modules now call this module's. Under every plan: where the kernel cannot take a call
    (no primitives, `BRISK_KERNELS=off`, a GPU) it runs MLX's own SDPA, masking a compiled
    decode step's spare buffer positions (which mlx-lm's function would read)."""
    rebound = 0
    for name in {type(m).__module__ for _, m in model.named_modules()}:
        module = sys.modules.get(name)
        current = getattr(module, "scaled_dot_product_attention", None)
        if module is not None and current is MLX_LM_SDPA:
            setattr(module, "scaled_dot_product_attention", scaled_dot_product_attention)
        if getattr(module, "scaled_dot_product_attention", None) is scaled_dot_product_attention:
            rebound += 1
    return rebound


def attends_through_here(model) -> bool:
    """Whether every module of `model` that calls mlx-lm's attention calls this module's."""
    names = {type(m).__module__ for _, m in model.named_modules()}
    bound = [getattr(sys.modules.get(n), "scaled_dot_product_attention", None) for n in names]
    return all(f is None or f is scaled_dot_product_attention for f in bound) and any(bound)


@contextmanager
def mlx_attention_only():
    """Every model's float attention uses MLX's own inside this block (A/B against the kernel)."""
    before, SWITCH.native = SWITCH.native, False
    try:
        yield
    finally:
        SWITCH.native = before
