"""Eager passes dispatched ahead (engine/decode/dispatch_ahead.py): the same numbers as a pass built
whole, every other layer handed to the stream, every layer restored afterwards."""

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from brisk.engine.decode import dispatch_ahead
from brisk.engine.decode.dispatch_ahead import dispatching_ahead
from brisk.engine.kv.half import make_layers
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model_by_key

ARCHS = ["llama", "qwen2", "nemotron_h", "llama-q4"]  # nemotron_h: recurrent layers among the KV ones


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ahead")
    return {arch: load_folder(make_tiny_model_by_key(root / arch, arch, seed=3, context_length=512)) for arch in ARCHS}


def _prefilled(lm, prompt):
    layers = make_layers(lm.model)
    mx.eval(lm.model(mx.array(prompt)[None], cache=layers))
    return layers


@pytest.mark.parametrize("arch", ARCHS)
def test_a_pass_dispatched_ahead_computes_what_a_pass_built_whole_does(models, arch):
    lm = models[arch]
    prompt, feed = list(range(3, 40)), [7, 8, 9, 10]
    whole, ahead = _prefilled(lm, prompt), _prefilled(lm, prompt)
    expected = lm.model(mx.array(feed)[None], cache=whole)
    with dispatching_ahead(ahead):
        got = lm.model(mx.array(feed)[None], cache=ahead)
    assert mx.array_equal(got, expected).item()
    for a, b in zip(ahead, whole):  # and the caches hold the same keys, values and states
        ours, theirs = tree_flatten(a.state), tree_flatten(b.state)
        assert [path for path, _ in ours] == [path for path, _ in theirs]
        assert all(x is y is None or mx.array_equal(x, y).item() for (_, x), (_, y) in zip(ours, theirs))


def test_every_other_layer_is_dispatched_and_every_layer_restored(models, monkeypatch):
    lm = models["llama"]
    layers = _prefilled(lm, list(range(3, 20)))
    dispatched = []
    real = dispatch_ahead.mx.async_eval
    monkeypatch.setattr(dispatch_ahead.mx, "async_eval", lambda arrays: (dispatched.append(arrays), real(arrays)))
    with dispatching_ahead(layers):
        mx.eval(lm.model(mx.array([5, 6])[None], cache=layers))
    assert len(dispatched) == len(layers) // 2 >= 1
    assert all(len(arrays) == 2 for arrays in dispatched)  # a layer's keys and values
    assert not any("update_and_fetch" in vars(layer) for layer in layers)
    dispatched.clear()
    mx.eval(lm.model(mx.array([5])[None], cache=layers))
    assert dispatched == []  # outside the block a pass is built whole


def test_layers_are_restored_when_the_pass_fails(models):
    layers = _prefilled(models["qwen2"], list(range(3, 20)))
    with pytest.raises(RuntimeError), dispatching_ahead(layers):
        assert any("update_and_fetch" in vars(layer) for layer in layers)
        raise RuntimeError("a pass that failed")
    assert not any("update_and_fetch" in vars(layer) for layer in layers)


def test_a_packed_cache_pass_dispatched_ahead_computes_the_same(tmp_path):
    """Packed layers store tuples of codes, scales and biases: each is dispatched."""
    from brisk.engine.kv.packed_cache import PackedKVCache, maybe_quantize_kv_cache
    from tests.tiny_models import make_tiny_model

    lm = load_folder(make_tiny_model(tmp_path / "m", "llama", hidden_size=256))  # head dim 64: groups of 32 fit
    prompt, feed = list(range(3, 40)), [7, 8, 9]
    whole, ahead = _prefilled(lm, prompt), _prefilled(lm, prompt)
    for layers in (whole, ahead):
        maybe_quantize_kv_cache(layers, k_bits=8, v_bits=4, group_size=32, start=0)
        assert all(isinstance(layer, PackedKVCache) for layer in layers)
    expected = lm.model(mx.array(feed)[None], cache=whole)
    with dispatching_ahead(ahead):
        got = lm.model(mx.array(feed)[None], cache=ahead)
    assert mx.array_equal(got, expected).item()
