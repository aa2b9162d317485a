"""The CPU fast path: decode attention on the packed KV cache by the native kernel.

`kv_attention_native` has the signature of the MLX paths in kv_attention.py, and
`quantized_attention_native` those of quantized_attention.py (per-token packed tuples).
Each evaluates its inputs, hands the native kernel (kernels/csrc/packed_attention.cpp)
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
from kernels.packed_kv import TOKEN_GROUP, ChannelPacked, Dense, KVLayout, TokenPacked

Packed = tuple[mx.array, mx.array, mx.array]  # (packed uint32, scales, biases)


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


class _Source(ctypes.Structure):
    """kernels/csrc/packed_attention.cpp's `Source`, field for field."""

    _fields_ = [
        ("layout", ctypes.c_int32),
        ("bits", ctypes.c_int32),
        ("group", ctypes.c_int32),
        ("packed", ctypes.c_int32),
        ("dense_from", ctypes.c_int32),
        ("scales_half", ctypes.c_int32),
        ("dense_half", ctypes.c_int32),
        ("data", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("biases", ctypes.c_void_p),
        ("dense", ctypes.c_void_p),
        ("limits", ctypes.c_void_p),
        ("data_strides", ctypes.c_int64 * 3),
        ("scale_strides", ctypes.c_int64 * 3),
        ("bias_strides", ctypes.c_int64 * 3),
        ("dense_strides", ctypes.c_int64 * 3),
    ]


DENSE, TOKEN_PACKED, CHANNEL_PACKED = 0, 1, 2
_SCALE_DTYPES = {mx.float16: 1, mx.float32: 0}


def _source(layout: KVLayout, keep: list, queries_length: int) -> _Source:
    """The kernel's description of one of K or V; the numpy views it points into go to `keep`."""
    src = _Source()
    dense = layout.array if isinstance(layout, Dense) else getattr(layout, "recent", None)
    if isinstance(layout, Dense):
        src.layout = DENSE
    else:
        if layout.scales.dtype not in _SCALE_DTYPES or layout.biases.dtype != layout.scales.dtype:
            raise NativeUnsupported(f"scales in {layout.scales.dtype}")
        src.layout = TOKEN_PACKED if isinstance(layout, TokenPacked) else CHANNEL_PACKED
        src.bits, src.scales_half = layout.bits, _SCALE_DTYPES[layout.scales.dtype]
        src.group = layout.group if isinstance(layout, TokenPacked) else TOKEN_GROUP
        if isinstance(layout, ChannelPacked):
            src.packed, src.dense_from = layout.packed, layout.recent_from
            if layout.limits is not None:
                if len(layout.limits) != queries_length:
                    raise NativeUnsupported("packed limits for another number of query rows")
                limits = np.ascontiguousarray(layout.limits, np.int32)
                keep.append(limits)
                src.limits = limits.ctypes.data
        for name in ("data", "scales", "biases"):
            view, strides = _view(getattr(layout, name))
            keep.append(view)
            setattr(src, name, view.ctypes.data)
            getattr(src, f"{'bias' if name == 'biases' else name.rstrip('s')}_strides")[:] = strides
    if dense is not None and dense.shape[2]:
        if dense.dtype not in (mx.float16, mx.float32):
            dense = dense.astype(mx.float32)
        view, strides = _view(dense)
        keep.append(view)
        src.dense, src.dense_half = view.ctypes.data, int(dense.dtype == mx.float16)
        src.dense_strides[:] = strides
    return src


def kv_attention_native(queries, keys: KVLayout, values: KVLayout, *, scale: float, mask=None) -> mx.array:
    lib = native.load()
    if lib is None:
        raise NativeUnsupported(native.unavailable_reason())
    if mask is not None and not (isinstance(mask, str) and mask == "causal"):
        raise NativeUnsupported("the native kernel takes no mask array")
    b, hq, length, d = queries.shape
    n_kv, k_len = values.heads, values.length
    q32 = queries.astype(mx.float32)
    arrays = [a for layout in (keys, values) for a in vars(layout).values() if isinstance(a, mx.array)]
    mx.eval(q32, *arrays)
    q = np.ascontiguousarray(np.asarray(q32))
    out = np.empty((b, hq, length, d), np.float32)
    keep: list = []
    k_src, v_src = _source(keys, keep, length), _source(values, keep, length)
    code = lib.brisk_kv_attention(
        q.ctypes.data,
        out.ctypes.data,
        b,
        hq,
        n_kv,
        length,
        k_len,
        d,
        int(mask == "causal"),
        scale,
        threads(),
        ctypes.byref(k_src),
        ctypes.byref(v_src),
    )
    if code:
        raise NativeUnsupported(f"the native kernel declined this shape (code {code})")
    return mx.array(out).astype(queries.dtype)


def quantized_attention_native(
    queries, q_keys: Packed, q_values: Packed, *, scale: float, mask=None, group_size: int = 32, bits: int = 4
) -> mx.array:
    """Per-token packed K and V as mx.quantize outputs (kernels/quantized_attention.py)."""
    keys, values = (TokenPacked(*packed, bits, group_size) for packed in (q_keys, q_values))
    return kv_attention_native(queries, keys, values, scale=scale, mask=mask)
