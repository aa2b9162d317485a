"""Scale codes (kernels/scale_codes.py): a K-quant's float16 scales and biases found to be a
factor per 256 k values times a small integer, kept as code tables, and the tiled kernel
reading the tables to the same bits as float32 groups of factor x code, on every path."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from brisk.kernels import quantized_matmul, scale_codes
from brisk.kernels.native_layers import use_native_layers
from brisk.kernels.quantized_matmul import quantized_matmul_reference
from brisk.kernels.scale_codes import code_table, compact_layer, find_codes, table_values
from brisk.kernels.tiled_matmul import (
    TiledQuantizedLinear,
    _mlx_packed,
    _tile_groups,
    repack_native,
    tile,
    tiled_gather_native,
    tiled_matmul_native,
    tiled_matmul_reference,
    untile,
    use_tiled_layers,
)
from tests.kernels.test_tiled_matmul import needs_kernels


def _k_quant_groups(n, k, group, rng, sign=1.0, levels=63):
    """(N, K / group) float16 values as a K-quant import writes them: float16(d x code), d a
    float16 per 256 k values, codes 0..levels with `levels` the largest in each 256."""
    per_super = 256 // group
    d = rng.uniform(1e-4, 3e-2 * 63 / levels, size=(n, k // 256, 1)).astype(np.float16).astype(np.float32)
    codes = rng.integers(0, levels + 1, size=(n, k // 256, per_super))
    codes[..., rng.integers(0, per_super)] = levels
    return mx.array((sign * d * codes).astype(np.float16).reshape(n, -1))


def compact(scales, biases, group):
    """Both code tables of a layer (`compact_layer`), or None where it kept float16 groups."""
    kept = mx.zeros((1,)), mx.zeros((1,))
    tables = compact_layer(scales, biases, *kept, group_size=group, bits=4)
    return None if tables[0] is kept[0] or tables[1] is kept[1] else tables


def _k_quant_layer(n, k, bits, group, seed=0):
    rng = np.random.default_rng(seed)
    values = mx.array(rng.integers(0, 2**bits, size=(n, k)).astype(np.uint8))
    scales = _k_quant_groups(n, k, group, rng)
    biases = _k_quant_groups(n, k, group, rng, sign=-1.0)
    return _mlx_packed(values, bits), scales, biases


@pytest.mark.parametrize("group", [32, 64])
def test_codes_are_found_for_k_quant_values_and_give_them_back_bit_for_bit(group):
    rng = np.random.default_rng(group)
    for sign in (1.0, -1.0):
        values = _k_quant_groups(48, 512, group, rng, sign)
        found = find_codes(values, group)
        assert found is not None
        codes, factors = found
        assert codes.shape == values.shape and factors.shape == (48, 2) and codes.max() <= 63
        table = code_table(codes, factors, group)
        assert table.dtype == mx.uint8 and table.nbytes == 48 * 2 * (32 + 16 * (256 // group)) // 16
        back = table_values(table, 512)
        exact = codes.astype(np.float32) * np.repeat(factors.astype(np.float32), 256 // group, axis=1)
        assert back.dtype == mx.float32 and np.array_equal(np.asarray(back), exact)
        assert np.array_equal(np.asarray(back.astype(mx.float16)), np.asarray(values))  # what MLX held, rounded


def test_values_that_are_not_factor_times_code_keep_their_groups():
    weight = mx.random.normal((32, 512))
    _, scales, biases = mx.quantize(weight, group_size=32, bits=4)  # MLX's own: any float16
    assert find_codes(scales.astype(mx.float16), 32) is None
    rng = np.random.default_rng(1)
    mixed = np.asarray(_k_quant_groups(32, 512, 32, rng)).copy()
    mixed[3, 5] = -mixed[3, 5] - np.float16(0.01)  # one bias of the other sign in its 256
    assert find_codes(mx.array(mixed), 32) is None
    assert find_codes(_k_quant_groups(32, 512, 32, rng).astype(mx.bfloat16), 32) is None
    assert find_codes(_k_quant_groups(32, 384 + 128, 32, rng)[:, :12], 32) is None  # 384 k: not whole 256s
    packed, s, b = _k_quant_layer(32, 512, 4, 32)
    assert compact(s, scales.astype(mx.float16), 32) is None  # both must hold


def _exact_groups(scales, biases, group):
    """The tables' values as float32 groups in the tiled order: what the kernel must read."""
    tables = compact(scales, biases, group)
    return tables, [_tile_groups(table_values(t, scales.shape[1] * group)) for t in tables]


@needs_kernels
@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 9, 70])  # decode, verify passes (tables read), prefill (expanded)
def test_the_kernel_reads_tables_as_float32_groups_of_factor_times_code(bits, group, rows):
    packed, scales, biases = _k_quant_layer(80, 768, bits, group, seed=bits + rows)
    weight, half_scales, half_biases = repack_native(packed, scales, biases, bits)
    tables, exact = _exact_groups(scales, biases, group)
    assert tables[0].nbytes < half_scales.nbytes and tables[1].nbytes < half_biases.nbytes
    x = mx.random.normal((rows, 768))
    bias = mx.random.normal((80,))
    got = tiled_matmul_native(x, weight, *tables, bits=bits, group_size=group, bias=bias)
    assert mx.array_equal(got, tiled_matmul_native(x, weight, *exact, bits=bits, group_size=group, bias=bias)).item()
    half = tiled_matmul_native(x, weight, half_scales, half_biases, bits=bits, group_size=group, bias=bias)
    assert mx.abs(got - half).max().item() < 2e-3 * mx.abs(half).max().item()  # float16 rounding of the groups
    ids = mx.array([0, 17, 79])
    assert mx.array_equal(
        tiled_gather_native(ids, weight, *tables, bits=bits, group_size=group),
        tiled_gather_native(ids, weight, *exact, bits=bits, group_size=group),
    ).item()


@needs_kernels
def test_rows_alone_and_together_give_the_same_bits_from_tables():
    """Decode (one row), a verify pass (tables read in the kernel) and prefill (tables expanded
    per pair of tiles) must agree bit for bit, as greedy speculative decoding needs."""
    packed, scales, biases = _k_quant_layer(112, 512, 4, 32, seed=11)
    weight = repack_native(packed, scales, biases, 4)[0]
    tables = compact(scales, biases, 32)
    x = mx.random.normal((37, 512))
    together = tiled_matmul_native(x, weight, *tables, bits=4, group_size=32)
    few = tiled_matmul_native(x[:6], weight, *tables, bits=4, group_size=32)
    assert mx.array_equal(few, together[:6]).item()
    for i in (0, 5, 36):
        alone = tiled_matmul_native(x[i : i + 1], weight, *tables, bits=4, group_size=32)
        assert mx.array_equal(alone[0], together[i]).item()


def test_untile_gives_mlx_the_tables_values():
    packed, scales, biases = _k_quant_layer(48, 512, 4, 32, seed=3)
    weight = tile(packed, scales, biases, 4)[0]
    tables = compact(scales, biases, 32)
    back = untile(weight, *tables, 4)
    assert mx.array_equal(back[0], packed).item()
    assert mx.array_equal(back[1].astype(mx.float16), scales).item()
    assert mx.array_equal(back[2].astype(mx.float16), biases).item()
    x = mx.random.normal((2, 512))
    want = quantized_matmul_reference(x, packed, back[1], back[2], bits=4, group_size=32)
    assert mx.array_equal(tiled_matmul_reference(x, weight, *tables, bits=4, group_size=32), want).item()


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(256, 512, bias=False)
        self.down = nn.Linear(512, 256, bias=True)

    def __call__(self, x):
        return self.down(self.up(x))


def _k_quant_net():
    mx.random.seed(7)  # the same bias in every net built
    net = _Net()
    nn.quantize(net, group_size=32, bits=4)
    for i, layer in enumerate((net.up, net.down)):
        packed, scales, biases = _k_quant_layer(layer.weight.shape[0], layer.weight.shape[1] * 8, 4, 32, seed=i)
        layer.update({"weight": packed, "scales": scales, "biases": biases})
    use_native_layers(net)
    return net


@needs_kernels
def test_a_k_quant_net_loads_with_tables_in_fewer_bytes_and_answers_as_before(monkeypatch):
    # The plan of a CPU whose prefill does not take 4-bit layers on AMX tiles: they are tiled.
    monkeypatch.setattr(quantized_matmul, "AMX", False)
    x = mx.random.normal((3, 256))
    monkeypatch.setattr(scale_codes, "ENABLED", False)
    plain = _k_quant_net()
    assert use_tiled_layers(plain) == 2
    monkeypatch.setattr(scale_codes, "ENABLED", True)
    net = _k_quant_net()
    assert use_tiled_layers(net) == 2 and type(net.up) is TiledQuantizedLinear
    assert net.up.scales.dtype == mx.uint8 and net.down.biases.dtype == mx.uint8
    size = sum(v.nbytes for _, v in nn.utils.tree_flatten(net.parameters()))
    plain_size = sum(v.nbytes for _, v in nn.utils.tree_flatten(plain.parameters()))
    assert size < plain_size
    for rows in (x, x[:1]):
        got, want = net(rows), plain(rows)
        assert mx.abs(got - want).max().item() < 2e-3 * mx.abs(want).max().item()


def _symmetric_layer(n, k, bits, group, seed, k_quant_scales):
    """Biases -2^(bits - 1) x scales, as Q4_0 / Q5_0 / Q8_0 import (any float16 scales) or Q6_K
    (d x a code up to 128 per 256 k values)."""
    rng = np.random.default_rng(seed)
    packed = _mlx_packed(mx.array(rng.integers(0, 2**bits, size=(n, k)).astype(np.uint8)), bits)
    if k_quant_scales:
        scales = _k_quant_groups(n, k, group, rng, levels=128)
    else:
        scales = mx.array(rng.uniform(1e-4, 3e-2, size=(n, k // group)).astype(np.float16))
    return packed, scales, (scales * -(2 ** (bits - 1))).astype(mx.float16)


@needs_kernels
@pytest.mark.parametrize("bits", [4, 5, 6, 8])
@pytest.mark.parametrize("k_quant_scales", [False, True])
@pytest.mark.parametrize("rows", [1, 4, 9, 70])
def test_symmetric_layers_read_no_biases_and_give_the_same_bits(bits, k_quant_scales, rows):
    packed, scales, biases = _symmetric_layer(80, 768, bits, 32, seed=bits + rows, k_quant_scales=k_quant_scales)
    weight, tiled_scales, tiled_biases = repack_native(packed, scales, biases, bits)
    new_scales, offset = compact_layer(scales, biases, tiled_scales, tiled_biases, group_size=32, bits=bits)
    assert offset.size == 1 and offset.item() == -(2 ** (bits - 1))
    assert (new_scales.dtype == mx.uint8) == k_quant_scales  # a code table where the scales are d x code
    values = untile(weight, new_scales, offset, bits)
    assert mx.array_equal(values[2].astype(mx.float16), biases).item()
    exact = [_tile_groups(v) for v in values[1:]]  # the values as explicit float32 (or float16) groups
    x = mx.random.normal((rows, 768))
    got = tiled_matmul_native(x, weight, new_scales, offset, bits=bits, group_size=32)
    assert mx.array_equal(got, tiled_matmul_native(x, weight, *exact, bits=bits, group_size=32)).item()
    ids = mx.array([3, 79])
    assert mx.array_equal(
        tiled_gather_native(ids, weight, new_scales, offset, bits=bits, group_size=32),
        tiled_gather_native(ids, weight, *exact, bits=bits, group_size=32),
    ).item()


def test_layers_that_fit_nothing_keep_their_tiles():
    packed, scales, biases = _quantized_by_mlx(32, 512)
    tiled = tile(packed, scales, biases, 4)
    kept = compact_layer(scales, biases, *tiled[1:], group_size=32, bits=4)
    assert kept[0] is tiled[1] and kept[1] is tiled[2]


def _quantized_by_mlx(n, k):
    packed, scales, biases = mx.quantize(mx.random.normal((n, k)), group_size=32, bits=4)
    return packed, scales.astype(mx.float16), biases.astype(mx.float16)
