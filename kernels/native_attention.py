"""The CPU fast path: decode attention on the packed KV cache by the native kernel.

`kv_attention_native` has the signature of the MLX paths in kv_attention.py, and
`quantized_attention_native` those of quantized_attention.py (per-token packed tuples).
The kernel (kernels/csrc/packed_attention.cpp) runs as a lazy MLX primitive where the
primitives module can be had (kernels/mlx_extension.py), so a decode step's graph is not
cut at every layer. Without it, the ctypes library: each call evaluates its inputs and
hands the kernel their buffers and element strides without copying (a cache's sliced views
included). It takes no mask or mlx-lm's "causal" (the queries are the last L of the S
positions); anything else raises NativeUnsupported, and so does a shape the kernel does
not handle, so the dispatcher can fall back.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from brisk.kernels import ctypes_library, mlx_extension
from brisk.kernels.packed_kv import TOKEN_GROUP, Dense, KVLayout, TokenPacked

Packed = tuple[mx.array, mx.array, mx.array]  # (packed uint32, scales, biases)


class NativeUnsupported(Exception):
    """The native kernel cannot take this call; use a portable path."""


# Read once: a verify pass asks ~270 times, and reading the environment each time was ~0.3 ms
# of the ~2.7 ms SmolLM2's verify graph took to build. 0: one thread per CPU.
KERNEL_THREADS = int(os.environ.get("BRISK_KERNEL_THREADS", 0))


def threads() -> int:
    return KERNEL_THREADS or _cpu_count()


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
    return ctypes_library.load() is not None


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
HEAD_DIMS = (64, 80, 96, 128, 256)
MAX_ROWS = 64  # query rows per KV head (packed_attention.cpp's kMaxRows)


@dataclass
class _Part:
    """One of K or V as the kernel describes it: `meta` is its layout, bits, group, packed,
    dense_from, scales_half and dense_half (packed_attention.cpp's `Source`)."""

    meta: list[int]
    data: mx.array | None = None
    scales: mx.array | None = None
    biases: mx.array | None = None
    dense: mx.array | None = None
    limits: tuple[int, ...] | None = None

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.data, self.scales, self.biases, self.dense) if a is not None]


def _part(layout: KVLayout, head_dim: int, keys: int, queries_length: int, is_key: bool) -> _Part:
    """`layout` as the kernel takes it, or NativeUnsupported for what it does not (checked
    here, so that a lazy primitive never has to decline when it runs)."""
    dense = layout.array if isinstance(layout, Dense) else getattr(layout, "recent", None)
    if dense is not None and dense.shape[2] and dense.dtype not in (mx.float16, mx.float32):
        dense = dense.astype(mx.float32)
    dense = dense if dense is not None and dense.shape[2] else None
    meta = [DENSE, 0, 0, 0, 0, 0, int(dense is not None and dense.dtype == mx.float16)]
    if isinstance(layout, Dense):
        return _Part(meta, dense=dense)
    if layout.scales.dtype not in _SCALE_DTYPES or layout.biases.dtype != layout.scales.dtype:
        raise NativeUnsupported(f"scales in {layout.scales.dtype}")
    if layout.bits not in (4, 8):
        raise NativeUnsupported(f"{layout.bits}-bit packing")
    part = _Part(meta, layout.data, layout.scales, layout.biases, dense)
    meta[1], meta[5] = layout.bits, _SCALE_DTYPES[layout.scales.dtype]
    if isinstance(layout, TokenPacked):
        if layout.group not in (32, 64) or head_dim % layout.group:
            raise NativeUnsupported(f"groups of {layout.group} channels with head dim {head_dim}")
        meta[0], meta[2] = TOKEN_PACKED, layout.group
        return part
    if not is_key:
        raise NativeUnsupported("values packed per channel")
    meta[0], meta[2], meta[3], meta[4] = CHANNEL_PACKED, TOKEN_GROUP, layout.packed, layout.recent_from
    if layout.packed > keys or layout.recent_from > layout.packed or layout.recent_from % TOKEN_GROUP:
        raise NativeUnsupported("channel-packed keys past the key count or off a group bound")
    if layout.limits is not None:
        if len(layout.limits) != queries_length:
            raise NativeUnsupported("packed limits for another number of query rows")
        if any(not layout.recent_from <= n <= layout.packed or n % TOKEN_GROUP for n in layout.limits):
            raise NativeUnsupported("a row's packed limit outside the packed keys or off a group bound")
        part.limits = tuple(layout.limits)
    return part


def _source(part: _Part, keep: list) -> _Source:
    """The ctypes kernel's `Source` for `part`; the numpy views it points into go to `keep`."""
    src = _Source(*part.meta)
    if part.limits is not None:
        limits = np.ascontiguousarray(part.limits, np.int32)
        keep.append(limits)
        src.limits = limits.ctypes.data
    named = {"data": "data", "scales": "scale", "biases": "bias", "dense": "dense"}
    for name, stride_name in named.items():
        array = getattr(part, name)
        if array is not None:
            view, strides = _view(array)
            keep.append(view)
            setattr(src, name, view.ctypes.data)
            getattr(src, f"{stride_name}_strides")[:] = strides
    return src


def kv_attention_native(queries, keys: KVLayout, values: KVLayout, *, scale: float, mask=None) -> mx.array:
    """As a lazy MLX primitive where the primitives module can be had, else through ctypes
    (which evaluates the inputs first)."""
    if mask is not None and not (isinstance(mask, str) and mask == "causal"):
        raise NativeUnsupported("the native kernel takes no mask array")
    b, hq, length, d = queries.shape
    n_kv, k_len = values.heads, values.length
    if d not in HEAD_DIMS:
        raise NativeUnsupported(f"head dim {d}")
    if n_kv <= 0 or hq % n_kv or hq // n_kv * length > MAX_ROWS:
        raise NativeUnsupported(f"{hq} query heads over {n_kv} KV heads, {length} rows")
    k_part, v_part = _part(keys, d, k_len, length, True), _part(values, d, k_len, length, False)
    causal = mask is not None
    primitives = mlx_extension.load()
    if primitives is not None:
        out = primitives.packed_attention(
            queries.astype(mx.float32),
            k_len,
            n_kv,
            float(scale),
            causal,
            threads(),
            k_part.meta,
            k_part.data,
            k_part.scales,
            k_part.biases,
            k_part.dense,
            None if k_part.limits is None else mx.array(k_part.limits, dtype=mx.int32),
            v_part.meta,
            v_part.data,
            v_part.scales,
            v_part.biases,
            v_part.dense,
        )
        return out.astype(queries.dtype)
    return _kv_attention_ctypes(queries, k_part, v_part, n_kv, k_len, scale, causal)


def _kv_attention_ctypes(queries, k_part: _Part, v_part: _Part, n_kv: int, k_len: int, scale, causal) -> mx.array:
    lib = ctypes_library.load()
    if lib is None:
        raise NativeUnsupported(ctypes_library.unavailable_reason())
    b, hq, length, d = queries.shape
    q32 = queries.astype(mx.float32)
    mx.eval(q32, *k_part.arrays(), *v_part.arrays())
    q = np.ascontiguousarray(np.asarray(q32))
    out = np.empty((b, hq, length, d), np.float32)
    keep: list = []
    k_src, v_src = _source(k_part, keep), _source(v_part, keep)
    code = lib.brisk_kv_attention(
        q.ctypes.data,
        out.ctypes.data,
        b,
        hq,
        n_kv,
        length,
        k_len,
        d,
        int(causal),
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
