"""Every path of kernels/quantized_attention.py against the dequantize-then-attend reference."""

import mlx.core as mx
import pytest

from kernels.quantized_attention import (quantized_attention, quantized_attention_dequantized,
                                         quantized_attention_reference, quantized_attention_single,
                                         quantized_attention_split)

PATHS = {
    "single": quantized_attention_single,
    "split": lambda *a, **k: quantized_attention_split(*a, block=37, **k),  # odd block: ragged last block
    "dequantized": quantized_attention_dequantized,
    "dispatch": quantized_attention,
    "dispatch_fused_only": lambda *a, **k: quantized_attention(*a, fused_max_rows=10**9, **k),
    "dispatch_small_budget": lambda *a, **k: quantized_attention(*a, max_score_elements=64,
                                                                 fused_max_rows=10**9, **k),
}


def make(b, hq, hkv, q_len, k_len, d, group_size, bits, seed=0):
    mx.random.seed(seed)
    q = mx.random.normal((b, hq, q_len, d))
    k = mx.random.normal((b, hkv, k_len, d))
    v = mx.random.normal((b, hkv, k_len, d))
    pack = lambda x: mx.quantize(x, group_size=group_size, bits=bits)  # noqa: E731
    return q, pack(k), pack(v)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("group_size,bits", [(32, 4), (64, 4), (32, 8)])
def test_decode_step_matches_reference(path, d, hq, hkv, group_size, bits):
    q, qk, qv = make(1, hq, hkv, 1, 301, d, group_size, bits)
    kw = dict(scale=d ** -0.5, mask=None, group_size=group_size, bits=bits)
    ref = quantized_attention_reference(q, qk, qv, **kw)
    got = PATHS[path](q, qk, qv, **kw)
    assert got.shape == ref.shape
    assert mx.allclose(got, ref, atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("q_len,k_len", [(1, 1), (5, 5), (7, 133), (64, 200)])
def test_causal_multi_query_matches_reference(path, q_len, k_len):
    q, qk, qv = make(2, 6, 2, q_len, k_len, 64, 32, 4, seed=q_len)
    kw = dict(scale=0.125, mask="causal", group_size=32, bits=4)
    ref = quantized_attention_reference(q, qk, qv, **kw)
    assert mx.allclose(PATHS[path](q, qk, qv, **kw), ref, atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("path", PATHS)
def test_array_masks_match_reference(path):
    q, qk, qv = make(1, 4, 2, 3, 90, 64, 32, 4, seed=7)
    window = mx.arange(90)[None] > mx.arange(87, 90)[:, None] - 16  # sliding window of 16, (L, S)
    bool_mask = window & (mx.arange(87, 90)[:, None] >= mx.arange(90)[None])
    per_head = mx.where(mx.random.uniform(shape=(1, 4, 3, 90)) > 0.3, 0.0, -1e9)  # additive, per head
    per_head[..., -1] = 0.0  # every row keeps at least one key
    for mask in (bool_mask, per_head):
        kw = dict(scale=0.125, mask=mask, group_size=32, bits=4)
        ref = quantized_attention_reference(q, qk, qv, **kw)
        assert mx.allclose(PATHS[path](q, qk, qv, **kw), ref, atol=1e-4, rtol=1e-4).item()


def test_reference_is_close_to_full_precision_attention():
    """int8 reference vs fp32 SDPA on the unquantized tensors: the oracle itself is sane."""
    mx.random.seed(1)
    q, k, v = (mx.random.normal((1, 4, 3, 64)) for _ in range(3))
    pack = lambda x: mx.quantize(x, group_size=32, bits=8)  # noqa: E731
    ref = quantized_attention_reference(q, pack(k), pack(v), scale=0.125, mask="causal", group_size=32, bits=8)
    exact = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert mx.abs(ref - exact).max().item() < 5e-2 and mx.abs(ref - exact).mean().item() < 5e-3


@pytest.mark.parametrize("path", PATHS)
def test_float16_scales_are_used_at_full_precision(path):
    """The KV cache stores scales/biases in float16; results must equal the reference on them."""
    q, qk, qv = make(1, 6, 2, 9, 120, 64, 32, 4, seed=11)
    half = lambda p: (p[0], p[1].astype(mx.float16), p[2].astype(mx.float16))  # noqa: E731
    kw = dict(scale=0.125, mask="causal", group_size=32, bits=4)
    ref = quantized_attention_reference(q, half(qk), half(qv), **kw)
    assert ref.dtype == mx.float32
    assert mx.allclose(PATHS[path](q, half(qk), half(qv), **kw), ref, atol=1e-4, rtol=1e-4).item()


def test_inputs_are_not_modified():
    q, qk, qv = make(1, 4, 2, 1, 50, 64, 32, 4)
    before = mx.array(q)
    quantized_attention(q, qk, qv, scale=0.125)
    assert mx.array_equal(q, before).item()  # mlx-lm's version scales queries in place
