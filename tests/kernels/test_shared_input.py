"""q/k/v and gate/up fused into one product each (kernels/shared_input.py)."""

import shutil

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache

from kernels.native_layers import use_native_layers
from kernels.shared_input import FusedProjections, ProjectionPart, fuse_shared_input_projections

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the native kernels")


def _model(v_bits: int = 4, bias: bool = False):
    mx.random.seed(3)
    args = llama.ModelArgs(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300, attention_bias=bias, tie_word_embeddings=True,
    )  # fmt: skip
    model = llama.Model(args)
    nn.quantize(
        model, group_size=32, bits=4, class_predicate=lambda p, m: hasattr(m, "to_quantized") and "v_proj" not in p
    )
    nn.quantize(
        model, group_size=32, bits=v_bits, class_predicate=lambda p, m: "v_proj" in p and hasattr(m, "to_quantized")
    )
    mx.eval(model.parameters())
    assert use_native_layers(model) > 0
    return model


def _bytes(model) -> int:
    return sum(a.nbytes for _, a in tree_flatten(model.parameters()))


def _run(model, prompt):
    """Logits of a 40-token prefill (dense rows), then of three one-token decode steps."""
    cache = make_prompt_cache(model)
    out = [model(mx.array([prompt]), cache=cache)]
    for token in (5, 17, 250):
        out.append(model(mx.array([[token]]), cache=cache))
    mx.eval(out)
    return out


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_give_the_same_logits_bit_for_bit(bias):
    prompt = [(7 * i) % 290 + 3 for i in range(40)]
    model = _model(bias=bias)
    before, size = _run(model, prompt), _bytes(model)
    assert fuse_shared_input_projections(model) == 4  # q/k/v and gate/up in each of 2 layers
    attention = model.model.layers[0].self_attn
    assert type(attention.q_proj) is ProjectionPart and isinstance(attention.fused_q_k_v, FusedProjections)
    assert _bytes(model) == size  # the parts' arrays went: nothing is held twice
    for got, want in zip(_run(model, prompt), before):
        assert mx.array_equal(got, want).item()


def test_layers_of_different_bits_stay_apart():
    model = _model(v_bits=8)  # as a GGUF import with Q6_K value projections has them
    assert fuse_shared_input_projections(model) == 2  # only gate/up
    assert type(model.model.layers[0].self_attn.v_proj) is not ProjectionPart


def test_parts_called_in_any_order_or_on_new_inputs_agree_with_the_separate_layers():
    model = _model()
    attention = model.model.layers[1].self_attn
    separate = [attention.q_proj, attention.k_proj, attention.v_proj]
    x, y = mx.random.normal((2, 3, 128))
    want = [[layer(v) for layer in separate] for v in (x, y)]
    fuse_shared_input_projections(model)
    parts = [attention.q_proj, attention.k_proj, attention.v_proj]
    got_x = [parts[2](x), parts[0](x)]
    got_y = parts[1](y)  # a new x before x's last part was asked for
    got_x.append(parts[1](x))
    assert mx.array_equal(got_x[0], want[0][2]).item() and mx.array_equal(got_x[1], want[0][0]).item()
    assert mx.array_equal(got_x[2], want[0][1]).item() and mx.array_equal(got_y, want[1][1]).item()
    assert attention.fused_q_k_v.__dict__["_last"] is not None  # y's q and v not yet handed out


def test_prefill_sized_inputs_run_each_part_alone():
    """Over 32 rows one product of the fused rows ran 1.6x slower than the parts (AMX path)."""
    model = _model()
    mlp = model.model.layers[0].mlp
    x = mx.random.normal((1, 40, 128))
    want = mlp.gate_proj(x)  # the separate layer
    fuse_shared_input_projections(model)
    got = mlp.gate_proj(x)
    assert mlp.fused_gate_up.__dict__["_last"] is None  # no product computed for up_proj's part
    assert mx.array_equal(got, want).item()
