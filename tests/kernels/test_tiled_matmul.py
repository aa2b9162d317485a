"""Quantized weights in column tiles (kernels/tiled_matmul.py): the layout's definition in MLX
ops, the native repack against it, the kernel against MLX's quantized matmul on the same x
rounded to integers, rows alone against rows together bit for bit, and the layers a load
repacks."""

import shutil
import threading

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from brisk.kernels import ctypes_library, mlx_extension, native_attention, quantized_matmul, tiled_matmul
from brisk.kernels.coarse import COARSE, coarse_products
from brisk.kernels.native_layers import blas_only, use_native_layers
from brisk.kernels.quantized_matmul import NativeQuantizedLinear, quantized_matmul_reference
from brisk.kernels.tiled_matmul import (
    TiledQuantizedEmbedding,
    TiledQuantizedLinear,
    repack_native,
    tile,
    tiled_bits,
    tiled_gather_native,
    tiled_matmul_native,
    tiled_matmul_reference,
    untile,
    use_tiled_layers,
    why_not_tiled,
)
from tests.pairwise import rotate_over

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
VNNI_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}


def _cpu_flags() -> set[str]:
    try:
        return set(open("/proc/cpuinfo").read().split())
    except OSError:
        return set()


def _kernels_run_here() -> bool:
    primitives = mlx_extension.load() if HAVE_COMPILER else None
    return primitives is not None and primitives.tiled_available()


needs_kernels = pytest.mark.skipif(
    not _kernels_run_here(), reason="the tiled kernels need AVX512-VNNI (F/BW/VL/DQ/VNNI) and the MLX primitives"
)


def _quantized(n, k, bits, group, dtype=mx.float16, seed=0):
    mx.random.seed(seed)
    weight = mx.random.normal((n, k)) * 0.05
    packed, scales, biases = mx.quantize(weight, group_size=group, bits=bits)
    return packed, scales.astype(dtype), biases.astype(dtype)


def _integer_rounded(x: mx.array) -> mx.array:
    """x as the kernel sees it: each block of 32 values rounded to q * d, d = max|x| / (127 * 128)."""
    v = np.array(x, np.float32).reshape(-1, 32)
    d = np.abs(v).max(axis=1, keepdims=True) / np.float32(127 * 128)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    return mx.array((np.rint(v * inverse) * d).reshape(x.shape))


def _same(a, b) -> bool:
    return all(mx.array_equal(x, y).item() and x.dtype == y.dtype and x.shape == y.shape for x, y in zip(a, b))


# --- the layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_untile_inverts_tile_and_every_array_keeps_its_shape(bits, group, dtype):
    arrays = _quantized(48, 320, bits, group, dtype, seed=bits + group)
    tiled = tile(*arrays, bits)
    assert [(a.shape, a.dtype) for a in tiled] == [(a.shape, a.dtype) for a in arrays]
    assert not mx.array_equal(tiled[0], arrays[0]).item()  # the bytes really moved
    assert _same(untile(*tiled, bits), arrays)


@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_the_layout_puts_each_columns_quad_in_its_lane(bits):
    """Spot-check `tile` against its docstring: column c's values k .. k + 3 of block j sit at
    bytes 4c .. 4c + 3 of quad u = (k % 32) / 4 (8 bits: that quad's own 64 bytes; 4 and 5 bits:
    the low nibbles of chunk u / 2 for even u, the high ones for odd u; 5 bits add quad u's
    fifth bits as a mask, 6 bits its top two at bits 2(u % 4) of chunk u / 4)."""
    n, k = 32, 64
    values = mx.array(np.random.default_rng(bits).integers(0, 2**bits, size=(n, k)), dtype=mx.uint8)
    packed = tiled_matmul._mlx_packed(values, bits)
    ones = mx.ones((n, k // 32), mx.float16)
    raw = np.array(tile(packed, ones, ones, bits)[0].view(mx.uint8)).reshape(-1)
    v = np.array(values)
    per_block = 16 * 32 * bits // 8
    for t, c, j, u in [(0, 0, 0, 0), (1, 5, 1, 3), (0, 15, 1, 6), (1, 9, 0, 7)]:
        block = raw[(t * (k // 32) + j) * per_block :][:per_block]
        want = v[16 * t + c, 32 * j + 4 * u : 32 * j + 4 * u + 4]
        if bits == 8:
            got = block[64 * u + 4 * c :][:4]
        else:
            got = (block[64 * (u // 2) + 4 * c :][:4] >> (4 * (u % 2))) & 15
            if bits == 5:
                mask = int.from_bytes(block[256 + 8 * u :][:8].tobytes(), "little")
                got = got | np.array([((mask >> (4 * c + i)) & 1) << 4 for i in range(4)])
            if bits == 6:
                got = got | (((block[256 + 64 * (u // 4) + 4 * c :][:4] >> (2 * (u % 4))) & 3) << 4)
        assert list(got) == list(want)


@needs_kernels
@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_the_native_repack_equals_the_layout_byte_for_byte(bits, group, dtype):
    arrays = _quantized(80, 576, bits, group, dtype, seed=3)  # 5 tiles (threads split them unevenly)
    assert _same(repack_native(*arrays, bits), tile(*arrays, bits))


# --- the kernel -------------------------------------------------------------------------------


def _coarse_rounded(x: mx.array) -> mx.array:
    """x as the kernel's coarse mode sees it: q as above, then round(q / 128) * 128 (8 bits)."""
    v = np.array(x, np.float32).reshape(-1, 32)
    d = np.abs(v).max(axis=1, keepdims=True) / np.float32(127 * 128)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(v * inverse).astype(np.int32)
    return mx.array((np.floor((q + 64) / 128) * 128 * d).reshape(x.shape).astype(np.float32))


@needs_kernels
@pytest.mark.parametrize("bits", [4, 6])
@pytest.mark.parametrize("rows", [1, 5, 70])  # a lone row, a tail of one after four, prefill
def test_coarse_products_round_x_to_8_bits_and_only_inside_their_block(bits, rows):
    """Inside coarse_products() products meet x rounded to 8 bits a block (one integer pass):
    against MLX on that x only float rounding is left; the exact product is ~100x closer to
    MLX on x itself. Outside the block, and on other threads, products stay exact."""
    n, k, group = 48, 320, 32
    packed, scales, biases = _quantized(n, k, bits, group, mx.float16, seed=rows)
    x = mx.random.normal((1, rows, k))
    tiled = repack_native(packed, scales, biases, bits)
    s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
    offsets = mx.repeat(b32, group, axis=1)
    scaled = mx.dequantize(packed, s32, b32, group_size=group, bits=bits) - offsets
    with coarse_products():
        coarse = tiled_matmul_native(x, *tiled, bits=bits, group_size=group)
        elsewhere: list = []
        worker = threading.Thread(target=lambda: elsewhere.append(COARSE.active))
        worker.start()
        worker.join()
    exact = tiled_matmul_native(x, *tiled, bits=bits, group_size=group)
    assert elsewhere == [False] and not COARSE.active
    want = _coarse_rounded(x) @ scaled.T + x @ offsets.T
    assert mx.abs(coarse - want).max().item() < 5e-5
    mlx = quantized_matmul_reference(x, packed, scales, biases, bits=bits, group_size=group).astype(mx.float32)
    top = mx.abs(mlx).max().item()
    coarse_error, exact_error = (mx.abs(y - mlx).max().item() / top for y in (coarse, exact))
    assert 1e-3 < coarse_error < 3e-2 and exact_error < coarse_error / 20


@needs_kernels
@pytest.mark.parametrize(
    # Every bits, group, rows and shape together (they choose the code path); the scales' dtype
    # (how each group's scale is read) meets each of their values: 96 cases, not 288.
    *rotate_over(
        {
            "bits": [4, 5, 6, 8],
            "group": [32, 64],
            "rows": [1, 3, 4, 7, 33, 70],  # decode, verify passes, prefill-sized
            "n,k": [(48, 320), (112, 64)],  # odd tile counts: pairs and fours with a tail
        },
        "dtype",
        [mx.float32, mx.float16, mx.bfloat16],
    )
)
def test_the_kernel_is_mlx_on_x_rounded_to_integers(bits, group, dtype, rows, n, k):
    """Weights meet x rounded to 15-bit integers per block of 32, each group's bias b meets the
    float sum of x: against that, only float rounding is left."""
    packed, scales, biases = _quantized(n, k, bits, group, dtype, seed=rows + bits)
    x = mx.random.normal((1, rows, k))
    x = x.at[0, 0, 5].add(40.0)  # an outlier channel, as SmolLM2's activations have
    bias = mx.random.normal((n,))
    s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
    offsets = mx.repeat(b32, group, axis=1)
    scaled = mx.dequantize(packed, s32, b32, group_size=group, bits=bits) - offsets
    want = _integer_rounded(x) @ scaled.T + x @ offsets.T + bias
    got = tiled_matmul_native(x, *repack_native(packed, scales, biases, bits), bits=bits, group_size=group, bias=bias)
    assert got.shape == (1, rows, n) and got.dtype == mx.float32
    assert mx.abs(got - want).max().item() < 5e-5
    exact = quantized_matmul_reference(x, packed, scales, biases, bits=bits, group_size=group, bias=bias)
    error = mx.abs(got - exact.astype(mx.float32)).max().item() / mx.abs(exact).max().item()
    assert 0 < error < 1e-3  # the integers really are used, and cost about 1e-4 of the output


@needs_kernels
@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("rows", [2, 3, 6, 37])
def test_rows_alone_and_together_give_the_same_bits(bits, rows):
    """A verify pass's rows and a prefill's must equal one-row decode steps bit for bit (greedy
    speculative decoding equals plain decoding only then). Up to six rows each tile is read
    once (6: a four and a two); 37 rows are nine fours and a one, and 7 tiles take prefill's
    pairs and a single."""
    packed, scales, biases = repack_native(*_quantized(112, 320, bits, 64, seed=9), bits)
    x = mx.random.normal((rows, 320))
    together = tiled_matmul_native(x, packed, scales, biases, bits=bits, group_size=64)
    for i in range(rows):
        alone = tiled_matmul_native(x[i : i + 1], packed, scales, biases, bits=bits, group_size=64)
        assert mx.array_equal(alone[0], together[i]).item()


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_same_numbers(threads, monkeypatch):
    arrays = repack_native(*_quantized(208, 256, 4, 32, seed=1), 4)
    x = mx.random.normal((9, 256))
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", 1)
    one = tiled_matmul_native(x, *arrays, bits=4, group_size=32)
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
    assert mx.array_equal(tiled_matmul_native(x, *arrays, bits=4, group_size=32), one).item()


@needs_kernels
@pytest.mark.parametrize("bits", [4, 5, 6, 8])
def test_the_lookup_equals_mlx_dequantize(bits):
    packed, scales, biases = _quantized(64, 192, bits, 32, mx.bfloat16, seed=bits)
    ids = mx.array([[0, 17, 63], [5, 5, 40]])
    want = mx.dequantize(packed, scales.astype(mx.float32), biases.astype(mx.float32), group_size=32, bits=bits)[ids]
    tiled = repack_native(packed, scales, biases, bits)
    got = tiled_gather_native(ids, *tiled, bits=bits, group_size=32)
    assert got.shape == (2, 3, 192) and mx.allclose(got, want, atol=1e-6).item()
    with pytest.raises(Exception, match="outside the vocabulary"):
        mx.eval(tiled_gather_native(mx.array([64]), *tiled, bits=bits, group_size=32))


@needs_kernels
def test_the_primitive_stays_lazy_inside_a_compiled_graph():
    arrays = repack_native(*_quantized(96, 64, 8, 32, seed=2), 8)

    def layer(x):
        return mx.tanh(tiled_matmul_native(x * 2, *arrays, bits=8, group_size=32))

    x = mx.random.normal((3, 64))
    assert mx.array_equal(mx.compile(layer)(x), layer(x)).item()
    strided = mx.random.normal((64, 3)).T  # a transposed view is read through a copy
    assert mx.allclose(layer(strided), layer(mx.contiguous(strided)), atol=0).item()


def test_the_reference_untiles_and_asks_mlx():
    packed, scales, biases = _quantized(32, 128, 5, 32, seed=5)
    x = mx.random.normal((4, 128))
    want = quantized_matmul_reference(x, packed, scales, biases, bits=5, group_size=32)
    got = tiled_matmul_reference(x, *tile(packed, scales, biases, 5), bits=5, group_size=32)
    assert mx.array_equal(got, want).item()


# --- when it is used, and the layers ------------------------------------------------------------


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the native kernels")
def test_tiles_are_used_where_the_cpu_has_vnni_and_on_amx_for_the_bits_amx_does_not_take(monkeypatch):
    flags = _cpu_flags()
    reason = why_not_tiled()
    if mlx_extension.load() is None:
        assert reason.startswith("no MLX primitives")
    elif not VNNI_FLAGS <= flags:
        assert reason.startswith("this CPU has no AVX512-VNNI")
    elif "amx_int8" in flags and ctypes_library.load().brisk_amx_available():
        assert reason is None and tiled_bits() == {6}  # AMX's prefill tiles take 4, 5 and 8 bits
    else:
        assert reason is None and tiled_bits() == {4, 5, 6, 8}
    monkeypatch.setattr(tiled_matmul, "ENABLED", False)
    assert why_not_tiled() == "turned off (BRISK_TILED=0)"


class _TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(96, 64)
        self.proj = nn.Linear(64, 96, bias=True)
        self.down = nn.Linear(96, 64, bias=False)
        self.odd = nn.Linear(64, 24, bias=False)  # 24 columns: not whole tiles, stays in MLX's layout

    def __call__(self, ids):
        h = self.down(self.proj(self.embed(ids)))
        return self.embed.as_linear(h), self.odd(h)


def _tiny(bits=4):
    mx.random.seed(4)
    net = _TinyNet()
    nn.quantize(net, group_size=32, bits=bits)
    use_native_layers(net)
    return net


@needs_kernels
@pytest.mark.parametrize("bits", [4, 8])
def test_a_repacked_net_answers_as_before_and_holds_as_many_bytes(bits, monkeypatch):
    monkeypatch.setattr(quantized_matmul, "AMX", False)  # a plan that tiles every width
    net = _tiny(bits)
    ids = mx.array([[1, 2, 3, 4, 5]])
    head, odd = net(ids)
    shapes = {k: (v.shape, v.dtype) for k, v in nn.utils.tree_flatten(net.parameters())}
    assert use_tiled_layers(net) == 3  # the embedding (and tied head), proj and down
    assert type(net.proj) is TiledQuantizedLinear and type(net.embed) is TiledQuantizedEmbedding
    assert type(net.odd) is NativeQuantizedLinear
    assert {k: (v.shape, v.dtype) for k, v in nn.utils.tree_flatten(net.parameters())} == shapes
    head2, odd2 = net(ids)  # the tiled products round x to integers as the native ones do, in another order
    assert mx.allclose(head2, head, atol=1e-4, rtol=1e-3).item() and mx.allclose(odd2, odd, atol=1e-4).item()
    with blas_only(net):  # the benchmark's A/B: MLX's own op on the untiled weights
        assert mx.allclose(net(ids)[0], head, atol=1e-4, rtol=1e-3).item()


@needs_kernels
def test_weights_put_in_after_the_repack_are_read_in_mlxs_layout(monkeypatch):
    monkeypatch.setattr(quantized_matmul, "AMX", False)  # a plan that tiles every width
    net = _tiny()
    use_tiled_layers(net)
    packed, scales, biases = mx.quantize(mx.random.normal((96, 64)), group_size=32, bits=4)
    net.proj.update({"weight": packed, "scales": scales, "biases": biases})
    x = mx.random.normal((1, 64))
    want = quantized_matmul_reference(x, packed, scales, biases, bits=4, group_size=32, bias=net.proj.bias)
    assert mx.allclose(net.proj(x), want, atol=2e-3, rtol=2e-3).item()


def test_without_the_kernels_nothing_is_repacked(monkeypatch):
    monkeypatch.setattr(tiled_matmul, "ENABLED", False)
    net = _tiny()
    assert use_tiled_layers(net) == 0 and type(net.proj) is not TiledQuantizedLinear
