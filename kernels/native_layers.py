"""Swap a loaded model's layers for ones that run on the native CPU kernels.

`use_native_layers(model)` replaces, without copying a weight:
- float `nn.Linear` / `nn.Embedding` by SkinnyLinear / SkinnyEmbedding (few-row float32
  products: the speculative verify pass; kernels/skinny_matmul.py);
- `nn.QuantizedLinear` / `nn.QuantizedEmbedding` by their native versions (every quantized
  product, the lookup and a tied head; kernels/quantized_matmul.py);
- `nn.RMSNorm`, `nn.RoPE` and mlx-lm's `Llama3RoPE` by one-node native versions (MLX's CPU
  runs them as graphs of ~11 and ~30 small ops; kernels/norm_rope.py).
All of a model's swapped layers share one `Route`: data on the model, so two models can
differ and a benchmark can send one model to MLX's own paths (`blas_only`).
"""

from __future__ import annotations

from contextlib import contextmanager

import mlx.nn as nn
from mlx.utils import tree_map_with_path
from mlx_lm.models.rope_utils import Llama3RoPE

from brisk.kernels import ctypes_library
from brisk.kernels.norm_rope import NativeLlama3RoPE, NativeRMSNorm, NativeRoPE
from brisk.kernels.quantized_matmul import NativeQuantizedEmbedding, NativeQuantizedLinear
from brisk.kernels.skinny_matmul import SkinnyEmbedding, SkinnyLinear


class Route:
    """Whether one model's swapped layers use the native kernels: data on the model (set by
    `use_native_layers`), not a process-wide switch, so two models can differ."""

    def __init__(self):
        self.native = True


ROUTE_ATTRIBUTE = "_brisk_matmul_route"


def route_of(model) -> Route | None:
    return getattr(model, ROUTE_ATTRIBUTE, None)


@contextmanager
def blas_only(*models):
    """The models' swapped layers use MLX's own paths inside this block (the benchmarks' A/B)."""
    routes = [r for r in map(route_of, models) if r is not None]
    before = [r.native for r in routes]
    for r in routes:
        r.native = False
    try:
        yield
    finally:
        for r, was in zip(routes, before):
            r.native = was


def verify_path(model) -> str:
    """Which path `model`'s few-row float32 products take now: "native" or "blas"."""
    route = route_of(model)
    return "native" if route is not None and route.native and ctypes_library.load() is not None else "blas"


SWAPS = {
    nn.Linear: SkinnyLinear,
    nn.Embedding: SkinnyEmbedding,
    nn.QuantizedLinear: NativeQuantizedLinear,
    nn.QuantizedEmbedding: NativeQuantizedEmbedding,
    nn.RMSNorm: NativeRMSNorm,
    nn.RoPE: NativeRoPE,
    Llama3RoPE: NativeLlama3RoPE,
}


def _swap(module: nn.Module, cls: type[nn.Module], route: Route) -> nn.Module:
    # A module of the subclass holding the same arrays and state (no copy of the weights).
    fresh = cls.__new__(cls)
    fresh.__dict__.update(module.__dict__)
    fresh.__dict__["_route"] = route  # a plain attribute, not a parameter or child module
    dict.update(fresh, module)
    return fresh


def use_native_layers(model: nn.Module) -> int:
    """Swap the model's layers for the native ones; returns how many were swapped.

    Does nothing (returns 0) when the kernels cannot be had: MLX's own paths stay.
    """
    if ctypes_library.load() is None:
        return 0
    swapped = 0
    route = Route()

    def swap(_path, module):
        nonlocal swapped
        cls = SWAPS.get(type(module))
        if cls is None:
            return module
        swapped += 1
        return _swap(module, cls, route)

    model.update_modules(tree_map_with_path(swap, model.leaf_modules(), is_leaf=nn.Module.is_module))
    object.__setattr__(model, ROUTE_ATTRIBUTE, route)
    return swapped
