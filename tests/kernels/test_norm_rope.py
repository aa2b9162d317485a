"""The one-node RMSNorm and RoPE kernels against MLX's own ops, alone and inside loaded models."""

import io
import re
import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.rope_utils import Llama3RoPE

from brisk.engine.accel.positions import install_position_shift, token_positions
from brisk.engine.models.loader import load_folder
from brisk.kernels import mlx_extension, quantized_matmul
from brisk.kernels.native_attention import NativeUnsupported
from brisk.kernels.native_layers import blas_only, use_native_layers
from brisk.kernels.norm_rope import (
    NativeLlama3RoPE,
    NativeRMSNorm,
    NativeRoPE,
    rms_norm_native,
    rms_norm_reference,
    rope_native,
    rope_reference,
)
from brisk.kernels.prebuilt import Loaded
from tests.tiny_models import make_tiny_model

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the MLX primitives")


def _max_error(got, want) -> float:
    return mx.max(mx.abs(got - want)).item()


def _rope_float64(x, dims, *, traditional, base, scale, offset, freqs=None) -> np.ndarray:
    """RoPE in float64: the truth both float32 implementations approximate."""
    v = np.array(x).astype(np.float64)
    half = dims // 2
    inverse = 1 / np.array(freqs, np.float64) if freqs is not None else base ** (-np.arange(half) / half)
    starts = np.array(offset, np.float64).reshape(-1, 1, 1, 1) if isinstance(offset, mx.array) else offset
    theta = ((starts + np.arange(v.shape[-2])[:, None]) * scale) * inverse  # (..., L, half)
    cos, sin = np.cos(theta), np.sin(theta)
    out = v.copy()
    if traditional:
        x1, x2 = v[..., 0:dims:2], v[..., 1:dims:2]
        out[..., 0:dims:2], out[..., 1:dims:2] = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    else:
        x1, x2 = v[..., :half], v[..., half:dims]
        out[..., :half], out[..., half:dims] = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    return out


def _assert_rope_like_mlx(x, dims, **kwargs):
    """The kernel is as close to float64 RoPE as MLX's own op is: both compute each angle in
    float32, whose rounding (a few ulp of position x frequency) bounds them both."""
    got = rope_native(x, dims, **kwargs)
    assert got.shape == x.shape and got.dtype == mx.float32
    truth = _rope_float64(x, dims, **kwargs)
    offset = kwargs["offset"]
    first = mx.max(offset).item() if isinstance(offset, mx.array) else offset
    last_position = (first + x.shape[-2]) * kwargs["scale"]
    bound = (4 * last_position * 2**-23 + 4e-6) * float(np.abs(np.array(x)).max())
    mlx_error = np.abs(np.array(rope_reference(x, dims, **kwargs)) - truth).max()
    error = np.abs(np.array(got) - truth).max()
    assert mlx_error < bound  # the float64 model is MLX's definition
    assert error < bound


@pytest.mark.parametrize("shape", [(1, 1, 576), (3, 7, 64), (512, 960), (2, 5, 4, 128)])
def test_rms_norm_equals_mlx(shape):
    mx.random.seed(len(shape))
    x = mx.random.normal(shape) * 3
    w = mx.random.normal((shape[-1],))
    got = rms_norm_native(x, w, 1e-5)
    assert got.shape == x.shape and got.dtype == mx.float32
    assert _max_error(got, rms_norm_reference(x, w, 1e-5)) < 1e-5 * mx.max(mx.abs(w)).item() * 4


def test_rms_norm_reads_a_strided_input():
    x = mx.random.normal((64, 5)).T  # each row is strided: gathered before the kernel
    w = mx.random.normal((64,))
    assert _max_error(rms_norm_native(x, w, 1e-6), rms_norm_reference(x, w, 1e-6)) < 1e-5


@pytest.mark.parametrize(
    "shape,dims,traditional",
    [
        ((1, 9, 1, 64), 64, False),  # decode: one position, nine heads
        ((1, 9, 37, 64), 64, False),  # a chunk of positions
        ((2, 4, 5, 128), 64, False),  # partial rotary: the rest copied
        ((1, 3, 6, 64), 64, True),  # traditional pairs (2i, 2i+1)
        ((2, 11, 32), 32, False),  # rank 3: one head
    ],
)
@pytest.mark.parametrize("offset", [0, 7, 1500])
def test_rope_equals_mlx(shape, dims, traditional, offset):
    mx.random.seed(offset + dims)
    x = mx.random.normal(shape)
    _assert_rope_like_mlx(x, dims, traditional=traditional, base=10000.0, scale=1.0, offset=offset)


def test_rope_scale_base_and_frequency_tables():
    x = mx.random.normal((1, 4, 9, 64))
    for kwargs in (dict(base=1e6, scale=0.25), dict(base=500000.0, scale=1.0)):
        _assert_rope_like_mlx(x, 64, traditional=False, offset=300, **kwargs)
    freqs = mx.exp(mx.linspace(0, 9, 32))
    _assert_rope_like_mlx(x, 64, traditional=False, base=None, scale=1.0, offset=300, freqs=freqs)


def test_rope_reads_the_transposed_projection_in_place():
    # what mlx-lm hands RoPE: (B, L, H, D) projections transposed to (B, H, L, D)
    projected = mx.random.normal((1, 13, 6, 64))
    x = projected.transpose(0, 2, 1, 3)
    kwargs = dict(traditional=False, base=10000.0, scale=1.0, offset=42)
    _assert_rope_like_mlx(x, 64, **kwargs)
    strided_rows = mx.random.normal((64, 1, 3, 5)).transpose(1, 2, 3, 0)  # features strided: copied first
    _assert_rope_like_mlx(strided_rows, 64, **kwargs)


def test_array_offsets_place_each_batch_entry_like_an_int_offset():
    """Sparse prefill hands RoPE one position per token as a batch of rows: each must rotate
    exactly as the same token does at that position in a dense pass (same bits)."""
    kwargs = dict(traditional=False, base=10000.0, scale=1.0)
    x = mx.random.normal((1, 4, 6, 64))
    dense = rope_native(x, 64, offset=500, **kwargs)
    rows = x.swapaxes(0, 2)  # (6, 4, 1, 64): row i is its own batch entry
    per_token = rope_native(rows, 64, offset=mx.arange(500, 506), **kwargs).swapaxes(0, 2)
    assert mx.array_equal(per_token, dense).item()
    shared = rope_native(x, 64, offset=mx.array(500), **kwargs)  # one array offset for all
    assert mx.array_equal(shared, dense).item()
    _assert_rope_like_mlx(rows, 64, offset=mx.array([3, 90, 7, 1200, 5, 64]), **kwargs)


def test_what_the_kernels_do_not_take_is_declined():
    x = mx.random.normal((1, 2, 3, 64))
    with pytest.raises(NativeUnsupported, match="does not take"):
        rope_native(x, 64, traditional=False, base=1e4, scale=1.0, offset=mx.array([3, 4, 5]))  # batch of 1
    with pytest.raises(NativeUnsupported, match="float32"):
        rope_native(x.astype(mx.float16), 64, traditional=False, base=1e4, scale=1.0, offset=0)
    with pytest.raises(NativeUnsupported, match="does not take"):
        rope_native(x, 63, traditional=False, base=1e4, scale=1.0, offset=0)
    with pytest.raises(NativeUnsupported, match="does not take"):
        rms_norm_native(x, mx.ones((32,)), 1e-5)


def _op_names(y) -> list[str]:
    dot = io.StringIO()
    mx.export_to_dot(dot, y)
    return re.findall(r'label ="([A-Za-z]+)', dot.getvalue())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_loaded_model_runs_norms_and_ropes_as_one_node_each(tmp_path, arch, monkeypatch):
    # float x in the quantized kernel: the comparison below is about norms and RoPE
    monkeypatch.setattr(quantized_matmul, "INTEGER_ACTIVATIONS", False)
    if mlx_extension.load() is None:
        pytest.skip(f"the MLX primitives cannot be built here: {mlx_extension.unavailable_reason()}")
    loaded = load_folder(make_tiny_model(tmp_path / arch, arch, quantize=4))
    model = loaded.model
    kinds = {type(m) for _, m in model.named_modules()}
    assert NativeRMSNorm in kinds and NativeRoPE in kinds and nn.RMSNorm not in kinds
    prompt, step = mx.array([[5, 9, 13, 2, 7, 11]]), mx.array([[3]])

    def run():
        cache = make_prompt_cache(model)
        first = model(prompt, cache=cache)
        return first, model(step, cache=cache)

    with blas_only(model):  # MLX's own ops: the definition
        want = run()
    got = run()
    for g, w in zip(got, want):
        assert mx.allclose(g, w, atol=2e-4, rtol=2e-4).item()
    cache = make_prompt_cache(model)
    mx.eval(model(prompt, cache=cache), [c.state for c in cache])
    names = _op_names(model(step, cache=cache))  # one decode step's graph
    layers = len(model.layers)
    assert names.count("BriskRope") == 2 * layers
    norms = 2 * layers + 1 + (2 * layers if arch == "qwen3" else 0)  # qwen3: q_norm and k_norm too
    assert names.count("BriskRmsNorm") == norms
    assert not {"Sin", "Cos", "Rsqrt", "Contiguous"} & set(names)  # no fallback graph, no copies of weights


def test_per_token_positions_go_through_the_swapped_rope(tmp_path):
    # sparse prefill's token_positions hands RoPE an array offset, one per token
    loaded = load_folder(make_tiny_model(tmp_path / "m", "llama"))
    model = loaded.model
    install_position_shift(model)
    tokens = mx.array([[4, 8, 15, 16, 23]])
    positions = mx.array([0, 1, 2, 10, 11], dtype=mx.int32)
    with token_positions(model, positions):
        got = model(tokens, cache=make_prompt_cache(model))
    with blas_only(model), token_positions(model, positions):
        want = model(tokens, cache=make_prompt_cache(model))
    assert mx.allclose(got, want, atol=2e-4, rtol=2e-4).item()


def test_llama3_rope_keeps_its_frequency_table():
    rope = Llama3RoPE(64, base=500000.0, scaling_config={"factor": 8.0, "original_max_position_embeddings": 8192})
    holder = nn.Module()
    holder.rope = rope
    assert use_native_layers(holder) == 1 and type(holder.rope) is NativeLlama3RoPE
    x = mx.random.normal((1, 4, 3, 64))
    assert _max_error(holder.rope(x, offset=9000), rope(x, offset=9000)) < 1e-4


def test_without_the_primitives_mlx_runs_norms_and_ropes(monkeypatch):
    monkeypatch.setattr(mlx_extension, "_state", {"loaded": Loaded(None, "off", note="turned off for the test")})
    holder = nn.Module()
    holder.norm, holder.rope = nn.RMSNorm(64), nn.RoPE(64)
    use_native_layers(holder)
    x = mx.random.normal((1, 2, 5, 64))
    assert _max_error(holder.norm(x), rms_norm_reference(x, holder.norm.weight, 1e-5)) == 0
    assert "Sin" in _op_names(holder.rope(x, offset=3))  # MLX's fallback graph


def test_a_model_loaded_without_the_primitives_says_so(tmp_path, monkeypatch, caplog):
    from brisk.engine.models import loader

    folder = make_tiny_model(tmp_path / "m", "llama")
    loader._warn_without_primitives.cache_clear()
    failed = Loaded(None, "failed", note="no C++ compiler found (set CXX or install one)")
    monkeypatch.setattr(mlx_extension, "_state", {"loaded": failed})
    with caplog.at_level("WARNING", logger="brisk.engine.models.loader"):
        load_folder(folder)
        load_folder(folder)
    warnings = [r.getMessage() for r in caplog.records if "MLX primitives" in r.getMessage()]
    assert len(warnings) == 1 and "no C++ compiler" in warnings[0] and "brisk info" in warnings[0]
    loader._warn_without_primitives.cache_clear()
    caplog.clear()
    monkeypatch.setattr(
        mlx_extension, "_state", {"loaded": Loaded(None, "off", note="turned off by BRISK_MLX_PRIMITIVES=0")}
    )
    with caplog.at_level("WARNING", logger="brisk.engine.models.loader"):
        load_folder(folder)
    assert not [r for r in caplog.records if "MLX primitives" in r.getMessage()]  # chosen, not a surprise
    loader._warn_without_primitives.cache_clear()
