"""The CPU fast path: decode attention on the packed KV cache by the native kernel.

`quantized_attention_native` has the signature of the MLX paths in quantized_attention.py.
It evaluates its inputs, hands the native kernel (kernels/csrc/packed_attention.cpp)
their buffers and element strides without copying (a cache's sliced views included), and
wraps the result as an MLX array. It takes no mask or mlx-lm's "causal" (the queries are
the last L of the S positions); anything else raises NativeUnsupported, and so does a
shape the kernel does not handle, so the dispatcher can fall back.
"""

from __future__ import annotations

import ctypes
import functools
import os

import mlx.core as mx
import numpy as np

from kernels import native

Packed = tuple  # (packed uint32, scales, biases)


class NativeUnsupported(Exception):
    """The native kernel cannot take this call; use a portable path."""


def threads() -> int:
    return int(os.environ.get("BRISK_KERNEL_THREADS", 0)) or _cpu_count()


@functools.cache
def _cpu_count() -> int:
    return os.cpu_count() or 1  # ~15 us a call: a decode step asks ~200 times


def _view(array: mx.array) -> tuple[np.ndarray, ctypes.Array]:
    """A zero-copy numpy view and its element strides for batch, head, position."""
    view = np.asarray(array)
    if view.ndim != 4:
        raise NativeUnsupported(f"packed arrays of {view.ndim} dimensions")
    if view.strides[-1] != view.itemsize:
        view = np.ascontiguousarray(view)
    strides = [s // view.itemsize for s in view.strides[:3]]
    strides = [0 if n == 1 else s for s, n in zip(strides, view.shape[:3])]
    return view, (ctypes.c_int64 * 3)(*strides)


def available() -> bool:
    return native.load() is not None


def quantized_attention_native(queries, q_keys: Packed, q_values: Packed, *, scale: float, mask=None,
                               group_size: int = 32, bits: int = 4) -> mx.array:
    lib = native.load()
    if lib is None:
        raise NativeUnsupported(native.unavailable_reason())
    if mask is not None and not (isinstance(mask, str) and mask == "causal"):
        raise NativeUnsupported("the native kernel takes no mask array")
    scales_dtype = q_keys[1].dtype
    if scales_dtype not in (mx.float16, mx.float32) or q_values[1].dtype != scales_dtype:
        raise NativeUnsupported(f"scales in {scales_dtype}")
    b, hq, length, d = queries.shape
    n_kv, k_len = q_keys[0].shape[1], q_keys[0].shape[2]
    q32 = queries.astype(mx.float32)
    mx.eval(q32, *q_keys, *q_values)
    q = np.ascontiguousarray(np.asarray(q32))
    out = np.empty((b, hq, length, d), np.float32)
    views = [_view(a) for a in (*q_keys, *q_values)]
    args = []
    for part in (views[:3], views[3:]):
        args += [v.ctypes.data for v, _ in part] + [s for _, s in part]
    code = lib.brisk_packed_attention(q.ctypes.data, out.ctypes.data, b, hq, n_kv, length, k_len, d, group_size,
                                      bits, int(mask == "causal"), int(scales_dtype == mx.float16), scale,
                                      threads(), *args)
    if code:
        raise NativeUnsupported(f"the native kernel declined this shape (code {code})")
    return mx.array(out).astype(queries.dtype)
