"""The native SwiGLU activation against mlx-lm's own, and its rebinding in model modules."""

import math
import shutil

import mlx.core as mx
import numpy as np
import pytest

from brisk.kernels import activation, mlx_extension, native_attention
from brisk.kernels.activation import (
    MLX_LM_SWIGLU,
    mlx_activation_only,
    swiglu,
    swiglu_native,
    swiglu_reference,
    use_native_activation,
)
from brisk.kernels.native_attention import NativeUnsupported
from brisk.kernels.prebuilt import Loaded

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the MLX primitives")


@pytest.fixture(autouse=True)
def primitives():
    if mlx_extension.load() is None:
        pytest.skip(f"the MLX primitives cannot be built here: {mlx_extension.unavailable_reason()}")


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 8), (2, 5, 37), (1, 9, 4096), (2, 100, 1000)])
def test_native_equals_mlx_lm(shape):
    """Lengths below, at and past the 8-lane vector and the threads' 16,384-element units."""
    mx.random.seed(sum(shape))
    gate, x = mx.random.normal(shape) * 6, mx.random.normal(shape)
    got, want = swiglu_native(gate, x), swiglu_reference(gate, x)
    assert got.shape == want.shape and got.dtype == mx.float32
    assert mx.allclose(got, want, rtol=2e-6, atol=1e-7).item()


def test_extreme_gates_behave_as_mlx_lm():
    """exp(-|g|) cannot overflow: huge gates give exactly 0 or g * x; inf and NaN as MLX gives them.
    exp below 2^-126 flushes to 0 (g = -88 gives -0 where MLX gives -8e-37)."""
    values = [-1e4, -200.0, -88.0, -30.0, -1e-30, 0.0, 1e-30, 30.0, 88.0, 200.0, 1e4, math.inf, -math.inf, math.nan]
    gate = mx.array(values * 2)  # 28 values: three vectors and a scalar tail
    x = mx.full(gate.shape, 1.5)
    got, want = np.array(swiglu_native(gate, x)), np.array(swiglu_reference(gate, x))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=1e-35)


def test_strided_inputs_are_read_through_their_strides():
    mx.random.seed(3)
    gate, x = mx.random.normal((64, 48)), mx.random.normal((48, 64))
    got = swiglu_native(gate.T, x)  # a transposed view: gathered before the kernel
    assert mx.allclose(got, swiglu_reference(gate.T, x), rtol=2e-6, atol=1e-7).item()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_any_thread_count_gives_the_same_bits(threads, monkeypatch):
    gate, x = mx.random.normal((5, 20000)), mx.random.normal((5, 20000))  # several units of 16,384
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", 1)
    one = swiglu_native(gate, x)
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
    assert mx.array_equal(swiglu_native(gate, x), one).item()


def test_what_the_kernel_does_not_take_goes_to_mlx_lm():
    gate16, x16 = mx.random.normal((4, 32)).astype(mx.float16), mx.random.normal((4, 32)).astype(mx.float16)
    with pytest.raises(NativeUnsupported):
        swiglu_native(gate16, x16)
    with pytest.raises(NativeUnsupported):
        swiglu_native(mx.zeros((4, 32)), mx.zeros((1, 32)))  # broadcasting is mlx-lm's
    assert mx.array_equal(swiglu(gate16, x16), swiglu_reference(gate16, x16)).item()
    gate, x = mx.random.normal((1, 32)), mx.random.normal((4, 32))
    assert mx.allclose(swiglu(gate, x), swiglu_reference(gate, x)).item()


def test_the_primitive_stays_lazy_inside_a_compiled_graph():
    gate, x = mx.random.normal((3, 40)), mx.random.normal((3, 40))
    step = mx.compile(lambda g, v: swiglu(g, v).sum(axis=-1) * 2)
    assert mx.allclose(step(gate, x), swiglu_reference(gate, x).sum(axis=-1) * 2, rtol=1e-5).item()


def test_a_loaded_model_runs_the_kernel_and_keeps_its_function(tmp_path, monkeypatch):
    from mlx_lm.models import llama

    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    calls = []

    def counting(gate, x):
        calls.append(gate.shape)
        return swiglu_native(gate, x)

    monkeypatch.setattr(llama, "swiglu", MLX_LM_SWIGLU)  # as a fresh process finds it
    lm = load_folder(make_tiny_model(tmp_path / "llama", "llama"), model_id="llama")
    assert llama.swiglu is swiglu and use_native_activation(lm.model) >= 1
    tokens = mx.array([[1, 5, 9, 2, 7]])
    monkeypatch.setattr(activation, "swiglu_native", counting)
    got = lm.model(tokens)
    assert calls, "the model's MLP did not reach the kernel"
    with mlx_activation_only():
        want = lm.model(tokens)
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item()
    assert mx.array_equal(mx.argmax(got, axis=-1), mx.argmax(want, axis=-1)).item()


def test_without_the_primitives_nothing_is_rebound(tmp_path, monkeypatch):
    from mlx_lm.models import llama

    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    monkeypatch.setattr(mlx_extension, "_state", {"loaded": Loaded(None, "off", note="turned off for the test")})
    monkeypatch.setattr(llama, "swiglu", MLX_LM_SWIGLU)
    lm = load_folder(make_tiny_model(tmp_path / "llama", "llama"), model_id="llama")
    assert use_native_activation(lm.model) == 0
    assert llama.swiglu is MLX_LM_SWIGLU
