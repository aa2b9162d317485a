"""The unpacked KV cache stores float16 (engine/kv/half.py): half the bytes, the same answers."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

from brisk.engine.api.metrics import kv_bytes_measured
from brisk.engine.decode.compiled import compiled_steps, why_not_compiled
from brisk.engine.kv import PromptCache
from brisk.engine.kv.half import HalfKVCache, HalfRotatingKVCache, float32_kv, make_layers
from brisk.engine.kv.packed_cache import PackedKVCache, maybe_quantize_kv_cache
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model, make_tiny_model_by_key

PROMPT = [(i * 37) % 300 + 3 for i in range(300)]


@pytest.fixture(scope="module", params=["llama", "qwen2-q5", "gemma3_text"])
def tiny(request, tmp_path_factory):
    key = request.param
    return load_folder(make_tiny_model_by_key(tmp_path_factory.mktemp(key) / key, key), model_id=key)


def _read(model, layers, tokens=PROMPT):
    logits = model(mx.array([tokens]), cache=layers)[0, -1]
    mx.eval(logits, [layer.state for layer in layers])
    return logits


def test_layers_store_float16_at_half_the_bytes_and_give_the_same_logits(tiny):
    half, full = make_layers(tiny.model), make_prompt_cache(tiny.model)
    assert all(type(a) in (HalfKVCache, HalfRotatingKVCache) for a in half)
    assert [type(a).__mro__[1] for a in half] == [type(b) for b in full]  # the same kind of layer, halved
    got, want = _read(tiny.model, half), _read(tiny.model, full)
    assert {a.keys.dtype for a in half} == {mx.float16} and {b.keys.dtype for b in full} == {mx.float32}
    assert kv_bytes_measured(half) * 2 == kv_bytes_measured(full)
    # float16 K/V moves the logits by rounding only (1e-3 of their spread), and picks the same token
    spread = (mx.max(want) - mx.min(want)).item()
    assert mx.max(mx.abs(got - want)).item() < 5e-3 * spread
    assert mx.argmax(got).item() == mx.argmax(want).item()
    # decoding on keeps the layers float16: a buffer grown past 256 positions is float16 too
    for token in range(5, 300):
        tiny.model(mx.array([[token]]), cache=half)
    mx.eval([a.state for a in half])
    assert {a.keys.dtype for a in half} == {a.values.dtype for a in half} == {mx.float16}


def test_float32_kv_keeps_the_computed_dtype(tiny):
    with float32_kv():
        layers = make_layers(tiny.model)
    assert all(type(a) in (KVCache, RotatingKVCache) for a in layers)
    _read(tiny.model, layers)
    assert {a.keys.dtype for a in layers} == {mx.float32}


def test_a_float16_model_is_stored_as_it_computes():
    layer = HalfKVCache()
    keys = mx.ones((1, 2, 3, 8), dtype=mx.bfloat16)  # bfloat16's range is not float16's: kept
    k, v = layer.update_and_fetch(keys, keys)
    assert k.dtype == v.dtype == mx.bfloat16


def test_a_saved_cache_comes_back_float16_and_stays_so(tiny, tmp_path):
    cache = PromptCache(tiny.model)
    list(cache.sync(PROMPT[:128], 64))  # chunks start where a fresh read's do: the same K/V
    identity = {"model": "tiny"}
    cache.save(tmp_path / "c.safetensors", identity)
    again = PromptCache(tiny.model)
    again.load(tmp_path / "c.safetensors", identity)
    assert [type(a) for a in again.layers] == [type(a) for a in cache.layers]
    list(again.sync(PROMPT, 64))  # 172 more tokens: the buffers grow
    assert {a.keys.dtype for a in again.layers} == {mx.float16}
    fresh = PromptCache(tiny.model)
    list(fresh.sync(PROMPT, 64))
    assert mx.allclose(_read(tiny.model, again.layers, [7]), _read(tiny.model, fresh.layers, [7]), atol=1e-5).item()


def test_half_layers_pack_into_the_int4_cache(tmp_path):
    lm = load_folder(make_tiny_model(tmp_path / "m", "llama", hidden_size=256))  # head dim 64: groups of 32 fit
    truth = make_prompt_cache(lm.model)
    _read(lm.model, truth)
    want = _read(lm.model, truth, [9])
    errors = []
    for layers in (make_layers(lm.model), make_prompt_cache(lm.model)):  # packed from float16 rows, from float32
        _read(lm.model, layers)
        maybe_quantize_kv_cache(layers, k_bits=4, v_bits=4, group_size=32, start=0)
        assert all(isinstance(a, PackedKVCache) for a in layers)
        errors.append(mx.max(mx.abs(_read(lm.model, layers, [9]) - want)).item())
    # int4's own error dwarfs float16's rounding: packing half rows loses no more than packing float32 ones
    assert errors[1] > 0 and errors[0] < 1.5 * errors[1]


@pytest.mark.parametrize("key", ["llama", "qwen2-q5"])
def test_the_compiled_step_on_half_layers_matches_generate_step(key, tmp_path):
    lm = load_folder(make_tiny_model_by_key(tmp_path / key, key), model_id=key)

    def prefilled():
        layers = make_layers(lm.model)
        _read(lm.model, layers, PROMPT[:250])  # the decode crosses a 256-position buffer boundary
        return layers

    assert why_not_compiled(lm.model, prefilled(), kv_bits=(16, 16)) is None
    reference = prefilled()
    want = [int(t) for t, _ in generate_step(mx.array([5]), lm.model, max_tokens=20, prompt_cache=reference)]
    layers = prefilled()
    steps = compiled_steps(lm.model, layers, 5, max_tokens=20, sampler=lambda x: mx.argmax(x, axis=-1), processors=[])
    got = list(steps)
    assert got == want
    for a, b in zip(layers, reference):
        assert a.keys.dtype == mx.float16 and a.offset == b.offset
        assert mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()
