"""The native quantized matmul, lookup and layers against MLX's own quantized ops."""

import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from brisk.kernels import ctypes_library, native_attention, quantized_matmul
from brisk.kernels.native_attention import NativeUnsupported
from brisk.kernels.native_layers import blas_only, use_native_layers
from brisk.kernels.prebuilt import Loaded
from brisk.kernels.quantized_matmul import (
    NativeQuantizedEmbedding,
    NativeQuantizedLinear,
    quantized_gather_native,
    quantized_matmul_native,
    quantized_matmul_reference,
)
from tests.pairwise import rotate_over

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
pytestmark = [
    pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the native kernel"),
    pytest.mark.usefixtures("kernel_path"),
]


def _quantized(n, k, bits, group, dtype, seed):
    mx.random.seed(seed)
    weight = mx.random.normal((n, k)) * 0.05
    packed, scales, biases = mx.quantize(weight, group_size=group, bits=bits)
    return packed, scales.astype(dtype), biases.astype(dtype)


def _integer_rounded(x: mx.array) -> mx.array:
    """x as the integer few-row path sees it: each block of 32 values rounded to q * d, with
    d = max|x| / (127 * 128) and q = rint(x / d) (float32 throughout, as the kernel computes it)."""
    v = np.array(x, np.float32).reshape(-1, 32)
    d = np.abs(v).max(axis=1, keepdims=True) / np.float32(127 * 128)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    return mx.array((np.rint(v * inverse) * d).reshape(x.shape))


@pytest.mark.parametrize(
    # Every bits, group and rows together (they choose the code path); the scales' dtype (how
    # each group's scale is read) meets each of their values: 64 cases a kernel path, not 192.
    *rotate_over(
        {
            "bits": [4, 5, 6, 8],  # 5: GGUF's Q5_0/Q5_1 (8 values in every 5 bytes); 6: Q6_K
            "group": [32, 64],
            "rows": [1, 3, 5, 16, 17, 32, 33, 40],  # 1-32 the few-row path, above it tiles + sgemm
        },
        "dtype",
        [mx.float32, mx.float16, mx.bfloat16],
    )
)
def test_native_equals_mlx(bits, group, dtype, rows):
    packed, scales, biases = _quantized(67, 192, bits, group, dtype, seed=rows + bits + group)  # N odd
    x = mx.random.normal((1, rows, 192))
    bias = mx.random.normal((67,))
    want = quantized_matmul_reference(x, packed, scales, biases, bits=bits, group_size=group, bias=bias)
    got = quantized_matmul_native(
        x, packed, scales, biases, bits=bits, group_size=group, bias=bias, integer_activations=False
    )
    assert got.shape == want.shape == (1, rows, 67) and got.dtype == mx.float32
    assert mx.allclose(got, want.astype(mx.float32), atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("rows", [1, 40])
def test_five_bit_rows_of_an_odd_number_of_blocks_take_the_plain_unpacking(rows):
    """K = 96 is three blocks, not whole spans of 64: the few-row and dense paths unpack 5-bit
    blocks one at a time there (the vector unpacking reads two blocks at once). The dense path
    here is sgemm's (amx=False): AMX's own 5-bit tail is tested in test_amx_matmul.py against
    the integer-rounded x it uses, which MLX's float x matches only to ~1e-4."""
    packed, scales, biases = _quantized(21, 96, 5, 32, mx.float16, seed=rows)
    x = mx.random.normal((rows, 96))
    want = quantized_matmul_reference(x, packed, scales, biases, bits=5, group_size=32)
    got = quantized_matmul_native(x, packed, scales, biases, bits=5, group_size=32, amx=False)
    assert mx.allclose(got, want.astype(mx.float32), atol=1e-4, rtol=1e-4).item()


def _has_integer_path() -> bool:
    lib = ctypes_library.load()
    return lib is not None and lib.brisk_quantized_matmul_has_integer_x() == 1


def _has_vnni() -> bool:
    lib = ctypes_library.load()
    return lib is not None and lib.brisk_quantized_matmul_has_vnni() == 1


def _skip_without_integer_path(bits: int, vnni: bool) -> None:
    if not _has_integer_path():
        pytest.skip("this build has no integer path (no AVX2): x stays float32, no integer kernel runs")
    if vnni and not _has_vnni():
        pytest.skip(
            "no VNNI-512 (AVX512 F/BW/VL/DQ/VNNI) on this CPU or under BRISK_ISA: the VNNI kernel cannot run "
            "(the vnni=False case covers the AVX2 one)"
        )


def test_vnni_is_used_exactly_where_the_cpu_has_it():
    """The library is built for AVX2 and finds VNNI-512 at run time: it must neither miss it
    on a CPU that has it (the 1.4-1.5x decode speedup) nor use it on one that lacks it."""
    lib = ctypes_library.load()
    flags = set(open("/proc/cpuinfo").read().split()) if _has_integer_path() else set()
    wanted = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
    assert lib.brisk_quantized_matmul_has_vnni() == int(wanted <= flags)


# Every width on both integer paths: VNNI-512 (vnni=True) and AVX2 (vnni=False; 8 bits as q - 128).
INTEGER_PATHS = [(bits, vnni) for bits in (4, 5, 6, 8) for vnni in (True, False)]


@pytest.mark.parametrize(
    # Every path, width, group, rows and K together; the scales' dtype (how each group's scale
    # is read) meets each of their values: 192 cases a kernel path, not 576.
    *rotate_over(
        {
            "bits,vnni": INTEGER_PATHS,
            "group": [32, 64],
            "rows": [1, 3, 4, 5, 16, 32],
            "k": [192, 256],  # 3 spans of 64 (the 512-bit path's last span alone) and 4
        },
        "dtype",
        [mx.float32, mx.float16, mx.bfloat16],
    )
)
def test_integer_activations_equal_mlx_on_the_rounded_x(bits, group, dtype, rows, vnni, k):
    """The fast few-row path is exactly the product of x rounded to 15-bit integers per block
    of 32 with the weights' scaled part s * q, plus each group's bias b times the float sum of
    x: the integer sums leave only float rounding (the nibble order, the 5-bit unpacking, the
    split of q into two bytes and VNNI-512's pairs of spans included)."""
    _skip_without_integer_path(bits, vnni)
    packed, scales, biases = _quantized(67, k, bits, group, dtype, seed=rows + group + bits)
    x = mx.random.normal((1, rows, k))
    x = x.at[0, 0, 5].add(40.0)  # an outlier channel, as SmolLM2's activations have
    bias = mx.random.normal((67,))
    s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
    offsets = mx.repeat(b32, group, axis=1)  # (N, K): each weight's b
    scaled = mx.dequantize(packed, s32, b32, group_size=group, bits=bits) - offsets
    want = _integer_rounded(x) @ scaled.T + x @ offsets.T + bias
    got = quantized_matmul_native(
        x, packed, scales, biases, bits=bits, group_size=group, bias=bias, integer_activations=True, vnni=vnni
    )
    assert mx.abs(got - want).max().item() < 5e-5  # the float x would be off by 3e-4 or more here
    exact = quantized_matmul_reference(x, packed, scales, biases, bits=bits, group_size=group, bias=bias)
    error = mx.abs(got - exact.astype(mx.float32)).max().item() / mx.abs(exact).max().item()
    assert 0 < error < 1e-3  # the integers really are used, and cost about 1e-4 of the output


@pytest.mark.parametrize("bits,vnni", INTEGER_PATHS)
def test_integer_products_of_the_largest_codes_do_not_saturate(bits, vnni):
    """Codes of 0 and 2^bits - 1 against positive x of one size (its high bytes near 127): as
    unsigned bytes, 8-bit weights would sum 2 * 255 * 127 in vpmaddubsw's int16 and saturate;
    6-bit ones sum two such pairs (32,004) in int16 before widening. Both must stay exact."""
    _skip_without_integer_path(bits, vnni)
    rng = np.random.default_rng(bits)
    codes = np.where(rng.random((40, 256)) < 0.5, 0, 2**bits - 1)
    # MLX's layout: each row one little-endian bit string, `bits` per value
    stream = ((codes[..., None] >> np.arange(bits)) & 1).astype(np.uint8).reshape(40, 256 * bits)
    packed = mx.array(np.packbits(stream, axis=1, bitorder="little").view(np.uint32))
    scales = mx.array(rng.uniform(0.01, 0.02, (40, 8)).astype(np.float32))
    biases = mx.array(rng.uniform(-0.2, 0.2, (40, 8)).astype(np.float32))
    dense = mx.dequantize(packed, scales, biases, group_size=32, bits=bits)
    assert mx.allclose(dense, mx.repeat(scales, 32, 1) * mx.array(codes, mx.float32) + mx.repeat(biases, 32, 1)).item()
    x = 1.0 + 0.01 * mx.abs(mx.random.normal((3, 256)))
    offsets = mx.repeat(biases, 32, axis=1)
    scaled = mx.dequantize(packed, scales, biases, group_size=32, bits=bits) - offsets
    want = _integer_rounded(x) @ scaled.T + x @ offsets.T
    got = quantized_matmul_native(
        x, packed, scales, biases, bits=bits, group_size=32, integer_activations=True, vnni=vnni
    )
    assert mx.abs(got - want).max().item() < 1e-4 * mx.abs(want).max().item()


@pytest.mark.parametrize("bits,vnni", INTEGER_PATHS)
def test_integer_rows_alone_and_in_a_tile_give_the_same_bits(bits, vnni):
    """A verify pass's rows (tiles of 4) must match one-row decode steps bit for bit, or
    greedy speculative decoding would drift from plain decoding."""
    _skip_without_integer_path(bits, vnni)
    # 5 spans: a pair's tail too; 43 columns: one row takes them 4 at a time, the last 3 alone
    packed, scales, biases = _quantized(43, 320, bits, 64, mx.float16, seed=9)
    x = mx.random.normal((30, 320))  # up to the few-row limit: 7 tiles of 4, then 2 rows alone
    options = dict(bits=bits, group_size=64, integer_activations=True, vnni=vnni)
    together = quantized_matmul_native(x, packed, scales, biases, **options)
    for i in range(30):
        alone = quantized_matmul_native(x[i : i + 1], packed, scales, biases, **options)
        assert mx.array_equal(alone[0], together[i]).item()


@pytest.mark.parametrize("bits", [4, 5, 6])  # 8 bits: AVX2 sums q - 128 and adds 128 * s * sum(x) back
def test_vnni_and_avx2_integer_products_agree_to_float_rounding(bits):
    """Both paths sum the same integers exactly; VNNI-512 adds each pair of spans' float terms
    in another order, so they agree to float rounding, not bit for bit."""
    if not _has_vnni():
        pytest.skip("no VNNI-512 (AVX512 F/BW/VL/DQ/VNNI) on this CPU: only the AVX2 products run")
    packed, scales, biases = _quantized(300, 1536, bits, 32, mx.float16, seed=4)
    x = mx.random.normal((3, 1536))
    wide, avx2 = (
        quantized_matmul_native(x, packed, scales, biases, bits=bits, group_size=32, vnni=v) for v in (True, False)
    )
    assert 0 < mx.abs(wide - avx2).max().item() < 1e-5 * mx.abs(avx2).max().item()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_same_numbers(threads, monkeypatch):
    packed, scales, biases = _quantized(200, 128, 4, 32, mx.float16, seed=1)
    x = mx.random.normal((2, 128))
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", 1)
    one = quantized_matmul_native(x, packed, scales, biases, bits=4, group_size=32)
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
    for _ in range(20):  # the pool's threads wake and finish each call, again and again
        assert mx.array_equal(quantized_matmul_native(x, packed, scales, biases, bits=4, group_size=32), one).item()


def test_shapes_the_kernel_does_not_take_are_declined():
    packed, scales, biases = _quantized(8, 96, 4, 32, mx.float32, seed=2)
    with pytest.raises(NativeUnsupported):  # 3-bit
        quantized_matmul_native(mx.ones((1, 96)), packed, scales, biases, bits=3, group_size=32)
    with pytest.raises(NativeUnsupported):  # x does not match the weight
        quantized_matmul_native(mx.ones((1, 64)), packed, scales, biases, bits=4, group_size=32)
    with pytest.raises(NativeUnsupported):  # no biases (a non-affine mode)
        quantized_matmul_native(mx.ones((1, 96)), packed, scales, None, bits=4, group_size=32)


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_the_lookup_equals_mlx_dequantize(bits, kernel_path):
    packed, scales, biases = _quantized(50, 64, bits, 32, mx.float16, seed=3)
    ids = mx.array([[0, 49, 7], [7, 3, 1]])
    want = mx.dequantize(
        packed[ids], scales[ids].astype(mx.float32), biases[ids].astype(mx.float32), group_size=32, bits=bits
    )
    got = quantized_gather_native(ids, packed, scales, biases, bits=bits, group_size=32)
    assert got.shape == (2, 3, 64) and mx.allclose(got, want, atol=1e-6).item()
    if kernel_path == "ctypes":  # an id out of the table: declined before anything runs
        with pytest.raises(NativeUnsupported):
            quantized_gather_native(mx.array([50]), packed, scales, biases, bits=bits, group_size=32)
    else:  # the lazy node finds it when it runs, and says so
        with pytest.raises(RuntimeError, match="outside the vocabulary"):
            mx.eval(quantized_gather_native(mx.array([50]), packed, scales, biases, bits=bits, group_size=32))
        assert mx.allclose(
            quantized_gather_native(ids, packed, scales, biases, bits=bits, group_size=32), want, atol=1e-6
        ).item()  # and the next lookup is fine


@pytest.mark.parametrize("rows", [1, 4, 40])
def test_the_primitive_stays_lazy_inside_a_compiled_graph(rows, kernel_path):
    """mx.compile traces with placeholders: an eager kernel that evaluates its input cannot run there."""
    if kernel_path == "ctypes":
        pytest.skip("the eager ctypes path evaluates its inputs, which a traced graph cannot do")
    packed, scales, biases = _quantized(96, 64, 4, 32, mx.float16, seed=rows)
    bias = mx.random.normal((96,))

    def layer(x):  # float x: the exact comparison below checks the graph, not the rounding
        y = quantized_matmul_native(
            x * 2, packed, scales, biases, bits=4, group_size=32, bias=bias, integer_activations=False
        )
        return mx.tanh(y)

    x = mx.random.normal((rows, 64))
    want = mx.tanh(quantized_matmul_reference(x * 2, packed, scales, biases, bits=4, group_size=32, bias=bias))
    assert mx.allclose(mx.compile(layer)(x), want, atol=1e-5).item()
    strided = mx.random.normal((64, rows)).T  # a transposed view is read through a copy
    want = mx.tanh(quantized_matmul_reference(strided * 2, packed, scales, biases, bits=4, group_size=32, bias=bias))
    assert mx.allclose(layer(strided), want, atol=1e-5).item()


class _TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.proj = nn.Linear(64, 96, bias=True)
        self.down = nn.Linear(96, 64, bias=False)

    def __call__(self, ids):
        return self.embed.as_linear(self.down(self.proj(self.embed(ids))))


def test_swapped_quantized_layers_run_natively_and_keep_the_function(monkeypatch):
    mx.random.seed(4)
    net = _TinyNet()
    nn.quantize(net, group_size=32, bits=4)
    ids = mx.array([[1, 2, 3, 4, 5]])
    want = net(ids)
    weight = net.proj.weight
    assert use_native_layers(net) == 3
    assert type(net.proj) is NativeQuantizedLinear and type(net.embed) is NativeQuantizedEmbedding
    assert net.proj.weight is weight  # the same arrays, not a copy
    calls = []
    real = quantized_matmul.quantized_matmul_native
    monkeypatch.setattr(
        quantized_matmul, "quantized_matmul_native", lambda x, *a, **k: calls.append(x.shape) or real(x, *a, **k)
    )
    assert mx.allclose(net(ids), want, atol=1e-4, rtol=1e-4).item()
    assert calls == [(1, 5, 64), (1, 5, 96), (1, 5, 64)]  # proj, down and the tied head
    with blas_only(net):  # the benchmark's A/B: MLX's own quantized matmul
        assert mx.allclose(net(ids), want, atol=1e-4, rtol=1e-4).item()
    assert len(calls) == 3


def test_without_the_native_library_mlx_runs_the_quantized_layers(monkeypatch):
    monkeypatch.setattr(ctypes_library, "_state", {"loaded": Loaded(None, "off", note="turned off for the test")})
    net = _TinyNet()
    nn.quantize(net, group_size=32, bits=8)
    assert use_native_layers(net) == 0 and type(net.proj) is nn.QuantizedLinear
    assert net(mx.array([[1, 2]])).shape == (1, 2, 100)


def test_a_layer_keeps_its_checked_call_only_for_the_arrays_it_checked(kernel_path):
    """The prepared fast path must follow the layer's weights: new weights are checked anew."""
    mx.random.seed(11)
    net = _TinyNet()
    nn.quantize(net, group_size=32, bits=4)
    use_native_layers(net)
    x = mx.random.normal((1, 64))
    first = net.proj(x)
    prepared = net.proj.__dict__.get("_prepared")
    assert (prepared is not None) == (kernel_path == "mlx-primitive")  # ctypes calls take no shortcut
    assert mx.allclose(net.proj(x), first, atol=1e-6).item()  # the shortcut gives the same numbers
    packed, scales, biases = mx.quantize(mx.random.normal((96, 64)), group_size=32, bits=4)
    net.proj.update({"weight": packed, "scales": scales, "biases": biases})
    want = quantized_matmul_reference(x, packed, scales, biases, bits=4, group_size=32, bias=net.proj.bias)
    assert mx.allclose(net.proj(x), want, atol=2e-3, rtol=2e-3).item()
    assert not mx.allclose(net.proj(x), first, atol=1e-2).item()
    doubled = net.proj.scales * 2  # only the scales replaced: still checked anew
    net.proj.update({"scales": doubled})
    want = quantized_matmul_reference(x, packed, doubled, biases, bits=4, group_size=32, bias=net.proj.bias)
    assert mx.allclose(net.proj(x), want, atol=2e-3, rtol=2e-3).item()
    strided = _TinyNet()
    nn.quantize(strided, group_size=32, bits=8)
    use_native_layers(strided)
    packed = strided.proj.weight
    view = mx.contiguous(packed.T).T  # the same values, as a strided view in memory
    mx.eval(view)
    strided.proj.update({"weight": view})
    want = quantized_matmul_reference(
        x, packed, strided.proj.scales, strided.proj.biases, bits=8, group_size=32, bias=strided.proj.bias
    )
    assert mx.allclose(strided.proj(x), want, atol=1e-4).item()  # MLX's op takes it
    assert strided.proj.__dict__.get("_prepared") is None  # the kernel declined it, so no shortcut either
