"""The fused CPU attention kernel against MLX's own attention, alone and inside loaded models."""

import shutil

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from brisk.kernels import fused_attention, mlx_extension, native_attention
from brisk.kernels.coarse import coarse_products
from brisk.kernels.fused_attention import (
    attention_native,
    attention_reference,
    mlx_attention_only,
    scaled_dot_product_attention,
    use_fused_attention,
)
from brisk.kernels.native_attention import NativeUnsupported
from brisk.kernels.prebuilt import Loaded

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
pytestmark = pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the MLX primitives")


def _relative_error(got, want) -> float:
    return (mx.max(mx.abs(got - want)) / mx.max(mx.abs(want))).item()


def _problem(shape, kv_dtype):
    """Queries, and keys and values as a KV cache hands them over: views into a longer buffer."""
    b, hq, hkv, length, keys_n, d = shape
    mx.random.seed(sum(shape))
    q = mx.random.normal((b, hq, length, d))
    k_buffer, v_buffer = (mx.random.normal((2, b, hkv, keys_n + 20, d)) * 2).astype(kv_dtype)
    return q, k_buffer[:, :, :keys_n], v_buffer[:, :, :keys_n]


@pytest.mark.parametrize(
    "shape",
    [
        # B, Hq, Hkv, L, S, D
        (1, 9, 3, 1, 37, 64),  # decode, GQA 3
        (1, 9, 3, 5, 100, 64),  # a verify pass after cached tokens
        (2, 4, 4, 17, 17, 128),  # batch 2, no GQA, a whole prompt
        (1, 14, 2, 70, 300, 64),  # a prefill chunk after cached tokens, GQA 7, several query tiles
        (1, 8, 1, 3, 9, 256),  # head dim 256, one KV head
        (1, 6, 2, 33, 70, 80),  # head dim 80 (not a multiple of 32)
        (1, 4, 2, 1, 1, 96),  # a single key
    ],
)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_dtype", [mx.float32, mx.float16])  # float16: a half-precision KV cache
def test_the_kernel_equals_mlx_attention(shape, causal, kv_dtype):
    d = shape[-1]
    q, k, v = _problem(shape, kv_dtype)
    mask = "causal" if causal else None
    # the definition on the same stored values, widened: only the kernel's arithmetic differs
    want = attention_reference(q, k.astype(mx.float32), v.astype(mx.float32), scale=d**-0.5, mask=mask)
    got = attention_native(q, k, v, scale=d**-0.5, mask=mask)
    assert got.shape == want.shape and got.dtype == mx.float32
    assert _relative_error(got, want) < 1e-5


def _avx512() -> bool:
    try:
        return {"avx512f", "avx512dq"} <= set(open("/proc/cpuinfo").read().split())
    except OSError:
        return False


@pytest.mark.parametrize(
    "shape",
    [
        # B, Hq, Hkv, L, S, D: prefill chunks of 64+ rows (attention_flash.cpp: six rows
        # against panels of 64 keys; attention_tiles.cpp: whole heads against blocks of 256)
        (1, 12, 2, 300, 1100, 128),  # GQA 6 after 800 cached tokens: stacked and head-by-head blocks
        (1, 9, 3, 64, 64, 64),  # the shortest chunk it takes, a whole prompt
        (2, 4, 4, 130, 517, 80),  # batch 2, a last block of 5 keys, a head dim of 64 + 16
        (1, 8, 1, 70, 256, 256),  # head dim 256, exactly one block
        (1, 4, 2, 97, 203, 96),  # rows not a multiple of six, a last panel of 11 keys, 64 + 32
    ],
)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_dtype", [mx.float32, mx.float16])
def test_long_chunks_in_flash_and_sgemm_tiles_equal_mlx_and_the_row_kernel(shape, causal, kv_dtype, monkeypatch):
    """attention_flash.cpp (AVX-512), attention_tiles.cpp's sgemm blocks
    (BRISK_ATTENTION_FLASH=0) and attention.cpp's row kernel (BRISK_ATTENTION_TILES=0), each
    read per call, against MLX's attention, on keys viewed inside a longer cache buffer."""
    d = shape[-1]
    q, k, v = _problem(shape, kv_dtype)
    mask = "causal" if causal else None
    want = attention_reference(q, k.astype(mx.float32), v.astype(mx.float32), scale=d**-0.5, mask=mask)
    results = []
    for switch in (None, "BRISK_ATTENTION_FLASH", "BRISK_ATTENTION_TILES"):
        if switch:
            monkeypatch.setenv(switch, "0")
        results.append(attention_native(q, k, v, scale=d**-0.5, mask=mask))
        mx.eval(results[-1])
    flash, tiles, rows = results
    for got in results:
        assert _relative_error(got, want) < 1e-5
    assert not mx.array_equal(tiles, rows).item()  # the paths really ran (their sums differ in order)
    if _avx512():
        assert not mx.array_equal(flash, tiles).item()


@pytest.mark.parametrize("causal", [True, False])
def test_attention_sinks_take_their_share_of_the_softmax(causal):
    q = mx.random.normal((1, 6, 5, 64))
    k, v = mx.random.normal((2, 1, 2, 40, 64))
    sinks = mx.random.normal((6,)) * 3
    mask = "causal" if causal else None
    want = attention_reference(q, k, v, scale=0.125, mask=mask, sinks=sinks)
    assert _relative_error(attention_native(q, k, v, scale=0.125, mask=mask, sinks=sinks), want) < 1e-5
    assert _relative_error(want, attention_reference(q, k, v, scale=0.125, mask=mask)) > 1e-3  # they matter


def test_extreme_scores_neither_overflow_nor_lose_the_softmax():
    mx.random.seed(7)
    q = mx.random.normal((1, 2, 4, 64)) * 30  # scores in the hundreds: exp overflows without the max
    k, v = mx.random.normal((2, 1, 1, 200, 64))
    want = attention_reference(q, k, v, scale=1.0, mask="causal")
    got = attention_native(q, k, v, scale=1.0, mask="causal")
    assert not mx.any(mx.isnan(got)).item()
    # Scores this large carry float32 rounding of ~1e-4 absolute into the exponent, in MLX's
    # attention as in ours: the two differ by up to 4e-5 relative over 40 seeds, not 1e-5.
    assert _relative_error(got, want) < 1e-4


@pytest.mark.parametrize("kv_dtype", [mx.float32, mx.float16])
def test_rows_that_are_themselves_strided_are_copied_not_misread(kv_dtype):
    q = mx.random.normal((1, 4, 2, 64))
    k = mx.random.normal((1, 2, 64, 10)).astype(kv_dtype).swapaxes(-1, -2)  # each key row strided
    v = mx.random.normal((1, 2, 10, 64)).astype(kv_dtype)
    mx.eval(k)
    want = attention_reference(q, k.astype(mx.float32), v.astype(mx.float32), scale=0.125, mask="causal")
    assert _relative_error(attention_native(q, k, v, scale=0.125, mask="causal"), want) < 1e-5


def test_it_runs_lazily_inside_a_compiled_graph():
    q, k, v = mx.random.normal((3, 1, 4, 6, 64))

    def block(q, k, v):
        return mx.tanh(attention_native(q * 2, k, v, scale=0.1, mask="causal"))

    want = mx.tanh(attention_reference(q * 2, k, v, scale=0.1, mask="causal"))
    assert _relative_error(mx.compile(block)(q, k, v), want) < 1e-5


@pytest.mark.parametrize("kv_dtype", [mx.float32, mx.float16])
def test_a_length_counts_only_the_first_keys_of_a_fixed_buffer(kv_dtype):
    q = mx.random.normal((1, 6, 1, 64))
    k_buffer, v_buffer = mx.random.normal((2, 1, 2, 256, 64)).astype(kv_dtype)
    for used in (1, 37, 256):
        k, v = (b[:, :, :used].astype(mx.float32) for b in (k_buffer, v_buffer))
        want = attention_reference(q, k, v, scale=0.125)
        got = attention_native(q, k_buffer, v_buffer, scale=0.125, length=mx.array([used], dtype=mx.int32))
        assert _relative_error(got, want) < 1e-5
        # the drop-in, given a cache with a length, masks the rest when MLX's attention runs
        cache = type("FixedSlot", (), {"length": mx.array([used], dtype=mx.int32)})()
        with mlx_attention_only():
            masked = scaled_dot_product_attention(q, k_buffer, v_buffer, cache, scale=0.125, mask=None)
        assert _relative_error(masked, want) < 1e-5
    with pytest.raises(RuntimeError, match="length outside the keys"):
        mx.eval(attention_native(q, k_buffer, v_buffer, scale=0.125, length=mx.array([257], dtype=mx.int32)))
    with pytest.raises(NativeUnsupported, match="length"):
        attention_native(q, k_buffer, v_buffer, scale=0.125, length=mx.array([3, 4], dtype=mx.int32))


def test_what_the_kernel_does_not_take_is_declined():
    q, k, v = mx.random.normal((3, 1, 4, 6, 64))
    with pytest.raises(NativeUnsupported, match="mask array"):
        attention_native(q, k, v, scale=0.1, mask=mx.ones((6, 6), dtype=mx.bool_))
    with pytest.raises(NativeUnsupported, match="float32"):
        attention_native(q.astype(mx.float16), k, v, scale=0.1)
    with pytest.raises(NativeUnsupported, match="float16"):  # keys and values of two dtypes
        attention_native(q, k.astype(mx.float16), v, scale=0.1)
    with pytest.raises(NativeUnsupported, match="float16"):
        attention_native(q, k.astype(mx.bfloat16), v.astype(mx.bfloat16), scale=0.1)
    with pytest.raises(NativeUnsupported, match="shapes"):  # head dim not a multiple of 8
        attention_native(q[..., :60], k[..., :60], v[..., :60], scale=0.1)
    with pytest.raises(NativeUnsupported, match="shapes"):  # 4 query heads over 3 KV heads
        attention_native(q, mx.concatenate([k] * 3, axis=1), mx.concatenate([v] * 3, axis=1), scale=0.1)


def test_the_drop_in_sends_what_the_kernel_declines_to_mlx_lm(monkeypatch):
    q, k, v = mx.random.normal((3, 1, 4, 6, 64))
    mask = mx.tril(mx.ones((6, 6), dtype=mx.bool_))
    for q_in, m in ((q, mask), (q.astype(mx.float16), "causal")):  # a mask array; half precision
        want = fused_attention.MLX_LM_SDPA(q_in, k, v, None, scale=0.1, mask=m)
        assert mx.array_equal(scaled_dot_product_attention(q_in, k, v, None, scale=0.1, mask=m), want).item()
    calls = []
    monkeypatch.setattr(fused_attention, "attention_native", lambda *a, **k: calls.append(1))
    with mlx_attention_only():
        scaled_dot_product_attention(q, k, v, None, scale=0.1, mask="causal")
    assert calls == []
    scaled_dot_product_attention(q, k, v, None, scale=0.1, mask="causal")
    assert calls == [1]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text", "gpt_oss"])
def test_loaded_models_attend_through_the_kernel_with_mlx_logits(tmp_path, arch, monkeypatch):
    """Prefill chunks, a verify pass and decode steps after a cached prefix: the loader rebinds
    the attention, and the logits are MLX's. gemma3's sliding layers (a mask array once a chunk
    is longer than the window) keep MLX's attention; gpt-oss's sinks go to the kernel."""
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    lm = load_folder(make_tiny_model(tmp_path / arch, arch), model_id=arch)
    ids = (mx.arange(48)[None] * 7 + 3) % 300

    def logits():
        cache = make_prompt_cache(lm.model)
        out = [lm.model(ids[:, :20], cache=cache), lm.model(ids[:, 20:40], cache=cache)]  # two prefill chunks
        out.append(lm.model(ids[:, 40:45], cache=cache))  # a verify pass
        out += [lm.model(ids[:, i : i + 1], cache=cache) for i in range(45, 48)]  # decode
        return mx.concatenate(out, axis=1)

    calls = []
    real = fused_attention.attention_native
    monkeypatch.setattr(
        fused_attention, "attention_native", lambda q, *a, **k: calls.append(q.shape[2]) or real(q, *a, **k)
    )
    with mlx_attention_only():
        want = logits()
    assert calls == []
    got = logits()
    assert set(calls) >= {20, 5, 1}, calls
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item()
    assert mx.array_equal(mx.argmax(got, axis=-1), mx.argmax(want, axis=-1)).item()


def test_without_the_primitives_attention_is_mlx_s_and_decode_still_compiles(tmp_path, monkeypatch):
    """With no kernel to run (BRISK_KERNELS=off, a GPU) the model still attends through the
    drop-in, which runs MLX's own SDPA: mlx-lm's logits, and a compiled decode step is
    allowed (the drop-in masks the step's spare buffer positions; mlx-lm's would read them)."""
    from mlx_lm.models import llama

    from brisk.engine.decode.compiled import why_not_compiled
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    monkeypatch.setattr(mlx_extension, "_state", {"loaded": Loaded(None, "off", note="turned off for the test")})
    monkeypatch.setattr(llama, "scaled_dot_product_attention", fused_attention.MLX_LM_SDPA)
    lm = load_folder(make_tiny_model(tmp_path / "llama", "llama"), model_id="llama")
    assert llama.scaled_dot_product_attention is scaled_dot_product_attention
    layers = make_prompt_cache(lm.model)
    got = lm.model(mx.array([[3, 9, 27, 81, 243, 7, 21]]), cache=layers)
    assert why_not_compiled(lm.model, layers, kv_bits=(16, 16)) is None
    monkeypatch.setattr(llama, "scaled_dot_product_attention", fused_attention.MLX_LM_SDPA)
    assert "does not go through Brisk's" in why_not_compiled(lm.model, layers, kv_bits=(16, 16))
    want = lm.model(mx.array([[3, 9, 27, 81, 243, 7, 21]]), cache=make_prompt_cache(lm.model))
    assert mx.array_equal(got, want).item()
    assert use_fused_attention(lm.model) == 1 and why_not_compiled(lm.model, layers, kv_bits=(16, 16)) is None


@pytest.mark.parametrize("shape", [(1, 9, 3, 1, 1000, 64), (1, 12, 2, 1, 700, 128), (1, 9, 3, 5, 600, 64)])
@pytest.mark.parametrize("kv_dtype", [mx.float32, mx.float16])
def test_decode_over_many_key_parts_equals_mlx(shape, kv_dtype):
    """Decode and short verify passes over more than 256 keys split the keys into parts run
    as units of their own, merged after (attention.cpp's kPartKeys)."""
    q, k, v = _problem(shape, kv_dtype)
    d = shape[-1]
    want = attention_reference(q, k.astype(mx.float32), v.astype(mx.float32), scale=d**-0.5, mask="causal")
    assert _relative_error(attention_native(q, k, v, scale=d**-0.5, mask="causal"), want) < 1e-5


@pytest.mark.parametrize("length", [5, 20])  # 5: split into key parts as decode is; 20: two query tiles, not split
@pytest.mark.parametrize("heads", [(9, 3, 64), (14, 2, 128), (10, 2, 80)])  # GQA 3, 7 (3+3+1 rows a call), 5 (3+2)
def test_a_row_gives_the_same_bits_alone_as_in_a_verify_pass(length, heads):
    """Greedy speculative decoding equals plain decoding only if a verify pass's row i comes
    out exactly as the decode step over the same keys would give it."""
    hq, hkv, d = heads
    q, k, v = _problem((1, hq, hkv, length, 900, d), mx.float16)
    together = attention_native(q, k, v, scale=0.125, mask="causal")
    for i in range(length):
        keys = 900 - length + i + 1
        alone = attention_native(q[:, :, i : i + 1], k[:, :, :keys], v[:, :, :keys], scale=0.125, mask="causal")
        assert mx.array_equal(alone[:, :, 0], together[:, :, i]).item()


def test_sinks_start_only_the_first_key_part():
    q = mx.random.normal((1, 6, 1, 64))
    k, v = mx.random.normal((2, 1, 2, 700, 64))
    sinks = mx.random.normal((6,)) * 3
    want = attention_reference(q, k, v, scale=0.125, mask="causal", sinks=sinks)
    assert _relative_error(attention_native(q, k, v, scale=0.125, mask="causal", sinks=sinks), want) < 1e-5


def test_long_chunks_give_the_same_bits_on_any_number_of_threads(monkeypatch):
    """Work units (six rows of a head in attention_flash.cpp) never share a row's sums."""
    q, k, v = _problem((1, 6, 2, 100, 300, 64), mx.float16)
    results = []
    for threads in (1, 2, 7):
        monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
        results.append(attention_native(q, k, v, scale=0.125, mask="causal"))
        mx.eval(results[-1])
    assert all(mx.array_equal(results[0], other).item() for other in results[1:])


def _bf16_cpu() -> bool:
    try:
        return {"avx512f", "avx512bw", "avx512dq", "avx512_bf16"} <= set(open("/proc/cpuinfo").read().split())
    except OSError:
        return False


@pytest.mark.parametrize("shape", [(1, 9, 3, 130, 300, 64), (2, 4, 4, 70, 517, 80), (1, 12, 2, 97, 203, 128)])
@pytest.mark.parametrize("causal", [True, False])
def test_coarse_long_chunks_multiply_in_bfloat16_and_only_inside_the_block(shape, causal):
    """Inside coarse_products() long chunks take bfloat16 pairs (float32 sums) where the CPU
    has AVX512-BF16: a few 1e-3 from MLX, where the exact paths are at 1e-6; outside the
    block, or on other CPUs, the same bits as the exact path."""
    d = shape[-1]
    q, k, v = _problem(shape, mx.float16)
    mask = "causal" if causal else None
    want = attention_reference(q, k.astype(mx.float32), v.astype(mx.float32), scale=d**-0.5, mask=mask)
    exact = attention_native(q, k, v, scale=d**-0.5, mask=mask)
    with coarse_products():
        coarse = attention_native(q, k, v, scale=d**-0.5, mask=mask)
    after = attention_native(q, k, v, scale=d**-0.5, mask=mask)
    mx.eval(exact, coarse, after)
    assert mx.array_equal(exact, after).item() and _relative_error(exact, want) < 1e-5
    if _bf16_cpu():
        assert 1e-4 < _relative_error(coarse, want) < 2e-2
    else:
        assert mx.array_equal(coarse, exact).item()
