"""GGUF quantized tensors stay quantized: exact for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, nearest MLX format otherwise."""

import json
from types import SimpleNamespace

import gguf
import mlx.core as mx
import numpy as np
import pytest

from brisk.engine.models import gguf_quant
from brisk.engine.models.gguf_import import import_gguf
from brisk.engine.models.loader import load_folder
from brisk.kernels import plan
from tests.gguf_writer import write_gguf
from tests.tiny_models import make_tiny_model


def _tensor(weight: np.ndarray, kind: str):
    ggml = gguf.GGMLQuantizationType[kind]
    data = gguf.quants.quantize(weight, ggml)
    # GGUFReader's shape is reversed from numpy's: (K, N) for an (N, K) weight.
    return SimpleNamespace(tensor_type=ggml, shape=list(reversed(weight.shape)), data=data), data


def _mlx_values(q: gguf_quant.Quantized) -> np.ndarray:
    # float32 scales: MLX's dequantize then computes s * q + b in float32, as gguf does.
    return np.asarray(
        mx.dequantize(
            mx.array(q.weight),
            mx.array(q.scales).astype(mx.float32),
            mx.array(q.biases).astype(mx.float32),
            group_size=q.group_size,
            bits=q.bits,
        )
    )


@pytest.mark.parametrize("kind,bits", [("Q4_0", 4), ("Q4_1", 4), ("Q5_0", 5), ("Q5_1", 5), ("Q8_0", 8)])
def test_affine_gguf_blocks_map_to_mlx_groups_value_for_value(kind, bits):
    rng = np.random.default_rng(7)
    weight = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    tensor, data = _tensor(weight, kind)
    result = gguf_quant.convert(tensor, gguf.quants.dequantize)
    assert isinstance(result, gguf_quant.Quantized) and (result.bits, result.group_size) == (bits, 32)
    assert result.weight.dtype == np.uint32 and result.scales.dtype == np.float16
    want = gguf.quants.dequantize(data, tensor.tensor_type)
    np.testing.assert_array_equal(_mlx_values(result), want)
    assert gguf_quant.outcome(kind, result) == f"{bits}-bit, groups of 32, exact"


def _k_quant_blocks(kind: str, rows: int, k: int, seed: int) -> np.ndarray:
    """Random Q4_K / Q5_K super-blocks (the gguf package only reads K-quants): any bytes are a
    valid block once its two float16 scales are finite, as these are."""
    rng = np.random.default_rng(seed)
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
    blocks = rng.integers(0, 256, size=(rows, k // 256, size), dtype=np.uint8)
    for at in (208,) if kind == "Q6_K" else (0, 2):  # Q6_K: d last; Q4_K/Q5_K: d and dmin first
        halves = rng.uniform(1e-3, 1e-2, size=(rows, k // 256)).astype(np.float16)
        blocks[..., at : at + 2] = halves[..., None].view(np.uint8).reshape(rows, k // 256, 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind,bits", [("Q4_K", 4), ("Q5_K", 5)])
def test_k_quant_sub_blocks_map_to_mlx_groups_up_to_float16_scales(kind, bits):
    """Q4_K/Q5_K sub-blocks of 32 are affine (w = d*sc * q - dmin*m): each becomes an MLX group
    whose only change is d*sc and dmin*m rounded to float16. Re-quantized by MLX instead, they
    moved by up to half a step (Qwen2.5-Coder-1.5B's import: top-1 0.94 against its float32 one)."""
    rows, k = 6, 512
    data = _k_quant_blocks(kind, rows, k, seed=bits)
    ggml = gguf.GGMLQuantizationType[kind]
    tensor = SimpleNamespace(tensor_type=ggml, shape=[k, rows], data=data)
    result = gguf_quant.convert(tensor, gguf.quants.dequantize)
    assert (result.bits, result.group_size) == (bits, 32) and gguf_quant.outcome(kind, result).endswith("exact")
    want = gguf.quants.dequantize(data, ggml).reshape(rows, k)
    error = np.abs(_mlx_values(result) - want).max()
    assert error < 2**-10 * np.abs(want).max()  # float16 scales: 2^-11 relative, times q and the bias


def test_q6_k_goes_to_symmetric_six_bits_exact_where_its_scale_is_the_groups():
    """Q6_K's sub-blocks of 16 have scales of their own: a group of 32 takes the larger |d sc| of
    its two as its step, with bias -32 steps (kernels/scale_codes.py then reads no biases and
    codes for the scales). The sub-block that has that scale keeps its values, float16 aside;
    the other is rounded to the step, at most half a step off (a value at +32 steps, which the
    6 bits cannot hold, clips to 31)."""
    rows, k = 4, 512
    data = _k_quant_blocks("Q6_K", rows, k, seed=6)
    ggml = gguf.GGMLQuantizationType.Q6_K
    result = gguf_quant.convert(SimpleNamespace(tensor_type=ggml, shape=[k, rows], data=data), gguf.quants.dequantize)
    assert (result.bits, result.group_size) == (6, 32) and gguf_quant.outcome("Q6_K", result).endswith("re-quantized")
    assert np.array_equal(result.biases, (result.scales * np.float16(-32)).astype(np.float16))
    blocks = data.reshape(rows, -1, 210)
    d = np.abs(blocks[..., 208:210].copy().view(np.float16).astype(np.float32))  # (rows, supers, 1)
    pairs = np.abs(blocks[..., 192:208].view(np.int8).astype(np.float32)).reshape(rows, -1, 8, 2)
    step = (d[..., None] * pairs.max(-1, keepdims=True)).reshape(rows, -1, 1, 1)  # per group of 32
    source = gguf.quants.dequantize(data, ggml).reshape(rows, -1, 2, 16)
    error = np.abs(_mlx_values(result).reshape(rows, -1, 2, 16) - source)
    slack = 2**-10 * np.abs(source).max()
    clipped = source / step > 31.5
    assert (error <= np.where(clipped, 1.0, 0.5) * step + slack).all()
    owner = (pairs == pairs.max(-1, keepdims=True)).reshape(rows, -1, 2, 1) & ~clipped
    assert owner.sum() > error.size / 2 and (error[owner] <= slack).all()


@pytest.mark.parametrize("kind,bits", [("TQ1_0", 8)])  # the K-quants: the gguf package only reads them
def test_other_types_are_requantized_to_the_nearest_format(kind, bits):
    rng = np.random.default_rng(8)
    weight = (rng.standard_normal((32, 256)) * 0.05).astype(np.float32)
    tensor, data = _tensor(weight, kind)
    result = gguf_quant.convert(tensor, gguf.quants.dequantize)
    assert result.bits == bits and gguf_quant.outcome(kind, result).endswith("re-quantized")
    source = gguf.quants.dequantize(data, tensor.tensor_type)
    step = (source.reshape(32, -1, 32).max(-1) - source.reshape(32, -1, 32).min(-1)) / 255
    error = np.abs(_mlx_values(result) - source).reshape(32, -1, 32).max(-1)
    # MLX keeps zero exact, which can cost up to a whole 8-bit step; plus float16 scales.
    assert (error <= step + 1e-3 * np.abs(source).max()).all()


def test_float_and_one_dimensional_tensors_stay_float32():
    norm = SimpleNamespace(tensor_type=gguf.GGMLQuantizationType.F32, shape=[64], data=np.ones(64, np.float32))
    result = gguf_quant.convert(norm, gguf.quants.dequantize)
    assert isinstance(result, np.ndarray) and result.dtype == np.float32 and result.shape == (64,)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0", "Q8_0"])
def test_a_quantized_gguf_imports_quantized_and_answers_like_its_float_import(tmp_path, arch, kind, monkeypatch):
    from brisk.kernels import quantized_matmul

    # float x in the few-row kernel: this checks that the blocks map exactly, not the rounding
    monkeypatch.setattr(quantized_matmul, "INTEGER_ACTIVATIONS", False)
    original = make_tiny_model(tmp_path / "orig", arch, seed=4)
    path = write_gguf(original, tmp_path / "m.gguf", quantize_weights=kind)
    kept, floated = tmp_path / "kept", tmp_path / "float"
    kept.mkdir(), floated.mkdir()
    config = import_gguf(path, kept)
    import_gguf(path, floated, keep_quantized=False)
    bits = {"Q4_0": 4, "Q5_0": 5, "Q8_0": 8}[kind]
    assert config["quantization"]["bits"] == bits and config["quantization"]["group_size"] == 32
    assert json.loads((kept / "config.json").read_text())["quantization"] == config["quantization"]
    assert any(kind in line for line in config["brisk_source"]["tensors"])
    q_model, f_model = load_folder(kept), load_folder(floated)
    assert q_model.info.memory_bytes < f_model.info.memory_bytes / 2.5
    assert q_model.info.bits_per_weight < f_model.info.bits_per_weight / 3
    assert q_model.info.parameters == f_model.info.parameters
    layer = q_model.model.model.layers[0].mlp.down_proj
    assert layer.bits == bits and layer.scales.dtype == mx.float16  # kept as stored, not upcast
    if not plan.current().native:
        # MLX's own product computes s * q + b in the scales' dtype (up to ~2e-2 off here):
        # float32 scales check that the blocks map exactly, as the kernels' float32 sums do
        _scales_to_float32(q_model.model)
    ids = mx.array([[1, 5, 9, 30, 2, 7, 11, 3]])
    for rows in (ids, ids[:, :1]):  # a prefill chunk and a decode row, the kernels' two paths
        want, got = f_model.model(rows), q_model.model(rows)
        assert mx.allclose(got, want, atol=2e-3, rtol=2e-3).item()


def _scales_to_float32(model) -> None:
    import mlx.nn as nn

    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            module.scales, module.biases = module.scales.astype(mx.float32), module.biases.astype(mx.float32)


def test_per_layer_bits_are_recorded_where_a_model_mixes_them():
    entry = gguf_quant_config({"a.q": 4, "a.k": 4, "a.v": 8})
    assert entry["bits"] == 4 and entry["a.v"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert "a.q" not in entry


def gguf_quant_config(bits_of):
    from brisk.engine.models.gguf_import import quantization_config

    return quantization_config(bits_of)
