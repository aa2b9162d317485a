"""int4/int8 KV cache: exact byte accounting, the packed attention path inside real
models, prompt-cache trimming, start offset, sliding-window layers."""

import mlx.core as mx
import pytest
from mlx_lm.models import base as mlx_lm_base
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from brisk.engine.api.events import EngineErrored, TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.kv.half import HalfKVCache
from brisk.engine.kv.packed_cache import PackedKVCache, maybe_quantize_kv_cache
from brisk.engine.kv.stores import decode_packed_limit
from brisk.engine.models.loader import load_folder
from brisk.kernels import quantized_matmul
from brisk.kernels.kv_attention import kv_attention_reference
from tests.tiny_models import make_tiny_model

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


@pytest.fixture(scope="module", params=[None, 4], ids=["float32", "4-bit weights"])
def lm(tmp_path_factory, request):
    # head_dim 64 (hidden 256 / 4 heads) so groups of 32 and 64 both fit
    return load_folder(
        make_tiny_model(
            tmp_path_factory.mktemp("kv") / "m", "llama", context_length=4096, hidden_size=256, quantize=request.param
        )
    )


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
    assert packed.kv_bits == packed.k_bits == packed.v_bits == bits
    held = packed_session.cached_tokens
    assert held == dense_session.cached_tokens and held >= dense.prompt_tokens + dense.generated_tokens - 1
    # Values: int4/g32 with fp16 scale+bias = 5 bits = 5/16 of the unpacked cache's float16 (5/32
    # of float32: `ratio`). Keys: per channel in groups of 32 tokens (also 5 bits at int4),
    # except the 32-63 most recent tokens, which stay float16 until their group fills.
    head_dim, kv_heads = 64, lm.config["num_key_value_heads"]
    layers = packed_session.cache.layers
    recent = [layer.offset - layer.k.packed for layer in layers]
    assert all(32 <= r < 64 for r in recent)
    key_row = head_dim * bits / 8 + head_dim / 32 * 4
    dense_share = sum(r * kv_heads * (head_dim * 2 - key_row) for r in recent)
    half = dense.kv_bytes / 2  # the unpacked keys (or values), float16
    assert packed.kv_bytes == half * 2 * ratio + half * (5 if bits == 4 else 9) / 16 + dense_share


def reference_sdpa(queries, keys, values, scale, mask, group_size=64, bits=8):
    return kv_attention_reference(queries, keys, values, scale=scale, mask=mask)


@pytest.mark.parametrize("k_bits,v_bits", [(4, 4), (8, 4), (16, 4), (4, 16)])
def test_packed_attention_inside_the_model_matches_the_reference(lm, k_bits, v_bits, monkeypatch):
    """The same packed cache, attended by Brisk's dispatcher and by dequantize-then-attend:
    same logits, for a multi-token causal step and a decode step."""
    # Float x in the quantized kernel: its integer x rounds each block to 15 bits, and a 1e-6
    # difference in attention can move a rounding step, which two random layers amplify.
    monkeypatch.setattr(quantized_matmul, "INTEGER_ACTIVATIONS", False)
    tokens = mx.array(lm.tokenizer.encode(PROMPT))[None]
    logits = {}
    for name, fn in (("reference", reference_sdpa), ("brisk", None)):
        cache = make_prompt_cache(lm.model)
        lm.model(tokens[:, :70], cache=cache)
        maybe_quantize_kv_cache(cache, k_bits=k_bits, v_bits=v_bits, group_size=32, start=0)  # installs Brisk's
        if fn is not None:
            mlx_lm_base.quantized_scaled_dot_product_attention = fn
        try:
            logits[name] = [lm.model(tokens[:, 70:100], cache=cache), lm.model(tokens[:, 100:101], cache=cache)]
        finally:
            maybe_quantize_kv_cache([], k_bits=4, v_bits=4, group_size=32, start=0)  # restore Brisk's routing
    for brisk, reference in zip(logits["brisk"], logits["reference"]):
        # float32 sums in another order, amplified by two random layers, differ by up to ~2e-3
        assert mx.allclose(brisk, reference, atol=5e-3, rtol=1e-3).item(), mx.abs(brisk - reference).max().item()


def test_trim_and_append_equal_a_fresh_packed_cache(lm):
    """Speculative rollback: trimming a packed cache and appending gives identical state."""
    tokens = lm.tokenizer.encode(PROMPT)
    a = make_prompt_cache(lm.model)
    lm.model(mx.array(tokens[:80])[None], cache=a)
    maybe_quantize_kv_cache(a, k_bits=4, v_bits=4, group_size=32, start=0)
    lm.model(mx.array(tokens[80:90])[None], cache=a)
    trim_prompt_cache(a, 10)
    out_a = lm.model(mx.array(tokens[80:85])[None], cache=a)
    b = make_prompt_cache(lm.model)
    lm.model(mx.array(tokens[:80])[None], cache=b)
    maybe_quantize_kv_cache(b, k_bits=4, v_bits=4, group_size=32, start=0)
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
    assert all(type(c) is HalfKVCache for c in short.cache.layers)
    later = Session(lm, settings(kv_bits=4, kv_quant_start=100))
    finish(later.send(PROMPT))
    assert all(isinstance(c, PackedKVCache) for c in later.cache.layers)


def test_sliding_window_layers_work_with_int4(tmp_path):
    gemma = load_folder(make_tiny_model(tmp_path / "g", "gemma3_text", context_length=1024))
    session = Session(gemma, settings(kv_bits=4, max_tokens=20))
    turn = finish(session.send(PROMPT))  # far longer than the 16-token window
    kinds = {type(c).__name__ for c in session.cache.layers}
    assert kinds == {"HalfRotatingKVCache", "PackedKVCache"}  # local layers stay dense, global ones pack
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
    from brisk.engine.api.errors import BriskError

    session = Session(lm, settings())
    finish(session.send(PROMPT))
    session.save_cache(tmp_path / "c.safetensors")
    with pytest.raises(BriskError, match="belongs to model"):
        Session(tiny_llama, settings()).load_cache(tmp_path / "c.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(BriskError, match="Cannot read saved cache"):
        Session(lm, settings()).load_cache(tmp_path / "bad.safetensors")


def test_a_rollback_never_reaches_packed_keys_and_a_deep_trim_unpacks_the_cut_group(tmp_path):
    """A step at position p reads keys before decode_packed_limit(p) packed, the rest dense.
    Rollbacks stay within the dense rows, so nothing is quantized twice; an edit far back
    cuts a packed group, whose kept tokens go back to dense rows (as they were read)."""
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    mx.random.seed(7)
    keys, values = mx.random.normal((1, 2, 400, 64)), mx.random.normal((1, 2, 400, 64))
    cache = PackedKVCache(k_bits=4, v_bits=4, group_size=32)
    step = lambda a, b: cache.update_and_fetch(keys[:, :, a:b], values[:, :, a:b])  # noqa: E731
    step(0, 200)  # a prefill chunk: every row reads the same keys; packing waits for the next step
    assert (cache.k.packed, cache.offset) == (0, 200)
    step(200, 201)
    assert (cache.k.packed, cache.k.recent_from) == (decode_packed_limit(200), 160)
    step(201, 213)  # a verify of 12 tokens, 11 rejected
    cache.trim(11)
    assert (cache.k.packed, cache.offset) == (160, 202)
    step(202, 220)
    keys_view, _ = step(220, 228)  # a verify across the boundary at 224: the rows differ
    assert keys_view.limits == (160,) * 4 + (192,) * 4 and cache.k.packed == 192
    before = cache.keys.dequantize()
    cache.trim(228 - 150)  # an edit: back into the packed groups
    assert (cache.k.packed, cache.k.recent_from, cache.offset) == (128, 128, 150)
    assert mx.allclose(cache.keys.dequantize(), before[:, :, :150], atol=1e-2).item()  # dense rows in float16
    step(150, 250)
    step(250, 251)
    assert cache.offset == 251 and cache.k.packed == 192 and cache.values.length == 251
    save_prompt_cache(str(tmp_path / "c.safetensors"), [cache])
    [loaded] = load_prompt_cache(str(tmp_path / "c.safetensors"))
    assert (loaded.offset, loaded.k.packed, loaded.k.recent_from, loaded.k_bits) == (251, 192, 192, 4)
    assert mx.array_equal(loaded.keys.dequantize(), cache.keys.dequantize()).item()
    assert mx.array_equal(loaded.values.dequantize(), cache.values.dequantize()).item()
    loaded.update_and_fetch(keys[:, :, :40], values[:, :, :40])  # and it keeps growing
    loaded.update_and_fetch(keys[:, :, :1], values[:, :, :1])
    assert loaded.offset == 292 and loaded.k.packed == decode_packed_limit(291) == 256


@pytest.mark.parametrize("start", [100, 220])  # 220: the verify rows cross the group boundary at 224
def test_a_verify_pass_reads_keys_as_one_token_steps_do(lm, start):
    """Exact speculative decoding with packed keys: the logits of 8 tokens in one pass equal
    those of 8 one-token steps, whichever keys were packed in between."""
    tokens = mx.array((lm.tokenizer.encode(PROMPT) * 3)[: start + 8])[None]
    logits = []
    for one_by_one in (False, True):
        cache = make_prompt_cache(lm.model)
        lm.model(tokens[:, :64], cache=cache)
        maybe_quantize_kv_cache(cache, k_bits=4, v_bits=4, group_size=32, start=0)
        for i in range(64, start):
            lm.model(tokens[:, i : i + 1], cache=cache)
        if one_by_one:
            logits.append(
                mx.concatenate([lm.model(tokens[:, i : i + 1], cache=cache) for i in range(start, start + 8)], axis=1)
            )
        else:
            logits.append(lm.model(tokens[:, start : start + 8], cache=cache))
    # Float rounding differs between the two orders by about 1e-6; with 4-bit weights the
    # decode kernel rounds x to integers, where such a difference can move one step of
    # q (max|x| / 16256) and the logits by up to about 1e-3. Keys read wrongly cost 1e-1.
    assert mx.allclose(logits[0], logits[1], atol=2e-3, rtol=1e-3).item()
