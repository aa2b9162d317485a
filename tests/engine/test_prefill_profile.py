"""`brisk bench prefill-profile`: the parts of a real prefill, timed, add up to it."""

from types import SimpleNamespace

import mlx.core as mx
import pytest

from brisk.bench.prefill_profile import PARTS, profile_prefill


@pytest.fixture(params=["float32", "q4"])
def model(request, tiny_llama, tiny_llama_q4):
    return tiny_llama if request.param == "float32" else tiny_llama_q4


def test_every_part_of_a_real_prefill_is_timed_and_they_add_up(model):
    tokens = list(range(3, 3 + 200))
    got = profile_prefill(model, tokens, step=64)
    parts = got["parts"]
    assert set(parts) == set(PARTS)
    # each wrapped part of every layer really ran (the tiny model has all of them)
    for part in ("embedding", "norms", "projections", "attention", "mlp matmuls", "activation"):
        assert parts[part] > 0, part
    assert sum(parts.values()) == pytest.approx(got["wrapped_s"], rel=1e-9)
    assert got["plain_s"] > 0 and got["tokens"] == 200


def test_the_model_is_left_as_it_was(model):
    """The timers come off: the same logits after profiling, and no wrapper left behind."""
    body = model.model.model
    before = model.model(mx.array([[5, 6, 7]]))
    profile_prefill(model, list(range(3, 40)), step=16)
    after = model.model(mx.array([[5, 6, 7]]))
    assert mx.array_equal(before, after).item()
    layer = body.layers[0]
    for parent, name in (
        (layer.self_attn, "q_proj"),
        (layer.mlp, "down_proj"),
        (layer, "self_attn"),
        (body, "embed_tokens"),
    ):
        assert name not in vars(parent), name  # no instance attribute shadows the module's child
        assert type(getattr(parent, name)).__name__ != "_Timed"


def test_a_model_without_the_decoder_layout_is_refused():
    odd = SimpleNamespace(id="odd", model=SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(mlp=None)])))
    with pytest.raises(SystemExit, match="not the standard decoder layout"):
        profile_prefill(odd, [3, 4, 5], step=4)
