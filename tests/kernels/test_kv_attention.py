"""kernels/packed_kv.py's layouts and every path of kernels/kv_attention.py against the
dequantize-then-attend reference: keys dense, per token or per channel (with dense recent
rows), values dense or per token, at their own bits."""

from unittest import mock

import mlx.core as mx
import pytest

from brisk.kernels import ctypes_library, mlx_extension, native_attention
from brisk.kernels.kv_attention import (
    kv_attention,
    kv_attention_dequantized,
    kv_attention_fused,
    kv_attention_reference,
)
from brisk.kernels.native_attention import NativeUnsupported, kv_attention_native
from brisk.kernels.packed_kv import TOKEN_GROUP, ChannelPacked, Dense, TokenPacked
from tests.kernels.test_quantized_attention import needs_native
from tests.pairwise import rotate_over


def native_ctypes(*args, **kwargs):
    """The native kernel through its ctypes library, as on a machine without the primitives."""
    with mock.patch.object(mlx_extension, "load", return_value=None):
        return kv_attention_native(*args, **kwargs)


PATHS = {
    "fused": kv_attention_fused,
    "dequantized": kv_attention_dequantized,
    "native": kv_attention_native,  # the lazy MLX primitive where it can be built
    "native_ctypes": native_ctypes,
    "dispatch": kv_attention,
    "dispatch_portable": lambda *a, **k: kv_attention(*a, native=False, **k),
}
PATH_PARAMS = [pytest.param(name, marks=needs_native) if name.startswith("native") else name for name in PATHS]
needs_primitives = pytest.mark.skipif(
    mlx_extension.load() is None, reason=f"no MLX primitives module: {mlx_extension.unavailable_reason()}"
)


def layout(kind: str, x: mx.array, bits: int, recent: int = 0):
    if kind == "dense":
        return Dense(x)
    if kind == "token":
        return TokenPacked.pack(x, bits=bits, group=32)
    packed = x.shape[2] - recent
    return ChannelPacked.pack(x[:, :, :packed], bits=bits, recent=x[:, :, packed:].astype(mx.float16))


def make(hq, hkv, q_len, k_len, d, seed=0):
    mx.random.seed(seed)
    return (
        mx.random.normal((1, hq, q_len, d)),
        mx.random.normal((1, hkv, k_len, d)),
        mx.random.normal((1, hkv, k_len, d)),
    )


@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize(
    # Every layout, head dim and recent-row count on every path; the GQA head ratio (which query
    # heads share a KV head) meets each of their values: 144 cases, not 288.
    *rotate_over(
        {
            "keys,k_bits,values,v_bits": [
                ("channel", 4, "token", 4),
                ("channel", 8, "token", 4),
                ("channel", 4, "token", 8),
                ("channel", 4, "dense", 16),
                ("dense", 16, "token", 4),
                ("token", 4, "token", 4),
            ],
            "d": [64, 128],
            "recent": [0, 37],
        },
        "hq,hkv",
        [(4, 4), (14, 2)],
    )
)
def test_decode_step_matches_reference(path, keys, k_bits, values, v_bits, d, recent, hq, hkv):
    q, k, v = make(hq, hkv, 1, 8 * TOKEN_GROUP + recent, d)
    kl, vl = layout(keys, k, k_bits, recent), layout(values, v, v_bits)
    ref = kv_attention_reference(q, kl, vl, scale=d**-0.5)
    got = PATHS[path](q, kl, vl, scale=d**-0.5)
    assert got.shape == ref.shape
    assert mx.allclose(got, ref, atol=2e-4, rtol=2e-4).item()


@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("q_len,packed_groups,recent", [(1, 1, 0), (3, 2, 5), (5, 0, 40), (16, 4, 33)])
def test_causal_rows_match_reference(path, q_len, packed_groups, recent):
    """Verify and prefill rows (causal), including keys that are only recent rows."""
    q, k, v = make(8, 2, q_len, packed_groups * TOKEN_GROUP + recent, 64, seed=1)
    kl, vl = layout("channel", k, 4, recent), layout("token", v, 4)
    ref = kv_attention_reference(q, kl, vl, scale=0.125, mask="causal")
    assert mx.allclose(PATHS[path](q, kl, vl, scale=0.125, mask="causal"), ref, atol=2e-4, rtol=2e-4).item()


@pytest.mark.parametrize("d", [80, 96, 256])
@needs_native
def test_native_head_dims(d):
    q, k, v = make(4, 2, 2, 3 * TOKEN_GROUP + 7, d, seed=2)
    kl, vl = layout("channel", k, 4, 7), (Dense(v) if d == 80 else layout("token", v, 4))
    ref = kv_attention_reference(q, kl, vl, scale=d**-0.5, mask="causal")
    got = kv_attention_native(q, kl, vl, scale=d**-0.5, mask="causal")
    assert mx.allclose(got, ref, atol=2e-4, rtol=2e-4).item()


@needs_native
def test_native_spreads_long_contexts_over_threads_on_group_bounds(monkeypatch):
    """Blocks split across threads must start on packed groups: an odd split would read a
    group's scales for the wrong tokens."""
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", 3)
    q, k, v = make(2, 1, 1, 45 * TOKEN_GROUP + 11, 64, seed=3)
    kl, vl = layout("channel", k, 4, 11), layout("token", v, 4)
    ref = kv_attention_reference(q, kl, vl, scale=0.125)
    assert mx.allclose(kv_attention_native(q, kl, vl, scale=0.125), ref, atol=2e-4, rtol=2e-4).item()


@needs_primitives
def test_native_runs_as_a_lazy_primitive_without_the_ctypes_library():
    """The node is built without evaluating anything: the ctypes path (which evaluates its
    inputs per layer) is never asked for, and the graph stays lazy until mx.eval."""
    q, k, v = make(14, 2, 1, 4 * TOKEN_GROUP + 5, 64, seed=4)
    kl, vl = layout("channel", k, 4, 5), layout("token", v, 4)
    ref = kv_attention_reference(q, kl, vl, scale=0.125)
    with mock.patch.object(ctypes_library, "load", side_effect=AssertionError("the ctypes library was used")):
        got = kv_attention_native(q * 1.0, kl, vl, scale=0.125)
    assert mx.allclose(got, ref, atol=2e-4, rtol=2e-4).item()


@needs_primitives
def test_native_primitive_reads_arrays_whose_last_axis_is_strided():
    """A transposed view (last axis not contiguous) is copied before the kernel reads it."""
    q, k, v = make(4, 2, 1, 3 * TOKEN_GROUP, 64, seed=5)
    values = layout("token", v, 4)
    strided = TokenPacked(
        mx.contiguous(values.data.swapaxes(-1, -2)).swapaxes(-1, -2),
        values.scales,
        values.biases,
        values.bits,
        values.group,
    )
    keys = Dense(mx.contiguous(k.swapaxes(-1, -2)).swapaxes(-1, -2))
    ref = kv_attention_reference(q, Dense(k), values, scale=0.125)
    assert mx.allclose(kv_attention_native(q, keys, strided, scale=0.125), ref, atol=2e-4, rtol=2e-4).item()


@needs_native
def test_a_verify_pass_of_many_gqa_rows_takes_the_native_kernel(monkeypatch):
    """Nine tokens on a GQA-7 model are 63 rows per KV head: the kernel's limit is 64, and
    past the old limit of 16 the pass went to MLX's quantized matmul (3-6x slower)."""
    import brisk.kernels.kv_attention as dispatcher

    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return kv_attention_native(*args, **kwargs)

    monkeypatch.setattr(dispatcher, "kv_attention_native", counted)
    q, k, v = make(14, 2, 9, 6 * TOKEN_GROUP + 20, 64, seed=7)
    packed = 5 * TOKEN_GROUP
    keys = ChannelPacked.pack(k[:, :, :packed], bits=4, recent=k[:, :, packed:].astype(mx.float16))
    keys = ChannelPacked(keys.data, keys.scales, keys.biases, 4, keys.recent, packed, (packed,) * 9)
    vl = layout("token", v, 4)
    ref = kv_attention_reference(q, keys, vl, scale=0.125, mask="causal")
    got = kv_attention(q, keys, vl, scale=0.125, mask="causal")
    assert calls == [(1, 14, 9, 64)]
    assert mx.allclose(got, ref, atol=2e-4, rtol=2e-4).item()


@needs_primitives
def test_prefill_chunks_attend_dequantized_keys_with_the_fused_kernel(monkeypatch):
    """Many rows (a prefill chunk) dequantize this layer's K/V and attend with Brisk's fused
    float kernel, not MLX's CPU SDPA (which made a packed cache read a 4K prompt in twice
    the time of a float one)."""
    from brisk.kernels import fused_attention

    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    real = fused_attention.attention_native
    monkeypatch.setattr(fused_attention, "attention_native", counted)
    q, k, v = make(8, 2, 40, 4 * TOKEN_GROUP + 40, 64, seed=6)
    kl, vl = layout("channel", k, 4, 40), layout("token", v, 4)
    ref = kv_attention_reference(q, kl, vl, scale=0.125, mask="causal")
    got = kv_attention(q, kl, vl, scale=0.125, mask="causal")
    assert calls == [(1, 8, 40, 64)]
    assert mx.allclose(got, ref, atol=2e-4, rtol=2e-4).item()


@needs_native
def test_native_declines_a_mask_array():
    q, k, v = make(2, 1, 1, 64, 64)
    with pytest.raises(NativeUnsupported):
        kv_attention_native(q, Dense(k), layout("token", v, 4), scale=0.125, mask=mx.zeros((1, 64)))


def test_per_channel_keys_keep_an_outlier_channel_from_smearing_the_rest():
    """Qwen2-like keys: one channel 50x larger. Per-token groups share its scale with 31
    other channels; per-channel groups give every channel its own."""
    mx.random.seed(4)
    k = mx.random.normal((1, 1, 256, 64))
    k = mx.concatenate([k[..., :1] * 50 + 20, k[..., 1:]], axis=-1)
    by_token = TokenPacked.pack(k, bits=4, group=32).dequantize()
    by_channel = ChannelPacked.pack(k, bits=4).dequantize()
    error = lambda x: mx.abs(x[..., 1:] - k[..., 1:]).mean().item()  # noqa: E731  (the ordinary channels)
    assert error(by_channel) < error(by_token) / 4


def test_packing_stays_within_a_step_of_the_grid():
    mx.random.seed(5)
    x = mx.random.normal((2, 3, 64, 64)) * 3 + 1
    for bits in (4, 8):
        packed = TokenPacked.pack(x, bits=bits, group=32)
        assert packed.scales.dtype == mx.float16 and packed.data.dtype == mx.uint32
        step = mx.abs(packed.scales.astype(mx.float32)).reshape(2, 3, 64, 2, 1)  # mx.quantize may flip its sign
        error = mx.abs(packed.dequantize().reshape(2, 3, 64, 2, 32) - x.reshape(2, 3, 64, 2, 32))
        assert mx.all(error <= step * 1.1).item()  # mx.quantize's grid: within a step; float16 scale and bias
        constant = TokenPacked.pack(mx.ones((1, 1, 4, 32)) * 0.5, bits=bits, group=32)
        assert mx.array_equal(constant.dequantize(), mx.ones((1, 1, 4, 32)) * 0.5).item()  # zero range


@pytest.mark.parametrize("path", [p for p in PATH_PARAMS if p != "dequantized"])  # it refuses (tested below)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (14, 2)])
def test_rows_with_their_own_packed_limits_match_reference(path, hq, hkv):
    """A verify pass across a group boundary: the newest packed group is also held dense,
    and rows before the boundary read it dense, rows after it packed."""
    q, k, v = make(hq, hkv, 8, 200, 64, seed=6)
    both = ChannelPacked.pack(k[:, :, :192], bits=4)
    keys = ChannelPacked(
        both.data,
        both.scales,
        both.biases,
        4,
        k[:, :, 160:].astype(mx.float16),
        recent_from=160,
        limits=(160,) * 3 + (192,) * 5,
    )
    values = layout("token", v, 4)
    ref = kv_attention_reference(q, keys, values, scale=0.125, mask="causal")
    assert mx.allclose(PATHS[path](q, keys, values, scale=0.125, mask="causal"), ref, atol=2e-4, rtol=2e-4).item()
    # and the limits matter: reading the group dense in every row gives another answer
    all_dense = ChannelPacked(both.data, both.scales, both.biases, 4, keys.recent, recent_from=160)
    assert not mx.allclose(
        kv_attention_reference(q, all_dense, values, scale=0.125, mask="causal")[:, :, 3:], ref[:, :, 3:], atol=1e-4
    ).item()


def test_dequantized_path_refuses_rows_with_their_own_limits():
    q, k, v = make(2, 2, 2, 96, 64)
    both = ChannelPacked.pack(k[:, :, :64], bits=4)
    keys = ChannelPacked(both.data, both.scales, both.biases, 4, k[:, :, 32:], recent_from=32, limits=(32, 64))
    with pytest.raises(ValueError, match="fused path"):
        kv_attention_dequantized(q, keys, Dense(v), scale=0.125, mask="causal")
