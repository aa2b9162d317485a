"""Prefill's quantized matmuls on AMX tiles (kernels/csrc/amx_matmul.cpp) against MLX."""

import shutil
from pathlib import Path

import mlx.core as mx
import pytest

from brisk.kernels import ctypes_library, native_attention
from brisk.kernels.quantized_matmul import integer_products, quantized_matmul_native, quantized_matmul_reference
from tests.kernels.test_quantized_matmul import _integer_rounded, _quantized
from tests.pairwise import rotate_over

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
pytestmark = [
    pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the native kernel"),
    pytest.mark.usefixtures("kernel_path"),
]
AMX_FLAGS = {"amx_tile", "amx_int8", "avx512f", "avx512bw", "avx512vl", "avx512dq"}


def _cpu_flags() -> set[str]:
    path = Path("/proc/cpuinfo")
    return set(path.read_text().split()) if path.exists() else set()


def _has_amx() -> bool:
    lib = ctypes_library.load()
    return lib is not None and lib.brisk_amx_available() == 1


def _skip_without_amx() -> None:
    if not _has_amx():
        pytest.skip("no AMX (AMX-TILE and AMX-INT8 with AVX-512) on this CPU: prefill stays on sgemm")


def test_amx_is_used_exactly_where_the_cpu_has_it():
    """Found at run time (the library is built for AVX2): never missed where the CPU has it
    (prefill 1.45x on Qwen-1.5B), never used where it does not."""
    lib = ctypes_library.load()
    assert lib.brisk_amx_available() == int(AMX_FLAGS <= _cpu_flags())
    assert ("prefill on AMX tiles" in integer_products()) == _has_amx()


@pytest.mark.parametrize(
    # Every bits, rows and group/K together (they choose the code path); the scales' dtype (how
    # each group's scale is read) meets each of their values: 54 cases, not 162.
    *rotate_over(
        {
            "bits": [4, 5, 8],
            "rows": [33, 47, 64],  # past the few-row limit; a last tile of 1, of 15, none
            # K in blocks of 32: 2, 3 (last loads short of 4 blocks (4-bit) or of 2 (5-bit)), 6, 10
            "group,k": [(32, 64), (32, 96), (32, 320), (64, 64), (64, 192), (64, 320)],
        },
        "dtype",
        [mx.float32, mx.float16, mx.bfloat16],
    )
)
def test_prefill_rows_equal_mlx_on_the_rounded_x(bits, group, dtype, rows, k):
    """The tiles' integer sums are exact: what is left is float rounding of x rounded to 15-bit
    integers per block times s * q, plus each group's bias times the float sum of x."""
    _skip_without_amx()
    packed, scales, biases = _quantized(37, k, bits, group, dtype, seed=rows + k + bits)  # N: two tiles, the last of 5
    x = mx.random.normal((rows, k))
    x = x.at[3, 5].add(40.0)  # an outlier channel
    bias = mx.random.normal((37,))
    s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
    offsets = mx.repeat(b32, group, axis=1)
    scaled = mx.dequantize(packed, s32, b32, group_size=group, bits=bits) - offsets
    want = _integer_rounded(x) @ scaled.T + x @ offsets.T + bias
    got = quantized_matmul_native(x, packed, scales, biases, bits=bits, group_size=group, bias=bias)
    assert got.shape == (rows, 37)
    assert mx.abs(got - want).max().item() < 5e-5
    exact = quantized_matmul_reference(x, packed, scales, biases, bits=bits, group_size=group, bias=bias)
    error = mx.abs(got - exact.astype(mx.float32)).max().item() / mx.abs(exact).max().item()
    assert 0 < error < 1e-3  # the integers really are used (sgemm agrees to ~1e-6)


def test_amx_off_keeps_sgemm():
    """BRISK_AMX=0 (amx=False): dequantized tiles + sgemm, float x (equal to MLX to ~1e-6)."""
    _skip_without_amx()
    packed, scales, biases = _quantized(40, 320, 4, 32, mx.float16, seed=4)
    x = mx.random.normal((50, 320))
    want = quantized_matmul_reference(x, packed, scales, biases, bits=4, group_size=32).astype(mx.float32)
    off = quantized_matmul_native(x, packed, scales, biases, bits=4, group_size=32, amx=False)
    on = quantized_matmul_native(x, packed, scales, biases, bits=4, group_size=32)
    assert mx.abs(off - want).max().item() < 1e-5 * mx.abs(want).max().item()
    assert mx.abs(on - want).max().item() > 1e-5 * mx.abs(want).max().item()  # the integers: another path


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_same_bits(threads, monkeypatch):
    _skip_without_amx()
    packed, scales, biases = _quantized(100, 256, 4, 32, mx.float16, seed=5)
    x = mx.random.normal((70, 256))
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", 1)
    one = quantized_matmul_native(x, packed, scales, biases, bits=4, group_size=32)
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
    for _ in range(5):
        assert mx.array_equal(quantized_matmul_native(x, packed, scales, biases, bits=4, group_size=32), one).item()


def test_a_row_gives_the_same_bits_in_any_chunk():
    """Each row is rounded and summed on its own: a prompt's rows do not depend on which
    other rows share their prefill chunk (a cached prefix and a fresh prefill agree)."""
    _skip_without_amx()
    packed, scales, biases = _quantized(50, 192, 8, 64, mx.bfloat16, seed=7)
    x = mx.random.normal((96, 192))
    whole = quantized_matmul_native(x, packed, scales, biases, bits=8, group_size=64)
    part = quantized_matmul_native(x[40:80], packed, scales, biases, bits=8, group_size=64)
    assert mx.array_equal(whole[40:80], part).item()
