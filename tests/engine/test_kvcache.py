"""int4/int8 KV cache: exact byte accounting, the packed attention path inside real
models, prompt-cache trimming, start offset, sliding-window layers."""

import mlx.core as mx
import pytest
from mlx_lm.models import base as mlx_lm_base
from mlx_lm.models.cache import KVCache, make_prompt_cache, trim_prompt_cache

from engine.events import EngineErrored, TurnFinished
from engine.kvcache import MLX_LM_QUANTIZED_SDPA, PackedKVCache, maybe_quantize_kv_cache
from engine.models.loader import load_folder
from engine.session import Session
from engine.settings import ChatSettings
from tests.tiny_models import make_tiny_model

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


@pytest.fixture(scope="module", params=[None, 4], ids=["float32", "4-bit weights"])
def lm(tmp_path_factory, request):
    # head_dim 64 (hidden 256 / 4 heads) so groups of 32 and 64 both fit
    return load_folder(make_tiny_model(tmp_path_factory.mktemp("kv") / "m", "llama", context_length=4096,
                                       hidden_size=256, quantize=request.param))


def finish(events):
    events = list(events)
    errors = [e for e in events if isinstance(e, EngineErrored)]
    assert not errors, errors
    return [e for e in events if isinstance(e, TurnFinished)][0]


def settings(**kw):
    return ChatSettings(**{"model": "m", "temperature": 0.0, "max_tokens": 12, "prefill_step_size": 64, **kw})


@pytest.mark.parametrize("bits,group,ratio", [(4, 32, 5 / 32), (4, 64, 4.5 / 32), (8, 32, 9 / 32)])
def test_kv_bytes_are_exact(lm, bits, group, ratio):
    dense_session = Session(lm, settings())
    dense = finish(dense_session.send(PROMPT)).metrics
    packed_session = Session(lm, settings(kv_bits=bits, kv_group_size=group))
    packed = finish(packed_session.send(PROMPT)).metrics
    assert packed.kv_bytes == packed.kv_bytes_formula  # measured on the arrays == formula, to the byte
    assert dense.kv_bytes == dense.kv_bytes_formula
    assert packed.kv_bits == bits
    # same tokens held; int4/g32 with fp16 scale+bias = 5 bits = 5/32 of float32 (5/16 of fp16)
    held = packed_session.cached_tokens
    assert held == dense_session.cached_tokens and held >= dense.prompt_tokens + dense.generated_tokens - 1
    assert packed.kv_bytes == dense.kv_bytes * ratio


def test_packed_attention_inside_the_model_matches_mlx_lms(lm):
    """The same packed cache, attended by Brisk's kernel and by mlx-lm's: same logits."""
    tokens = mx.array(lm.tokenizer.encode(PROMPT))[None]
    logits = {}
    for name, fn in (("mlx_lm", MLX_LM_QUANTIZED_SDPA), ("brisk", None)):
        cache = make_prompt_cache(lm.model)
        lm.model(tokens[:, :64], cache=cache)
        maybe_quantize_kv_cache(cache, bits=4, group_size=32, start=0)  # installs Brisk's kernel
        if fn is not None:
            mlx_lm_base.quantized_scaled_dot_product_attention = fn
        try:
            logits[name] = lm.model(tokens[:, 64:], cache=cache)  # multi-token, causal, on packed data
        finally:
            maybe_quantize_kv_cache([], bits=4, group_size=32, start=0)  # restore Brisk's routing
    assert mx.allclose(logits["brisk"], logits["mlx_lm"], atol=1e-3, rtol=1e-3).item()


def test_trim_and_append_equal_a_fresh_packed_cache(lm):
    """Speculative rollback: trimming a packed cache and appending gives identical state."""
    tokens = lm.tokenizer.encode(PROMPT)
    a = make_prompt_cache(lm.model)
    lm.model(mx.array(tokens[:80])[None], cache=a)
    maybe_quantize_kv_cache(a, bits=4, group_size=32, start=0)
    lm.model(mx.array(tokens[80:90])[None], cache=a)
    trim_prompt_cache(a, 10)
    out_a = lm.model(mx.array(tokens[80:85])[None], cache=a)
    b = make_prompt_cache(lm.model)
    lm.model(mx.array(tokens[:80])[None], cache=b)
    maybe_quantize_kv_cache(b, bits=4, group_size=32, start=0)
    out_b = lm.model(mx.array(tokens[80:85])[None], cache=b)
    assert mx.array_equal(out_a, out_b).item()


def test_multi_turn_and_edit_with_int4(lm):
    session = Session(lm, settings(kv_bits=4))
    finish(session.send(PROMPT))
    second = finish(session.send("and then?"))
    assert second.metrics.cached_tokens > 0
    assert all(isinstance(c, PackedKVCache) and c.offset == session.cached_tokens for c in session.cache.layers)
    edited = finish(session.edit(2, "and after that?"))
    assert edited.metrics.cached_tokens > 0
    assert all(c.offset == session.cached_tokens for c in session.cache.layers)


def test_changing_kv_bits_rebuilds_the_cache(lm):
    session = Session(lm, settings())
    finish(session.send(PROMPT))
    session.settings.kv_bits = 4
    turn = finish(session.send("next"))
    assert turn.metrics.cached_tokens == 0  # a float cache cannot be reused as int4
    assert isinstance(session.cache.layers[0], PackedKVCache)


def test_quantization_starts_at_the_offset(lm):
    short = Session(lm, settings(kv_bits=4, kv_quant_start=10_000))
    finish(short.send(PROMPT))
    assert all(type(c) is KVCache for c in short.cache.layers)
    later = Session(lm, settings(kv_bits=4, kv_quant_start=100))
    finish(later.send(PROMPT))
    assert all(isinstance(c, PackedKVCache) for c in later.cache.layers)


def test_sliding_window_layers_work_with_int4(tmp_path):
    gemma = load_folder(make_tiny_model(tmp_path / "g", "gemma3_text", context_length=1024))
    session = Session(gemma, settings(kv_bits=4, max_tokens=20))
    turn = finish(session.send(PROMPT))  # far longer than the 16-token window
    kinds = {type(c).__name__ for c in session.cache.layers}
    assert kinds == {"RotatingKVCache", "PackedKVCache"}  # local layers stay dense, global ones pack
    assert turn.metrics.kv_bytes == turn.metrics.kv_bytes_formula
    assert len(turn.token_ids) == 20


def test_group_that_does_not_divide_head_dim_is_refused(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="t", kv_bits=4, kv_group_size=32))  # head_dim 16
    errors = [e for e in session.send("hi") if isinstance(e, EngineErrored)]
    assert errors and "head dimension (16)" in errors[0].message


@pytest.mark.parametrize("bits", [16, 4])
def test_saved_cache_reopens_without_prefill(lm, tmp_path, bits):
    first = Session(lm, settings(kv_bits=bits))
    finish(first.send(PROMPT))
    first.save_cache(tmp_path / "chat.safetensors")
    reopened = Session(lm, settings(kv_bits=bits), messages=list(first.messages))
    reopened.load_cache(tmp_path / "chat.safetensors")
    again = finish(reopened.send("and then?"))
    expected = finish(first.send("and then?"))
    assert again.metrics.cached_tokens == expected.metrics.cached_tokens > 0
    assert again.token_ids == expected.token_ids


def test_saved_cache_of_another_model_or_corrupt_file_is_refused(lm, tiny_llama, tmp_path):
    from engine.errors import BriskError

    session = Session(lm, settings())
    finish(session.send(PROMPT))
    session.save_cache(tmp_path / "c.safetensors")
    with pytest.raises(BriskError, match="belongs to model"):
        Session(tiny_llama, settings()).load_cache(tmp_path / "c.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(BriskError, match="Cannot read saved cache"):
        Session(lm, settings()).load_cache(tmp_path / "bad.safetensors")
