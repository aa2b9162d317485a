"""The unpacked KV cache in float16, as llama.cpp keeps it by default.

On the CPU Brisk computes in float32 (the native kernels' output), and mlx-lm's caches
store keys and values in the dtype they arrive in: twice llama.cpp's bytes per token. A
decode step streams the whole cache through attention, so at long context those bytes are
what a step waits on (SmolLM2 at 2K keys: ~94 MB of float32 K/V a token, more than its
4-bit weights), and they bound how long a document fits in memory.

- `HalfKVCache` / `HalfRotatingKVCache`: mlx-lm's caches that store float32 keys and values
  as float16 (other dtypes as they come: a bfloat16 model on Metal keeps its own range).
  The fused attention kernel reads the float16 rows as they are (kernels/fused_attention.py);
  MLX's SDPA, where the kernel does not take a call, promotes them.
- `make_layers(model)`: mlx-lm's `make_prompt_cache` with the plain caches swapped for these.
- `float32_kv()`: caches made inside it keep float32 (the benchmarks' A/B partner).

Rounding K/V to float16 moves a logit by ~1e-3 (tests/engine/test_half_kv.py measures it).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import mlx.core as mx
from mlx_lm.models import cache as mlx_lm_cache
from mlx_lm.models.cache import KVCache, RotatingKVCache

STORED_ITEMSIZE = 2  # bytes per unpacked key or value element, for estimates before a cache exists


def _stored(keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
    if keys.dtype == mx.float32:
        return keys.astype(mx.float16), values.astype(mx.float16)
    return keys, values


class HalfKVCache(KVCache):
    """mlx-lm's KVCache holding float32 keys and values as float16."""

    def update_and_fetch(self, keys, values):
        return super().update_and_fetch(*_stored(keys, values))


class HalfRotatingKVCache(RotatingKVCache):
    """mlx-lm's sliding-window cache holding float32 keys and values as float16."""

    def update_and_fetch(self, keys, values):
        return super().update_and_fetch(*_stored(keys, values))


# mlx-lm's load_prompt_cache rebuilds caches by class name from its own module.
for _cls in (HalfKVCache, HalfRotatingKVCache):
    setattr(mlx_lm_cache, _cls.__name__, _cls)

DENSE_CACHES = (KVCache, HalfKVCache)  # unpacked, unbounded: what a packed cache is made from


class _Switch:
    half = True


SWITCH = _Switch()


@contextmanager
def float32_kv() -> Iterator[None]:
    """Caches made inside this block store keys and values as computed (float32 on the CPU)."""
    before, SWITCH.half = SWITCH.half, False
    try:
        yield
    finally:
        SWITCH.half = before


def _halved(layer):
    if type(layer) is KVCache:
        return HalfKVCache()
    if type(layer) is RotatingKVCache and layer.offset == 0:
        return HalfRotatingKVCache(max_size=layer.max_size, keep=layer.keep)
    return layer


def make_layers(model) -> list:
    """A fresh prompt cache for `model`: plain layers store float16 unless `float32_kv()`."""
    layers = mlx_lm_cache.make_prompt_cache(model)
    return [_halved(layer) for layer in layers] if SWITCH.half else layers
