"""Few-row tiled products (decode, verify) hand each thread a quarter of its share at a time:
every tile is still computed once, and the numbers are those of one thread, whatever the
thread count and however unevenly the tiles divide into units."""

import mlx.core as mx
import pytest

from brisk.kernels import native_attention
from brisk.kernels.tiled_matmul import repack_native, tiled_matmul_native
from tests.kernels.test_tiled_matmul import _quantized, needs_kernels


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("n", [16, 208, 1040])  # 1, 13 and 65 tiles: one unit, uneven units, many
def test_few_rows_over_units_give_one_threads_numbers(rows, threads, n, monkeypatch):
    arrays = repack_native(*_quantized(n, 256, 4, 32, seed=n + rows), 4)
    x = mx.random.normal((rows, 256), key=mx.random.key(rows))
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", 1)
    one = tiled_matmul_native(x, *arrays, bits=4, group_size=32)
    monkeypatch.setattr(native_attention, "KERNEL_THREADS", threads)
    many = tiled_matmul_native(x, *arrays, bits=4, group_size=32)
    assert many.shape == (rows, n) and mx.array_equal(many, one).item()
    # each row alone is the same row of the product (nothing read from another row's units)
    assert mx.array_equal(tiled_matmul_native(x[-1:], *arrays, bits=4, group_size=32), one[-1:]).item()
