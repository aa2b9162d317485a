"""The few-row native matmul (speculative verify) against MLX's own matmul."""

import shutil

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from brisk.kernels import ctypes_library, mlx_extension, native_attention, skinny_matmul
from brisk.kernels.native_attention import NativeUnsupported
from brisk.kernels.native_layers import blas_only, use_native_layers, verify_path
from brisk.kernels.prebuilt import Loaded
from brisk.kernels.quantized_matmul import NativeQuantizedLinear
from brisk.kernels.skinny_matmul import (
    SkinnyEmbedding,
    SkinnyLinear,
    float_gemm_native,
    skinny_matmul_native,
)

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
needs_native = pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the native kernel")
pytestmark = pytest.mark.usefixtures("kernel_path")


@needs_native
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 8, 13, 16])
@pytest.mark.parametrize("k,n", [(64, 96), (37, 11), (200, 129)])  # K not a multiple of 8, N odd
@pytest.mark.parametrize("with_bias", [False, True])
def test_native_matmul_equals_mlx(rows, k, n, with_bias):
    mx.random.seed(rows * 1000 + k + n)
    x, w = mx.random.normal((rows, k)), mx.random.normal((n, k))
    bias = mx.random.normal((n,)) if with_bias else None
    want = x @ w.T + (bias if with_bias else 0)
    got = skinny_matmul_native(x, w, bias)
    assert got.shape == (rows, n) and got.dtype == mx.float32
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item()


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 7])
def test_native_matmul_splits_columns_across_threads(monkeypatch, threads):
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
    x, w = mx.random.normal((1, 5, 256)), mx.random.normal((1000, 256))  # batch and position axes kept
    got = skinny_matmul_native(x, w)
    assert got.shape == (1, 5, 1000)
    assert mx.allclose(got, x @ w.T, atol=1e-4, rtol=1e-4).item()


@needs_native
def test_native_matmul_refuses_what_it_does_not_take():
    w = mx.random.normal((8, 16))
    with pytest.raises(NativeUnsupported, match="float32"):
        skinny_matmul_native(mx.ones((2, 16), mx.bfloat16), w)
    with pytest.raises(NativeUnsupported, match="shapes"):
        skinny_matmul_native(mx.ones((17, 16)), w)
    strided = w.T
    mx.eval(strided)  # a weight in memory as a transposed view: copying it every call costs more than BLAS
    with pytest.raises(NativeUnsupported, match="strided"):
        skinny_matmul_native(mx.ones((2, 8)), strided)


def _tiny_net(tied: bool = True):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 32)
            self.proj = nn.Linear(32, 64, bias=True)
            self.down = nn.Linear(64, 32, bias=False)
            self.head = None if tied else nn.Linear(32, 50)

        def __call__(self, ids):
            h = self.down(nn.silu(self.proj(self.embed(ids))))
            return self.embed.as_linear(h) if self.head is None else self.head(h)

    net = Net()
    mx.eval(net.parameters())
    return net


@needs_native
def test_swapped_layers_route_few_rows_to_the_kernel_and_keep_the_function(monkeypatch):
    net = _tiny_net()
    ids = mx.array([[1, 2, 3, 4, 5]])
    want_many, want_one = net(ids), net(ids[:, :1])
    weight = net.proj.weight
    assert use_native_layers(net) == 3
    assert type(net.proj) is SkinnyLinear and type(net.embed) is SkinnyEmbedding
    assert net.proj.weight is weight  # the same arrays, not a copy
    calls = []
    monkeypatch.setattr(
        skinny_matmul, "skinny_matmul_native", lambda x, *a: calls.append(x.shape) or skinny_matmul_native(x, *a)
    )
    assert mx.allclose(net(ids), want_many, atol=1e-5).item()
    assert calls == [(1, 5, 32), (1, 5, 64), (1, 5, 32)]  # proj, down, tied head
    assert mx.allclose(net(ids[:, :1]), want_one, atol=1e-5).item()
    assert len(calls) == 3  # one row stays with BLAS
    with blas_only(net):
        assert verify_path(net) == "blas"
        net(ids)
    assert len(calls) == 3 and verify_path(net) == "native"
    other = _tiny_net()
    use_native_layers(other)
    with blas_only(net):  # the route is the model's own: another model keeps the kernel
        assert verify_path(other) == "native"


@needs_native
def test_quantized_and_half_precision_layers_stay_with_mlx(monkeypatch):
    net = _tiny_net(tied=False)
    nn.quantize(net, group_size=32, bits=4, class_predicate=lambda p, m: p == "down")
    assert use_native_layers(net) == 4  # embed, proj, head and the quantized down projection
    assert type(net.down) is NativeQuantizedLinear  # kernels/quantized_matmul.py's, not this kernel's
    calls = []
    monkeypatch.setattr(
        skinny_matmul, "skinny_matmul_native", lambda x, *a: calls.append(x.shape) or skinny_matmul_native(x, *a)
    )
    net.set_dtype(mx.bfloat16)
    out = net(mx.array([[1, 2, 3]]))
    assert calls == [] and out.dtype == mx.bfloat16


def test_without_the_native_library_nothing_is_swapped(monkeypatch):
    monkeypatch.setattr(ctypes_library, "_state", {"loaded": Loaded(None, "off", note="turned off for the test")})
    net = _tiny_net()
    assert use_native_layers(net) == 0 and type(net.proj) is nn.Linear
    assert verify_path(net) == "blas"


@needs_native
@pytest.mark.parametrize("arch", ["qwen2", "gemma3_text", "gpt_oss"])
def test_loaded_models_verify_through_the_kernel_with_the_same_logits(tmp_path, arch, monkeypatch):
    """The loader swaps the layers; a 5-token step after a cached prefix (what a verify pass is)
    goes to the kernel and gives MLX's logits."""
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    lm = load_folder(make_tiny_model(tmp_path / arch, arch), model_id=arch)
    assert any(isinstance(m, SkinnyLinear) for m in lm.model.modules())
    ids = (mx.arange(25)[None] * 7 + 3) % 300

    def logits():
        cache = make_prompt_cache(lm.model)
        lm.model(ids[:, :20], cache=cache)  # 20 rows: a prefill chunk, BLAS's
        return lm.model(ids[:, 20:], cache=cache)

    calls = []
    monkeypatch.setattr(
        skinny_matmul, "skinny_matmul_native", lambda x, *a: calls.append(x.shape) or skinny_matmul_native(x, *a)
    )
    with blas_only(lm.model):
        want = logits()
    assert calls == []
    got = logits()
    assert calls and all(shape[-2] == 5 for shape in calls)
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item()


def _float_gemm_runs_here() -> bool:
    primitives = mlx_extension.load()
    return primitives is not None and primitives.float_gemm_available()


@needs_native
@pytest.mark.parametrize("m,k,n", [(64, 64, 16), (70, 100, 33), (130, 1100, 200), (97, 513, 130)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_float_gemm_equals_mlx_on_prefill_chunks(kernel_path, m, k, n, with_bias):
    """float_gemm.cpp on 64+ rows: row tails (not a multiple of six), column tails (not a
    multiple of 64 or 16), depths past one block of 512 and not a multiple of it."""
    mx.random.seed(m + n)
    x, w = mx.random.normal((1, m, k)), mx.random.normal((n, k)) * 0.1
    bias = mx.random.normal((n,)) if with_bias else None
    want = x @ w.T + (bias if with_bias else 0)
    if kernel_path == "ctypes" or not _float_gemm_runs_here():
        with pytest.raises(NativeUnsupported):
            float_gemm_native(x, w, bias)
        return
    got = float_gemm_native(x, w, bias)
    assert got.shape == want.shape and got.dtype == mx.float32
    assert (mx.abs(got - want).max() / mx.abs(want).max()).item() < 1e-5


@needs_native
def test_float_gemm_gives_a_row_the_same_bits_in_any_chunk(kernel_path):
    """Each output sums its k in the same order whatever the rows around it: a row's result
    does not depend on the chunk size or on where the row tiles of six fall."""
    if kernel_path == "ctypes" or not _float_gemm_runs_here():
        pytest.skip("float_gemm.cpp runs only as an MLX primitive on AVX-512 CPUs")
    x, w = mx.random.normal((100, 700)), mx.random.normal((96, 700))
    whole, head, tail = float_gemm_native(x, w), float_gemm_native(x[:64], w), float_gemm_native(x[31:], w)
    assert mx.array_equal(whole[:64], head).item() and mx.array_equal(whole[31:], tail).item()


@needs_native
def test_prefill_chunks_of_a_swapped_layer_go_to_the_float_gemm_unless_turned_off(kernel_path, monkeypatch):
    net = _tiny_net()
    ids = mx.array([list(range(1, 50)) + list(range(1, 21))])  # 69 rows
    want = net(ids)
    use_native_layers(net)
    calls = []
    monkeypatch.setattr(
        skinny_matmul, "float_gemm_native", lambda x, *a: calls.append(x.shape) or float_gemm_native(x, *a)
    )
    if kernel_path == "ctypes" or not _float_gemm_runs_here():
        assert mx.allclose(net(ids), want, atol=1e-5).item()  # tried, declined, MLX's matmul
        return
    assert mx.allclose(net(ids), want, atol=1e-5).item()
    assert calls == [(1, 69, 32), (1, 69, 64)]  # proj and down (the tied head keeps MLX's)
    monkeypatch.setenv("BRISK_FLOAT_GEMM", "0")
    turned_off = net(ids)
    assert len(calls) == 4 and mx.allclose(turned_off, want, atol=1e-5).item()


@needs_native
def test_float_gemm_gives_the_same_bits_on_any_number_of_threads(kernel_path, monkeypatch):
    """Units split columns (and rows when the columns are few); no output's sum depends on them."""
    if kernel_path == "ctypes" or not _float_gemm_runs_here():
        pytest.skip("float_gemm.cpp runs only as an MLX primitive on AVX-512 CPUs")
    x, w, bias = mx.random.normal((1, 77, 600)), mx.random.normal((200, 600)), mx.random.normal((200,))
    results = []
    for threads in (1, 2, 7):
        monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
        results.append(float_gemm_native(x, w, bias))
        mx.eval(results[-1])
    assert all(mx.array_equal(results[0], other).item() for other in results[1:])
