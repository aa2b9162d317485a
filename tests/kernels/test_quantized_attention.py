"""Every path of kernels/quantized_attention.py against the dequantize-then-attend reference."""

import shutil

import mlx.core as mx
import pytest

from brisk.kernels import ctypes_library, native_attention
from brisk.kernels.native_attention import NativeUnsupported, quantized_attention_native
from brisk.kernels.quantized_attention import (
    quantized_attention,
    quantized_attention_dequantized,
    quantized_attention_reference,
    quantized_attention_single,
    quantized_attention_split,
)
from tests.pairwise import rotate_over

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))
needs_native = pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler to build the native kernel")

PATHS = {
    "single": quantized_attention_single,
    "split": lambda *a, **k: quantized_attention_split(*a, block=37, **k),  # odd block: ragged last block
    "dequantized": quantized_attention_dequantized,
    "native": quantized_attention_native,
    "dispatch": quantized_attention,
    "dispatch_portable": lambda *a, **k: quantized_attention(*a, native=False, **k),
    "dispatch_fused_only": lambda *a, **k: quantized_attention(*a, fused_max_rows=10**9, native=False, **k),
    "dispatch_small_budget": lambda *a, **k: quantized_attention(
        *a, max_score_elements=64, fused_max_rows=10**9, native=False, **k
    ),
}

PATH_PARAMS = [pytest.param(name, marks=needs_native) if name == "native" else name for name in PATHS]


def make(b, hq, hkv, q_len, k_len, d, group_size, bits, seed=0):
    mx.random.seed(seed)
    q = mx.random.normal((b, hq, q_len, d))
    k = mx.random.normal((b, hkv, k_len, d))
    v = mx.random.normal((b, hkv, k_len, d))
    pack = lambda x: mx.quantize(x, group_size=group_size, bits=bits)  # noqa: E731
    return q, pack(k), pack(v)


@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize(
    # Every head dim and group/bits on every path; the GQA head ratio (which query heads share a
    # KV head) meets each of their values: 88 cases, not 216.
    *rotate_over(
        {"d": [64, 128, 256], "group_size,bits": [(32, 4), (64, 4), (32, 8)]}, "hq,hkv", [(4, 4), (9, 3), (8, 2)]
    )
)
def test_decode_step_matches_reference(path, d, group_size, bits, hq, hkv):
    q, qk, qv = make(1, hq, hkv, 1, 301, d, group_size, bits)
    kw = dict(scale=d**-0.5, mask=None, group_size=group_size, bits=bits)
    ref = quantized_attention_reference(q, qk, qv, **kw)
    got = PATHS[path](q, qk, qv, **kw)
    assert got.shape == ref.shape
    assert mx.allclose(got, ref, atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("q_len,k_len", [(1, 1), (5, 5), (7, 133), (64, 200)])
def test_causal_multi_query_matches_reference(path, q_len, k_len):
    q, qk, qv = make(2, 6, 2, q_len, k_len, 64, 32, 4, seed=q_len)
    kw = dict(scale=0.125, mask="causal", group_size=32, bits=4)
    ref = quantized_attention_reference(q, qk, qv, **kw)
    if path == "native" and 3 * q_len > 64:  # more query rows per KV head than the kernel holds
        with pytest.raises(NativeUnsupported):
            PATHS[path](q, qk, qv, **kw)
        return
    assert mx.allclose(PATHS[path](q, qk, qv, **kw), ref, atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_array_masks_match_reference(path):
    q, qk, qv = make(1, 4, 2, 3, 90, 64, 32, 4, seed=7)
    window = mx.arange(90)[None] > mx.arange(87, 90)[:, None] - 16  # sliding window of 16, (L, S)
    bool_mask = window & (mx.arange(87, 90)[:, None] >= mx.arange(90)[None])
    per_head = mx.where(mx.random.uniform(shape=(1, 4, 3, 90)) > 0.3, 0.0, -1e9)  # additive, per head
    per_head[..., -1] = 0.0  # every row keeps at least one key
    for mask in (bool_mask, per_head):
        kw = dict(scale=0.125, mask=mask, group_size=32, bits=4)
        ref = quantized_attention_reference(q, qk, qv, **kw)
        if path == "native":  # mask arrays are the dispatcher's portable paths' job
            with pytest.raises(NativeUnsupported):
                PATHS[path](q, qk, qv, **kw)
            continue
        assert mx.allclose(PATHS[path](q, qk, qv, **kw), ref, atol=1e-4, rtol=1e-4).item()


def test_reference_is_close_to_full_precision_attention():
    """int8 reference vs fp32 SDPA on the unquantized tensors: the oracle itself is sane."""
    mx.random.seed(1)
    q, k, v = (mx.random.normal((1, 4, 3, 64)) for _ in range(3))
    pack = lambda x: mx.quantize(x, group_size=32, bits=8)  # noqa: E731
    ref = quantized_attention_reference(q, pack(k), pack(v), scale=0.125, mask="causal", group_size=32, bits=8)
    exact = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert mx.abs(ref - exact).max().item() < 5e-2 and mx.abs(ref - exact).mean().item() < 5e-3


@pytest.mark.parametrize("path", PATH_PARAMS)
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


@needs_native
@pytest.mark.parametrize("bits", [4, 8])
def test_native_reads_sliced_cache_views_in_place(bits):
    """The cache hands attention views of a longer, preallocated buffer (strided), at
    batch 2 and one KV head: strides of size-1 axes must not matter."""
    q, qk, qv = make(2, 5, 1, 2, 700, 128, 64, bits, seed=3)
    view = lambda p: tuple(x[:, :, :517, :] for x in p)  # noqa: E731
    kw = dict(scale=128**-0.5, mask="causal", group_size=64, bits=bits)
    ref = quantized_attention_reference(q, view(qk), view(qv), **kw)
    assert mx.allclose(quantized_attention_native(q, view(qk), view(qv), **kw), ref, atol=1e-4, rtol=1e-4).item()


@needs_native
def test_native_splits_long_contexts_across_threads_and_merges(monkeypatch):
    """Long contexts are cut into key blocks per thread; the log-sum-exp merge must give
    the reference, whatever the thread count (1, 2, 7)."""
    q, qk, qv = make(1, 8, 2, 3, 5000, 64, 32, 4, seed=5)
    kw = dict(scale=0.125, mask="causal", group_size=32, bits=4)
    ref = quantized_attention_reference(q, qk, qv, **kw)
    for threads in (1, 2, 7):
        monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
        assert mx.allclose(quantized_attention_native(q, qk, qv, **kw), ref, atol=1e-4, rtol=1e-4).item()


@needs_native
def test_dispatcher_sends_decode_steps_to_the_native_kernel_on_the_cpu(monkeypatch):
    import brisk.kernels.quantized_attention as qa

    calls = []
    monkeypatch.setattr(
        qa,
        "quantized_attention_native",
        lambda *a, **k: calls.append(a[0].shape) or quantized_attention_native(*a, **k),
    )
    q, qk, qv = make(1, 6, 2, 1, 100, 64, 32, 4)
    qa.quantized_attention(q, qk, qv, scale=0.125)
    assert calls == [(1, 6, 1, 64)]
    big_q, bk, bv = make(1, 6, 2, 64, 100, 64, 32, 4)  # a prefill chunk: dequantize + SDPA
    qa.quantized_attention(big_q, bk, bv, scale=0.125, mask="causal")
    assert len(calls) == 1


def test_without_the_native_kernel_the_dispatcher_falls_back(monkeypatch, tmp_path):
    """A failed build (here: a compiler that does not exist) disables the native path
    with a reason, and attention still equals the reference."""
    monkeypatch.setattr(ctypes_library, "_state", {})
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))
    assert ctypes_library.load() is None and "no-such-compiler" in ctypes_library.unavailable_reason()
    q, qk, qv = make(1, 6, 2, 1, 100, 64, 32, 4)
    ref = quantized_attention_reference(q, qk, qv, scale=0.125)
    assert mx.allclose(quantized_attention(q, qk, qv, scale=0.125), ref, atol=1e-4, rtol=1e-4).item()
    monkeypatch.setattr(ctypes_library, "_state", {})
    monkeypatch.setenv("BRISK_NATIVE_KERNELS", "0")
    assert ctypes_library.load() is None and "BRISK_NATIVE_KERNELS" in ctypes_library.unavailable_reason()


@needs_native
def test_native_kernel_is_built_once_into_the_cache(monkeypatch, tmp_path, copying_compiler):
    monkeypatch.setattr(ctypes_library, "_state", {})
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", copying_compiler)  # the build's rules, not a second compile
    assert ctypes_library.load() is not None, ctypes_library.unavailable_reason()
    built = [f for f in tmp_path.iterdir() if f.suffix in (".so", ".dylib")]
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(ctypes_library, "_state", {})
    assert ctypes_library.load() is not None and built[0].stat().st_mtime_ns == stamp


@needs_native
def test_native_kernel_without_f16c_converts_half_scales_the_same(monkeypatch, tmp_path):
    """CPUs without F16C (and arm64 builds) take the kernel's plain float16 conversion:
    build that variant and check it on scales with subnormal and negative values."""
    import subprocess

    from brisk.kernels import mlx_extension
    from brisk.kernels.prebuilt import Loaded

    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    lib_path = tmp_path / "portable_half.so"
    subprocess.run(ctypes_library.compile_command(cxx, lib_path, "-DBRISK_PORTABLE_HALF"), check=True)
    portable, calls = ctypes_library.open_library(lib_path), []
    kernel = portable.brisk_kv_attention
    monkeypatch.setattr(portable, "brisk_kv_attention", lambda *args: calls.append(1) or kernel(*args))
    # The ctypes path with this build: the loaders' state as they record it (the MLX primitives,
    # built without the define, would otherwise take the call).
    monkeypatch.setattr(mlx_extension, "_state", {"loaded": Loaded(None, "off", note="the ctypes path under test")})
    monkeypatch.setattr(ctypes_library, "_state", {"loaded": Loaded(portable, "built locally", str(lib_path))})
    q, qk, qv = make(1, 6, 2, 2, 300, 64, 32, 4, seed=9)
    tiny = lambda p: (p[0], (p[1] * 1e-5).astype(mx.float16), p[2].astype(mx.float16))  # noqa: E731
    subnormal = tiny(qk)
    magnitude = mx.abs(subnormal[1])
    assert ((magnitude > 0) & (magnitude < 6.1e-5)).any().item()  # below float16's smallest normal
    for keys in (subnormal, (qk[0], qk[1].astype(mx.float16), qk[2].astype(mx.float16))):
        values = (qv[0], qv[1].astype(mx.float16), qv[2].astype(mx.float16))
        kw = dict(scale=0.125, mask="causal", group_size=32, bits=4)
        ref = quantized_attention_reference(q, keys, values, **kw)
        assert mx.allclose(quantized_attention_native(q, keys, values, **kw), ref, atol=1e-4, rtol=1e-4).item()
    assert len(calls) == 2  # both answers came from the portable build


@needs_native
def test_native_head_dim_96_holds_row_sums_in_blocks_of_four():
    """96 = 12 vectors of 8: the kernel keeps a row's value sums in registers four at a time."""
    q, qk, qv = make(1, 8, 2, 2, 333, 96, 32, 4, seed=4)
    kw = dict(scale=96**-0.5, mask="causal", group_size=32, bits=4)
    ref = quantized_attention_reference(q, qk, qv, **kw)
    assert mx.allclose(quantized_attention_native(q, qk, qv, **kw), ref, atol=1e-4, rtol=1e-4).item()
