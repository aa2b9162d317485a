"""Position-mapped RoPE: run a model at positions other than its cache offset.

Sparse prefill stores only some prompt tokens in the KV cache, so a token's slot in the
cache (`cache.offset`) is not its position in the text. SpecPrefill drops the same tokens
in every layer (one shift for the model); UniPrefill drops them from a layer on, so each
layer has its own shift, and while it prefills, the survivors of a drop are no longer
contiguous: the wrappers then take one position per token. mlx-lm's attention layers call
`self.rope(x, offset=cache.offset)`; every RoPE module gets wrapped so that its offset
is shifted by the amount set for the current call. Every variant mlx-lm builds (nn.RoPE
with `traditional`/`scale`, Llama3, YaRN, SuScaled, ...) takes `(x, offset)` and applies
its own frequencies, so all of them map positions the same way, with no frequency math
copied here. The shift is a `PositionShift` object of that model (its wrappers share it),
set only inside `position_shift(model, delta)`; at 0 (the default) the wrappers are an
exact pass-through, and two models never see each other's shift.

A model whose positions live somewhere we cannot map is detected, not skipped:
`install_position_shift` raises when it finds no RoPE module although the model's source
uses RoPE (a silently unmapped position was a reported bug in another implementation).
Attention without positional encoding (e.g. nemotron-h's hybrid layers) needs no mapping.
"""

from __future__ import annotations

import inspect
import re
import sys
from contextlib import contextmanager
from typing import Iterator

import mlx.nn as nn
from mlx_lm.models import rope_utils

SHIFT_ATTRIBUTE = "_brisk_position_shift"


class PositionShift:
    """What one model's wrapped RoPEs add to their offset now: `delta` for every layer,
    `layer_deltas[i]` more for layer i; or, when `positions` is set, each token's own
    position (an int32 array, one per query row)."""

    def __init__(self):
        self.delta = 0
        self.layer_deltas: list[int] | None = None
        self.positions = None


class ShiftedRoPE(nn.Module):
    def __init__(self, rope: nn.Module, shift: PositionShift, layer: int | None = None):
        super().__init__()
        self.rope = rope
        object.__setattr__(self, "_shift", shift)  # shared state, not a parameter or child module
        object.__setattr__(self, "_layer", layer)

    def __call__(self, x, offset=0, **kwargs):
        shift = self._shift
        if shift.positions is not None:
            # One position per token: each row becomes its own batch entry of length 1,
            # whose offset (MLX's per-batch RoPE offset) is that token's position.
            rows = x.swapaxes(0, 2)  # (B=1, H, L, D) -> (L, H, 1, D)
            return self.rope(rows, offset=shift.positions, **kwargs).swapaxes(0, 2)
        delta = shift.delta
        if shift.layer_deltas is not None and self._layer is not None and self._layer < len(shift.layer_deltas):
            delta += shift.layer_deltas[self._layer]
        return self.rope(x, offset=offset + delta, **kwargs)


def _is_rope(module) -> bool:
    # kernels/native_layers.py swaps in subclasses (NativeRoPE, NativeLlama3RoPE)
    return isinstance(module, nn.RoPE) or any(c.__module__ == rope_utils.__name__ for c in type(module).__mro__)


ROPE_IN_SOURCE = re.compile(r"\brope\b|initialize_rope|RoPE|rotary")


def _defining_module(cls) -> str:
    """Where a layer class comes from, past Brisk's native subclasses (kernels/native_layers.py)."""
    return next((c.__module__ for c in cls.__mro__ if not c.__module__.startswith("brisk.kernels.")), cls.__module__)


def _source_uses_rope(model) -> bool:
    modules = {_defining_module(type(m)) for _, m in model.named_modules()}
    for name in modules:
        try:
            if ROPE_IN_SOURCE.search(inspect.getsource(sys.modules[name])):
                return True
        except (KeyError, OSError, TypeError):
            return True  # cannot tell: assume positions matter
    return False


LAYER_PATH = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def install_position_shift(model) -> int:
    """Wrap every RoPE module of `model` once; returns how many are wrapped. Each wrapper
    knows its layer (from its path, `...layers.<i>...`), or None when it sits outside them."""
    if getattr(model, "_brisk_rope_count", None) is not None:
        return model._brisk_rope_count
    shift = PositionShift()
    count = 0
    for path, module in model.named_modules():
        for key, child in list(module.items()):
            if _is_rope(child):
                match = LAYER_PATH.search(f"{path}.{key}")
                setattr(module, key, ShiftedRoPE(child, shift, int(match.group(1)) if match else None))
                count += 1
    if count == 0 and _source_uses_rope(model):
        raise NotImplementedError(
            f"{type(model).__module__}: no RoPE module found to map positions; sparse prefill would "
            "place kept tokens at wrong positions"
        )
    model._brisk_rope_count = count
    object.__setattr__(model, SHIFT_ATTRIBUTE, shift)
    return count


@contextmanager
def token_positions(model, positions) -> Iterator[None]:
    """Within the block, `model`'s wrapped RoPEs place query row i at `positions[i]`."""
    shift = getattr(model, SHIFT_ATTRIBUTE)
    previous, shift.positions = shift.positions, positions
    try:
        yield
    finally:
        shift.positions = previous


@contextmanager
def position_shift(model, delta: int, layer_deltas: list[int] | None = None) -> Iterator[None]:
    """Within the block, `model`'s wrapped RoPEs see `offset + delta` (a model never
    wrapped has no positions to map: `delta` must then be 0)."""
    shift = getattr(model, SHIFT_ATTRIBUTE, None)
    if shift is None:
        if delta or any(layer_deltas or ()):
            raise RuntimeError("position_shift on a model whose RoPEs were never wrapped (install_position_shift)")
        yield
        return
    previous = shift.delta, shift.layer_deltas
    shift.delta, shift.layer_deltas = int(delta), layer_deltas
    try:
        yield
    finally:
        shift.delta, shift.layer_deltas = previous


class ShiftedModel:
    """A callable that runs `model` with a fixed position shift, per layer when
    `layer_deltas` is given (for mlx-lm's generate_step, which calls
    `model(tokens, cache=...)` lazily from inside a generator)."""

    def __init__(self, model, delta: int, layer_deltas: list[int] | None = None):
        self.model, self.delta, self.layer_deltas = model, delta, layer_deltas

    def __call__(self, *args, **kwargs):
        with position_shift(self.model, self.delta, self.layer_deltas):
            return self.model(*args, **kwargs)
