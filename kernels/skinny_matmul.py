"""Few-row float32 matmuls (speculative verify) by the native CPU kernel.

On the CPU a verify pass sends k+1 token rows through every weight matrix, and MKL's
sgemm for 2-16 rows runs at a fraction of its one-row speed: verifying 5 tokens of
Qwen2.5-1.5B cost about 3 plain decode steps, so drafting barely paid.
kernels/csrc/skinny_matmul.cpp reads each weight row once for all the rows.

`SkinnyLinear` and `SkinnyEmbedding` (a tied output head's `as_linear`) send 2-16 row
float32 products on the CPU to the kernel, and on AVX-512 CPUs prefill chunks of 64+ rows to
kernels/csrc/float_gemm.cpp (register-tiled, ~1.3x MKL's sgemm on our AMD CPUs; a float32
model's prefill is these products); everything else (one-row decode, where MKL is as fast;
GPU; other dtypes) goes to MLX as before. kernels/native_layers.py
swaps them into a loaded model. The kernel runs as a lazy MLX primitive where
kernels/mlx_extension.py builds one, else as an eager ctypes call that evaluates its input.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from brisk.kernels import ctypes_library, mlx_extension, plan
from brisk.kernels.native_attention import NativeUnsupported, threads

MIN_ROWS, MAX_ROWS = 2, 16  # one row stays with BLAS's gemv; the kernel tiles at most 16
WIDE_ROWS = 64  # from here a product is a prefill chunk's, for float_gemm.cpp


def skinny_matmul_native(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """x @ weight.T (+ bias) for float32 x (..., K) with 1-16 rows and weight (N, K)."""
    lib = ctypes_library.load()
    if lib is None:
        raise NativeUnsupported(ctypes_library.unavailable_reason())
    if x.dtype != mx.float32 or weight.dtype != mx.float32 or (bias is not None and bias.dtype != mx.float32):
        raise NativeUnsupported("the skinny matmul takes float32 only")
    *lead, k = x.shape
    n = weight.shape[0]
    rows = _rows(x)
    if weight.ndim != 2 or weight.shape[1] != k or not 1 <= rows <= MAX_ROWS:
        raise NativeUnsupported(f"shapes {x.shape} @ {weight.shape}.T")
    primitives = mlx_extension.load()
    if primitives is not None:  # a lazy node of the graph (kernels/mlx_extension.py)
        try:
            return primitives.skinny_matmul(x, weight, bias, threads())
        except ValueError as declined:  # a strided weight
            raise NativeUnsupported(str(declined)) from None
    mx.eval(x, weight, *([] if bias is None else [bias]))
    xs = np.ascontiguousarray(np.asarray(x).reshape(rows, k))
    w = np.asarray(weight)
    if not w.flags.c_contiguous:
        raise NativeUnsupported("a strided weight")  # copying it would cost more than BLAS
    b = None if bias is None else np.ascontiguousarray(np.asarray(bias))
    out = np.empty((rows, n), np.float32)
    code = lib.brisk_skinny_matmul(
        xs.ctypes.data, w.ctypes.data, None if b is None else b.ctypes.data, out.ctypes.data, rows, k, n, threads()
    )
    if code:
        raise NativeUnsupported(f"the skinny matmul declined (code {code})")
    return mx.array(out).reshape(*lead, n)


def float_gemm_native(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """x @ weight.T (+ bias) for float32 x (..., K) and weight (N, K), any number of rows,
    by float_gemm.cpp as a lazy MLX primitive (AVX-512 CPUs only)."""
    primitives = mlx_extension.load()
    if primitives is None:
        raise NativeUnsupported(mlx_extension.unavailable_reason())
    if not primitives.float_gemm_available():
        raise NativeUnsupported("the float gemm needs AVX-512")
    if not plan.switch_on("BRISK_FLOAT_GEMM"):  # read per call: the A/B partner, tests
        raise NativeUnsupported("turned off (BRISK_FLOAT_GEMM=0)")
    if x.dtype != mx.float32 or weight.dtype != mx.float32 or (bias is not None and bias.dtype != mx.float32):
        raise NativeUnsupported("the float gemm takes float32 only")
    if weight.ndim != 2 or weight.shape[1] != x.shape[-1]:
        raise NativeUnsupported(f"shapes {x.shape} @ {weight.shape}.T")
    try:
        return primitives.skinny_matmul(x, weight, bias, threads(), wide=True)
    except ValueError as declined:  # a strided weight
        raise NativeUnsupported(str(declined)) from None


def _rows(x: mx.array) -> int:
    rows = 1
    for size in x.shape[:-1]:
        rows *= size
    return rows


def _worth_it(route, x: mx.array, weight: mx.array) -> bool:
    return (
        route.native
        and MIN_ROWS <= _rows(x) <= MAX_ROWS
        and x.dtype == mx.float32
        and weight.dtype == mx.float32
        and mx.default_device() == mx.cpu
    )


def _wide(route, x: mx.array, weight: mx.array) -> bool:
    return (
        route.native
        and _rows(x) >= WIDE_ROWS
        and x.dtype == mx.float32
        and weight.dtype == mx.float32
        and mx.default_device() == mx.cpu
    )


class SkinnyLinear(nn.Linear):
    """nn.Linear whose few-row and prefill-chunk float32 products on the CPU run in the
    native kernels."""

    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        if _worth_it(self._route, x, weight):
            kernel = skinny_matmul_native
        elif _wide(self._route, x, weight):
            kernel = float_gemm_native
        else:
            return super().__call__(x)
        try:
            return kernel(x, weight, self.get("bias"))
        except NativeUnsupported:
            return super().__call__(x)


class SkinnyEmbedding(nn.Embedding):
    """nn.Embedding whose `as_linear` (a tied output head) takes the same route."""

    def as_linear(self, x: mx.array) -> mx.array:
        if _worth_it(self._route, x, self.weight):
            try:
                return skinny_matmul_native(x, self.weight)
            except NativeUnsupported:
                pass
        return super().as_linear(x)
