"""Temperature sampling on the CPU by the native kernel (kernels/csrc/sampling.cpp).

mlx-lm's temperature sampler draws Gumbel noise over the whole vocabulary, two logs per
entry at ~22 ns each on MLX's CPU: ~4.9 ms a token for Qwen's 152K vocabulary, about a
tenth of a 0.5B model's decode step at the app's default temperature. The kernel draws from
the same law, softmax(logits / t), by inverse CDF on one uniform number from MLX's random
state (so `mx.random.seed` still fixes the draws), with a vectorized exp.

- `sample_softmax_reference`: mlx-lm's categorical sampling, the law the kernel is tested against.
- `sample_softmax_native`: the kernel, a lazy MLX primitive; raises NativeUnsupported
  where it does not run (no primitives module, not float32, another device).
- `temperature_sampler`: the sampler engine/decode/sampling.py hands plain decoding.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from brisk.kernels import mlx_extension
from brisk.kernels.native_attention import NativeUnsupported


def sample_softmax_reference(logits: mx.array, temperature: float) -> mx.array:
    return mx.random.categorical(logits * (1 / temperature))


def sample_softmax_native(logits: mx.array, temperature: float) -> mx.array:
    """A token (uint32) per row of float32 logits (..., V), from softmax(logits / temperature)."""
    # The device first: on a GPU (a Mac's default) nothing is compiled or loaded.
    if mx.default_device() != mx.cpu or logits.dtype != mx.float32 or logits.ndim < 1 or not temperature > 0:
        raise NativeUnsupported("the native sampler takes float32 logits on the CPU and a temperature above 0")
    primitives = mlx_extension.load()
    if primitives is None:
        raise NativeUnsupported(mlx_extension.unavailable_reason())
    uniforms = mx.random.uniform(shape=logits.shape[:-1] or (1,))
    return primitives.sample_softmax(logits, uniforms, 1 / temperature)


def temperature_sampler(temperature: float) -> Callable[[mx.array], mx.array] | None:
    """A sampler for logits or log-probabilities at `temperature` alone (no top-p, min-p or
    top-k), or None where the kernel does not run here."""
    if not temperature > 0 or mx.default_device() != mx.cpu or mlx_extension.load() is None:
        return None  # (asked without drawing: a trial draw would advance the random state)

    def sample(logits: mx.array) -> mx.array:
        try:
            return sample_softmax_native(logits, temperature)
        except NativeUnsupported:  # another dtype or device for this call
            return sample_softmax_reference(logits, temperature)

    return sample
