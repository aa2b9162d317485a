"""SwiGLU's activation on the CPU by a native kernel (kernels/csrc/activation.cpp).

mlx-lm's `swiglu(gate, x)` = silu(gate) * x is a compiled MLX graph whose CPU code pays a
scalar exp and a libm fmaf call per element (~15 ns): in a 512-token prefill chunk of
Qwen-1.5B that is 28 x 512 x 8960 elements, a fifth of the chunk. The kernel computes it with
the vectorized exp the attention kernel uses, over the kernels' threads.

- `swiglu_reference`: mlx-lm's own function, the definition.
- `swiglu_native`: the kernel, a lazy MLX primitive; raises NativeUnsupported for what it does
  not take (no primitives module, not float32, gate and x of different shapes).
- `swiglu`: a drop-in for mlx-lm's function, which llama, qwen2, qwen3 and most other model
  modules import by name; `use_native_activation(model)` rebinds it in the model's modules.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import mlx.core as mx
from mlx_lm.models import activations as mlx_lm_activations

from brisk.kernels import mlx_extension
from brisk.kernels.native_attention import NativeUnsupported, threads

MLX_LM_SWIGLU = mlx_lm_activations.swiglu


class _Switch:
    native = True


SWITCH = _Switch()  # process-wide: the rebound name is shared by every model of an architecture


def swiglu_reference(gate: mx.array, x: mx.array) -> mx.array:
    return MLX_LM_SWIGLU(gate, x)


def swiglu_native(gate: mx.array, x: mx.array) -> mx.array:
    primitives = mlx_extension.load()
    if primitives is None:
        raise NativeUnsupported(mlx_extension.unavailable_reason())
    if gate.dtype != mx.float32 or x.dtype != mx.float32 or gate.shape != x.shape:
        raise NativeUnsupported("the native SwiGLU takes float32 gate and x of one shape")
    return primitives.swiglu(gate, x, threads())


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's swiglu, computed by the kernel on the CPU where it takes the call."""
    if SWITCH.native and mx.default_device() == mx.cpu:
        try:
            return swiglu_native(gate, x)
        except NativeUnsupported:
            pass
    return MLX_LM_SWIGLU(gate, x)


def use_native_activation(model) -> int:
    """Rebind mlx-lm's swiglu in the modules `model`'s layers come from; returns how many
    modules now use the kernel (0 when the primitives cannot be had)."""
    if mlx_extension.load() is None:
        return 0
    rebound = 0
    for name in {type(m).__module__ for _, m in model.named_modules()}:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "swiglu", None) is MLX_LM_SWIGLU:
            setattr(module, "swiglu", swiglu)
        if getattr(module, "swiglu", None) is swiglu:
            rebound += 1
    return rebound


@contextmanager
def mlx_activation_only():
    """Every model's swiglu runs mlx-lm's own inside this block (A/B against the kernel)."""
    before, SWITCH.native = SWITCH.native, False
    try:
        yield
    finally:
        SWITCH.native = before
