"""Quantized linear layers on the CPU by the native kernel (kernels/csrc/quantized_matmul.cpp).

MLX's own `quantized_matmul` reads packed weights at about 1 GB/s on the CPU: 4x slower
than a float32 gemv, 27x slower than sgemm at 512 rows (shared/CPU.md). The kernel reads
them once for all rows of x up to 32 rows and dequantizes tiles for sgemm above that.

- `quantized_matmul_reference`: MLX's own op, the definition the kernel is tested against.
- `quantized_matmul_native`: the kernel; raises NativeUnsupported for what it does not take.
  It is a lazy node of MLX's graph when the MLX primitives build (kernels/mlx_extension.py),
  else an eager ctypes call that evaluates its inputs first.
- `quantized_matmul`: the dispatcher the layers use.
For 1-32 rows the kernel rounds x to 15-bit integers per block of 32 values with a float
scale, so weights and x meet in integer multiply-adds (about 2x faster decode layers; the
rounding costs about 1e-4 of a layer's output). `BRISK_INTEGER_ACTIVATIONS=0`, or
`integer_activations=False` per call, keeps x in float32, where the kernel agrees with the
reference to float rounding (about 1e-6 relative). More rows keep x in float32 for sgemm,
except on CPUs with AMX (found at run time): there 4-, 5- and 8-bit weights meet the same
integer x in AMX tiles (kernels/csrc/amx_matmul.cpp), about 1.7x sgemm; `BRISK_AMX=0` or
`amx=False` keeps sgemm.
On CPUs with AVX512-VNNI (found at run time) the integer products use vpdpbusd; `vnni=False`
keeps the AVX2 products (for 4, 5 and 6 bits the same integer sums, added in another float
order: equal to float rounding, not bit for bit; 8 bits sum q - 128 there).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from brisk.kernels import ctypes_library, mlx_extension, plan
from brisk.kernels.native_attention import NativeUnsupported, threads

# Few-row passes cost about linearly in rows (compute-bound); the dense path first dequantizes
# the whole weight. A whole Qwen-1.5B q4 pass over 16 rows took 695 ms, over 17 (dense) 1664
# ms; the two meet near 48 rows on Qwen 0.5B/1.5B and SmolLM2. A draft's catch-up or scout of
# 17+ tokens and a long lookup's verify land here.
MAX_FEW_ROWS = 32
# From the kernel plan, read once: the dispatcher runs ~200 times per decoded token. Tests
# switch them per test. INTEGER_ACTIVATIONS: x rounded to integers for few-row products;
# VNNI: with VNNI-512 (else AVX2's); AMX: prefill's products on AMX tiles (else sgemm).
INTEGER_ACTIVATIONS = plan.current().integer_x
VNNI = plan.current().vnni
AMX = plan.current().amx
# The kernel's integer_x argument: x kept float32; rounded to integers with the fastest
# products the CPU has (VNNI for few rows, AMX tiles for prefill's many rows, where found);
# with AVX2's products only; or the fastest but prefill on sgemm (the A/B partners).
FLOAT_X, INTEGER_X, INTEGER_X_WITHOUT_VNNI, INTEGER_X_WITHOUT_AMX = 0, 1, 2, 3
SCALE_TYPES = {mx.float32: 0, mx.float16: 1, mx.bfloat16: 2}
BITS = (4, 5, 6, 8)  # 5: GGUF's Q5_0/Q5_1 blocks, kept exactly; 6: Q6_K's


def quantized_matmul_reference(x, weight, scales, biases, *, bits: int, group_size: int, bias=None):
    out = mx.quantized_matmul(x, weight, scales, biases, transpose=True, group_size=group_size, bits=bits)
    return out if bias is None else out + bias


def _buffer(array: mx.array) -> np.ndarray:
    """A numpy view of an evaluated array's memory (bfloat16 read as its uint16 bits)."""
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    view = np.asarray(array)
    return view if view.flags.c_contiguous else np.ascontiguousarray(view)


def _rows(x: mx.array) -> int:
    rows = 1
    for size in x.shape[:-1]:
        rows *= size
    return rows


def _integer_mode(integer_activations: bool | None = None, vnni: bool | None = None, amx: bool | None = None) -> int:
    """The kernel's integer_x for these options (None: the process's INTEGER_ACTIVATIONS, VNNI, AMX)."""
    integer = INTEGER_ACTIVATIONS if integer_activations is None else integer_activations
    wide = VNNI if vnni is None else vnni
    tiles = AMX if amx is None else amx
    if not integer:
        return FLOAT_X
    if not wide:
        return INTEGER_X_WITHOUT_VNNI
    return INTEGER_X if tiles else INTEGER_X_WITHOUT_AMX


def integer_products() -> str:
    """How decode's quantized layers multiply here, in words (`brisk info`)."""
    lib = ctypes_library.load()
    if lib is None:
        return f"portable MLX ({ctypes_library.unavailable_reason()})"
    if not INTEGER_ACTIVATIONS or not lib.brisk_quantized_matmul_has_integer_x():
        return "float x (BRISK_INTEGER_ACTIVATIONS=0 or no AVX2)"
    if VNNI and lib.brisk_quantized_matmul_has_vnni():
        prefill = "AMX tiles" if AMX and lib.brisk_amx_available() else "sgemm"
        return f"VNNI-512 integer x (4, 5, 6 and 8 bits); prefill on {prefill}"
    return "AVX2 integer x (4, 5, 6 and 8 bits); prefill on sgemm"


def quantized_matmul_native(
    x,
    weight,
    scales,
    biases,
    *,
    bits: int,
    group_size: int,
    bias=None,
    integer_activations: bool | None = None,
    vnni: bool | None = None,
    amx: bool | None = None,
) -> mx.array:
    """x @ dequantize(weight).T (+ bias) for float x (..., K) and an affine-quantized (N, K) weight;
    None follows INTEGER_ACTIVATIONS, VNNI and AMX; vnni=False keeps AVX2's integer products,
    amx=False keeps more than 32 rows on sgemm."""
    lib = ctypes_library.load()
    if lib is None:
        raise NativeUnsupported(ctypes_library.unavailable_reason())
    if biases is None or bits not in BITS or group_size not in (32, 64):
        raise NativeUnsupported(f"{bits}-bit weights in groups of {group_size} (mode without biases?)")
    if scales.dtype not in SCALE_TYPES or biases.dtype != scales.dtype:
        raise NativeUnsupported(f"scales in {scales.dtype}")
    *lead, k = x.shape
    n = weight.shape[0]
    rows = _rows(x)
    integer_x = _integer_mode(integer_activations, vnni, amx)
    if weight.ndim != 2 or weight.shape[1] * 32 // bits != k or k % group_size or rows == 0:
        raise NativeUnsupported(f"shapes {x.shape} @ {weight.shape}.T")
    primitives = mlx_extension.load()
    if primitives is not None and (rows <= MAX_FEW_ROWS or primitives.has_sgemm()):
        try:
            out = primitives.quantized_matmul(
                x, weight, scales, biases, bias, bits, group_size, SCALE_TYPES[scales.dtype], threads(), integer_x
            )
        except ValueError as declined:  # a strided weight
            raise NativeUnsupported(str(declined)) from None
        return out.astype(x.dtype)
    x32 = x.astype(mx.float32)
    arrays = [x32, weight, scales, biases] + ([] if bias is None else [bias.astype(mx.float32)])
    mx.eval(*arrays)
    xs, w, s, b = (_buffer(a) for a in arrays[:4])
    linear_bias = None if bias is None else _buffer(arrays[4])
    out = np.empty((rows, n), np.float32)
    few_rows = rows <= MAX_FEW_ROWS
    entry = lib.brisk_quantized_matmul_rows if few_rows else lib.brisk_quantized_matmul_dense
    code = entry(
        xs.ctypes.data,
        w.ctypes.data,
        s.ctypes.data,
        b.ctypes.data,
        SCALE_TYPES[scales.dtype],
        None if linear_bias is None else linear_bias.ctypes.data,
        out.ctypes.data,
        rows,
        k,
        n,
        bits,
        group_size,
        threads(),
        integer_x,
    )
    if code:
        raise NativeUnsupported(f"the quantized matmul declined (code {code})")
    return mx.array(out).reshape(*lead, n).astype(x.dtype)


def quantized_gather_native(ids, weight, scales, biases, *, bits: int, group_size: int) -> mx.array:
    """Rows `ids` of a quantized (V, K) table as float32 (..., K): the embedding lookup."""
    lib = ctypes_library.load()
    if lib is None:
        raise NativeUnsupported(ctypes_library.unavailable_reason())
    if biases is None or scales.dtype not in SCALE_TYPES or biases.dtype != scales.dtype:
        raise NativeUnsupported("scales without biases or of another dtype")
    if bits not in BITS or group_size not in (32, 64):
        raise NativeUnsupported(f"{bits}-bit weights in groups of {group_size}")
    primitives = mlx_extension.load()
    if primitives is not None:
        return primitives.quantized_gather(ids, weight, scales, biases, bits, group_size, SCALE_TYPES[scales.dtype])
    k = weight.shape[1] * 32 // bits
    flat = ids.astype(mx.int32).reshape(-1)
    mx.eval(flat, weight, scales, biases)
    index, w, s, b = (_buffer(a) for a in (flat, weight, scales, biases))
    out = np.empty((index.size, k), np.float32)
    code = lib.brisk_quantized_gather(
        index.ctypes.data,
        index.size,
        w.ctypes.data,
        s.ctypes.data,
        b.ctypes.data,
        SCALE_TYPES[scales.dtype],
        out.ctypes.data,
        weight.shape[0],
        k,
        bits,
        group_size,
    )
    if code:
        raise NativeUnsupported(f"the quantized gather declined (code {code})")
    return mx.array(out).reshape(*ids.shape, k)


def quantized_matmul(x, weight, scales, biases, *, bits: int, group_size: int, bias=None, native_ok=True):
    """The kernel on the CPU where it takes the call, else MLX's op."""
    if native_ok and mx.default_device() == mx.cpu and x.dtype in (mx.float32, mx.float16, mx.bfloat16):
        try:
            return quantized_matmul_native(x, weight, scales, biases, bits=bits, group_size=group_size, bias=bias)
        except NativeUnsupported:
            pass
    return quantized_matmul_reference(x, weight, scales, biases, bits=bits, group_size=group_size, bias=bias)


def _affine(layer) -> bool:
    return getattr(layer, "mode", "affine") == "affine"


class _Prepared:
    """A layer's checked call into the MLX primitive: the dispatcher's checks ran once for
    these arrays, so a decode step's ~200 calls skip them (~1.5 ms of Python a step)."""

    def __init__(self, primitives, weight, scales, biases, bias, bits: int, group_size: int):
        self.primitives, self.k = primitives, weight.shape[1] * 32 // bits
        self.arrays = (weight, scales, biases, bias)  # the layer's arrays as checked
        self.args = (*self.arrays, bits, group_size, SCALE_TYPES[scales.dtype])

    def takes(self, x: mx.array, arrays: tuple) -> bool:
        same = all(a is b for a, b in zip(arrays, self.arrays))  # any array replaced: check anew
        return same and x.dtype == mx.float32 and x.ndim >= 1 and x.shape[-1] == self.k and x.size > 0

    def __call__(self, x: mx.array) -> mx.array:
        return self.primitives.quantized_matmul(x, *self.args, threads(), _integer_mode())


class NativeQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose products on the CPU run in the native kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        if not _affine(self):
            return super().__call__(x)
        weight, scales, biases, bias = self["weight"], self["scales"], self.get("biases"), self.get("bias")
        on_cpu = self._route.native and mx.default_device() == mx.cpu
        prepared = self.__dict__.get("_prepared")
        if on_cpu and prepared is not None and prepared.takes(x, (weight, scales, biases, bias)):
            return prepared(x)
        kwargs = dict(bits=self.bits, group_size=self.group_size, bias=bias)
        if on_cpu and x.dtype in (mx.float32, mx.float16, mx.bfloat16):
            try:
                out = quantized_matmul_native(x, weight, scales, biases, **kwargs)
            except NativeUnsupported:
                pass
            else:
                self.__dict__["_prepared"] = _prepare(weight, scales, biases, bias, self.bits, self.group_size)
                return out
        return quantized_matmul_reference(x, weight, scales, biases, **kwargs)


def _prepare(weight, scales, biases, bias, bits: int, group_size: int) -> _Prepared | None:
    """The checked call for arrays the kernel just took, when it took them as a primitive for
    any number of rows (without sgemm, more than MAX_FEW_ROWS rows go through ctypes)."""
    primitives = mlx_extension.load()
    if primitives is None or not primitives.has_sgemm():
        return None
    return _Prepared(primitives, weight, scales, biases, bias, bits, group_size)


class NativeQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding whose lookup and `as_linear` (a tied output head) run on Brisk's kernels."""

    def __call__(self, x: mx.array) -> mx.array:
        if self._route.native and _affine(self) and mx.default_device() == mx.cpu:
            try:
                return quantized_gather_native(
                    x, self["weight"], self["scales"], self.get("biases"), bits=self.bits, group_size=self.group_size
                )
            except NativeUnsupported:
                pass
        return super().__call__(x)

    def as_linear(self, x: mx.array) -> mx.array:
        if not _affine(self):
            return super().as_linear(x)
        return quantized_matmul(
            x,
            self["weight"],
            self["scales"],
            self.get("biases"),
            bits=self.bits,
            group_size=self.group_size,
            native_ok=self._route.native,
        )
