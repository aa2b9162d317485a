"""SpecPrefill's pooled attention: the native kernel and MLX's ops against the definition in
float64, and the kernel's refusals."""

import shutil

import mlx.core as mx
import numpy as np
import pytest

from brisk.kernels import mlx_extension
from brisk.kernels.native_attention import NativeUnsupported
from brisk.kernels.pooled_attention import (
    pooled_attention_max,
    pooled_attention_max_native,
    pooled_attention_max_reference,
)

HAVE_COMPILER = bool(shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"))


def needs_native():
    if not HAVE_COMPILER:
        pytest.skip("no C++ compiler to build the MLX primitives")
    if mlx_extension.load() is None:
        pytest.skip(f"the MLX primitives cannot be built here: {mlx_extension.unavailable_reason()}")


def definition(logits: np.ndarray, visible_first: int, start: int, end: int, kernel: int) -> np.ndarray:
    """Row by row in float64: softmax over the keys the row saw (the rest weigh 0), the slice
    [start, end) zero-padded by kernel // 2 on each side, the window mean, the max over heads."""
    heads, rows, seen = logits.shape
    pad = kernel // 2
    out = np.zeros((rows, end - start))
    for r in range(rows):
        visible = min(seen, visible_first + r)
        x = logits[:, r, :visible].astype(np.float64)
        p = np.zeros((heads, seen))
        with np.errstate(invalid="ignore"):  # NaN where a softmax is (a NaN, +inf or no finite logit)
            p[:, :visible] = np.exp(x - x.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
        padded = np.pad(p[:, start:end], [(0, 0), (pad, pad)])
        windows = np.stack([padded[:, j : j + end - start] for j in range(kernel)]).sum(axis=0) / kernel
        out[r] = windows.max(axis=0)
    return out


CASES = [
    # heads, rows, keys, visible_first, start, end, kernel
    (14, 32, 2100, 2100 - 127, 0, 2092, 13),  # a draft's window block: rows see one more key each
    (2, 9, 300, 292, 40, 292, 13),  # a follow-up turn: the slice starts inside the cache
    (3, 5, 100, 1, 10, 90, 13),  # rows that saw fewer keys than the slice holds
    (2, 7, 50, 45, 0, 50, 3),  # the last rows see keys capped at the cache's length
    (4, 3, 40, 38, 20, 21, 13),  # a one-key slice: the window's zeros around it count
    (1, 1, 17, 17, 0, 17, 1),  # kernel 1: no pooling
    (5, 4, 1, 1, 0, 1, 13),  # a single key
]


@pytest.mark.parametrize("heads, rows, seen, visible_first, start, end, kernel", CASES)
def test_native_equals_the_definition(heads, rows, seen, visible_first, start, end, kernel):
    """Lengths below, at and past the 8-lane vector; slices at both edges of the keys."""
    needs_native()
    mx.random.seed(seen + rows)
    logits = mx.random.normal((heads, rows, seen)) * 4  # peaked rows, like attention's
    got = pooled_attention_max_native(logits, visible_first, start, end, kernel)
    want = definition(np.array(logits), visible_first, start, end, kernel)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), want, rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("heads, rows, seen, visible_first, start, end, kernel", CASES[2:])
def test_mlx_ops_equal_the_definition(heads, rows, seen, visible_first, start, end, kernel):
    """The reference (a GPU's path) on short rows, where its running sums stay exact enough."""
    mx.random.seed(seen + rows)
    logits = mx.random.normal((heads, rows, seen)) * 4
    got = pooled_attention_max_reference(logits, visible_first, start, end, kernel)
    want = definition(np.array(logits), visible_first, start, end, kernel)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-7)


def test_masked_keys_weigh_nothing():
    """-inf logits (a key the row may not see) get no weight, as MLX's softmax gives them."""
    needs_native()
    logits = mx.random.normal((2, 3, 24), key=mx.random.key(3))
    logits = mx.where(mx.arange(24) % 5 == 0, -mx.inf, logits)
    got = pooled_attention_max_native(logits, 24, 0, 24, 3)
    want = pooled_attention_max_reference(logits, 24, 0, 24, 3)
    assert mx.allclose(got, want, rtol=1e-5, atol=1e-8).item()


@pytest.mark.parametrize(
    "shape, start, end, kernel",
    [((2, 3, 10), 0, 11, 13), ((2, 3, 10), 4, 3, 13), ((2, 3, 10), 0, 10, 4), ((3, 10), 0, 10, 13)],
)
def test_the_kernel_refuses_what_it_does_not_take(shape, start, end, kernel):
    """Past the keys, an empty-backwards slice, an even kernel, no head axis: an error at build
    time, not a wrong answer."""
    needs_native()
    from brisk.kernels import mlx_extension as ext

    with pytest.raises(ValueError, match="pooled_attention_max"):
        ext.load().pooled_attention_max(mx.zeros(shape), 1, start, end, kernel, 1)


def test_other_dtypes_take_mlx_ops():
    """float16 logits are not the kernel's: the dispatcher answers with the reference."""
    logits = mx.random.normal((2, 4, 64), key=mx.random.key(5)).astype(mx.float16)
    with pytest.raises(NativeUnsupported):
        pooled_attention_max_native(logits, 60, 0, 64, 13)
    got = pooled_attention_max(logits, 60, 0, 64, 13)
    assert mx.array_equal(got, pooled_attention_max_reference(logits, 60, 0, 64, 13)).item()


def both_paths():
    """MLX's ops always; the kernel where it runs (the reference must hold without it)."""
    native = mx.default_device() == mx.cpu and HAVE_COMPILER and mlx_extension.load() is not None
    return [pooled_attention_max_reference, *([pooled_attention_max_native] if native else [])]


# logits (3 heads, 4 rows, 21 keys), rows seeing 18..21 keys; row 1 sees keys 0..18
POISONED = [
    # head, key, value: what a draft whose queries or keys overflowed puts in its logits
    (0, 3, np.nan),  # in an 8-lane vector, the first head
    (2, 3, np.nan),
    (0, 17, np.nan),  # in the scalar tail after the vectors, the first head (a later head hid it)
    (2, 17, np.nan),  # the tail, the last head (NaN at some keys of the row only)
    (1, 4, np.inf),  # +inf: inf - inf in the softmax
    (1, slice(None), -np.inf),  # no finite logit among the keys the row saw
]


@pytest.mark.parametrize("head, key, value", POISONED)
def test_a_non_finite_logit_makes_its_row_nan_on_both_paths(head, key, value):
    """Softmax over keys holding a NaN or +inf (or only -inf) is NaN, in float64 and in MLX's
    ops; the kernel said so only at some positions (NaN in a vector's lanes weighed ~0, +inf
    dropped the head), so its scores looked usable where a GPU's were NaN."""
    logits = np.array(mx.random.normal((3, 4, 21), key=mx.random.key(7))) * 4
    logits[head, 1, key] = value
    want = definition(logits, 18, 0, 21, 3)
    assert np.isnan(want[1]).all() and np.isfinite(np.delete(want, 1, axis=0)).all()
    for path in both_paths():
        got = np.array(path(mx.array(logits), 18, 0, 21, 3))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7, err_msg=path.__name__)  # NaNs where they are


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_keys_a_row_did_not_see_do_not_reach_it(value):
    """A lookahead step's key is past the prompt's rows: whatever its logit, those rows do not
    weigh it (MLX's ops added -inf to it, and +inf - inf or NaN + -inf is NaN)."""
    logits = np.array(mx.random.normal((2, 4, 21), key=mx.random.key(8))) * 4
    logits[:, :3, 20] = value  # rows 0-2 see 18-20 keys: not key 20
    want = definition(logits, 18, 0, 20, 5)
    assert np.isfinite(want).all()
    for path in both_paths():
        got = np.array(path(mx.array(logits[:, :3]), 18, 0, 20, 5))
        np.testing.assert_allclose(got, want[:3], rtol=1e-4, atol=1e-7, err_msg=path.__name__)


def test_rows_that_saw_every_key_past_int32():
    """visible_first past the keys (or past int32) means every row saw all of them."""
    logits = mx.random.normal((2, 3, 30), key=mx.random.key(9)) * 4
    want = definition(np.array(logits), 30, 0, 30, 13)
    for path in both_paths():
        got = np.array(path(logits, 2**40, 0, 30, 13))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7, err_msg=path.__name__)


@pytest.mark.parametrize(
    "shape, visible_first, start, end, kernel",
    [
        ((2, 3, 10), 1, 0, 11, 13),  # past the keys: MLX's slice would stop short
        ((2, 3, 10), 1, 4, 3, 13),
        ((2, 3, 10), 1, 0, 10, 4),  # even: MLX's pool would answer 11 columns
        ((2, 3, 10), 0, 0, 10, 13),  # row 0 saw no key: a softmax over nothing
        ((2, 3, 10), -4, 0, 10, 13),
        ((3, 10), 1, 0, 10, 13),
        ((0, 3, 10), 1, 0, 10, 13),  # no head to take the maximum over
    ],
)
def test_both_paths_refuse_what_the_kernel_does_not_take(shape, visible_first, start, end, kernel):
    """The reference (a GPU's path, BRISK_KERNELS=off) refuses what the kernel refuses, with
    the bounds in the message, instead of a row of another length or of NaNs."""
    logits = mx.zeros(shape)
    for path in (pooled_attention_max_reference, pooled_attention_max):
        with pytest.raises(ValueError, match="pooled_attention_max"):
            mx.eval(path(logits, visible_first, start, end, kernel))
