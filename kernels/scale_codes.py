"""Scale codes and symmetric layers: quantized scales and biases in fewer bytes, for the tiled kernels.

Decode on a CPU reads every weight byte once per token, so the bytes are the speed. MLX keeps
a float16 scale and a float16 bias per group of 32 weights: a bit per weight on top of the
4 the values take. A GGUF K-quant (Q4_K, Q5_K) stores them as a float16 factor per 256
weights times a 6-bit integer per group of 32, and Brisk's import keeps each as
float16(factor x integer). `find_codes` recovers the factor and the integers from MLX's
float16 array, and keeps them only when every group's product, rounded to float16, is the
array's value bit for bit. The kernel then takes factor x integer in float32: the K-quant's
own value, which the float16 array had rounded (by at most half a float16 step). A table per
tile of 16 columns (kernels/csrc/tiled_matmul.cpp): for each 256 k values, the 16 columns'
factors (float16) and then one code byte per group and column. 4-bit groups of 32 then take
4.625 bits a weight instead of 5, and a decode step reads ~6% fewer bytes on Qwen2.5-1.5B's
Q4_K_M file.

Q6_K imports with int8 sub-block scales as codes (up to 128) and, like Q4_0, Q5_0 and Q8_0,
with every bias -2^(bits - 1) x its scale: `compact_layer` then keeps that one number for the
biases and the kernel reads none (Q6_K: 6.375 bits a weight). Arrays that fit neither (MLX's
own quantization, Q4_1's free minimums) keep their float16 groups.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from brisk.kernels import plan

TILE = 16
SUPER = 256  # k values per factor
# The largest code in 256 k values: Q4_K / Q5_K's 6-bit codes reach 63; Q6_K's int8 sub-block
# scales reach 128 (as Brisk imports it, a group's scale is d x the larger of its two |codes|).
LEVELS = (63, 128, 127)
NEIGHBOURS = (0, 1, -1, 2, -2)  # float16 ulps from largest / level tried for the factor
# BRISK_SCALE_CODES=0 keeps float16 groups in the tiles (the A/B partner; kernels/plan.py).
ENABLED = plan.switch_on("BRISK_SCALE_CODES")


def find_codes(values: mx.array, group_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes (N, G) uint8, factors (N, G * group / 256) float16) with float16(code x factor)
    equal to every value of an (N, G) float16 array in MLX's layout, else None."""
    n, groups = values.shape
    per_super = SUPER // group_size
    if values.dtype != mx.float16 or groups % per_super or n % TILE:
        return None
    for level in LEVELS:
        if n > 4 * TILE and _codes(values[: 4 * TILE], per_super, level) is None:  # most misses show at once
            continue
        found = _codes(values, per_super, level)
        if found is not None:
            codes, factors = found
            return codes.reshape(n, groups), factors.reshape(n, -1)
    return None


def _codes(values: mx.array, per_super: int, level: int) -> tuple[np.ndarray, np.ndarray] | None:
    n, groups = values.shape
    shape = (n, groups // per_super, per_super)
    v = values.reshape(shape).astype(mx.float32)
    largest = mx.abs(v).max(axis=-1, keepdims=True)
    signed = mx.where(v.max(axis=-1, keepdims=True) >= largest, largest, -largest)  # one sign per 256
    step = signed / level
    # Each value is float16(d x code), 11 bits of precision against codes <= 128: dividing by
    # largest / level and rounding gives the codes; the factor is that in float16, or an ulp
    # or two from it (float16 rounded both largest and d), checked superblock by superblock.
    codes = mx.round(v / mx.where(step == 0, 1, step))
    first = step.astype(mx.float16)
    exact = ((codes * first.astype(mx.float32)).astype(mx.float16) == values.reshape(shape)).all(axis=-1)
    valid = ((codes >= 0) & (codes <= 255)).all()
    mx.eval(codes, first, exact, valid)
    if not valid.item():
        return None
    codes_np, factors = np.asarray(codes.astype(mx.uint8)), np.asarray(first)[..., 0].copy()
    missing = np.argwhere(~np.asarray(exact))
    if len(missing):
        want = np.asarray(values).reshape(shape)[missing[:, 0], missing[:, 1]]
        c = codes_np[missing[:, 0], missing[:, 1]].astype(np.float32)
        base = factors[missing[:, 0], missing[:, 1]].view(np.int16)
        done = np.zeros(len(missing), bool)
        for nudge in NEIGHBOURS[1:]:
            factor = (base + np.int16(nudge)).view(np.float16)
            fits = ~done & ((c * factor.astype(np.float32)[:, None]).astype(np.float16) == want).all(axis=-1)
            factors[missing[fits, 0], missing[fits, 1]] = factor[fits]
            done |= fits
        if not done.all() or not np.isfinite(factors).all():
            return None
    return codes_np, factors


def code_table(codes: np.ndarray, factors: np.ndarray, group_size: int) -> mx.array:
    """The kernel's table from `find_codes`: per tile and 256 k values, 16 factors (float16)
    then the codes [group][16 columns]; (N, K / 256 * (2 + per_super)) uint8."""
    n, groups = codes.shape
    per_super, supers = SUPER // group_size, groups * group_size // SUPER
    tiles = n // TILE
    f = factors.reshape(tiles, TILE, supers).transpose(0, 2, 1)  # (T, S, 16)
    c = codes.reshape(tiles, TILE, supers, per_super).transpose(0, 2, 3, 1)  # (T, S, g, 16)
    table = np.concatenate(
        [np.ascontiguousarray(f).view(np.uint8).reshape(tiles, supers, -1), c.reshape(tiles, supers, -1)], axis=-1
    )
    return mx.array(np.ascontiguousarray(table).reshape(n, -1))


def table_values(table: mx.array, k: int) -> mx.array:
    """A table's values in MLX's layout, as the kernel takes them: (N, G) float32 (the
    fallback paths read these)."""
    n = table.shape[0]
    supers = k // SUPER
    tiles, row = n // TILE, table.shape[1] * TILE // supers
    per_super = row // TILE - 2
    t = table.reshape(tiles, supers, row)
    factors = mx.contiguous(t[..., : 2 * TILE]).view(mx.float16).astype(mx.float32)  # (T, S, 16)
    codes = t[..., 2 * TILE :].reshape(tiles, supers, per_super, TILE).astype(mx.float32)
    values = codes * factors[:, :, None, :]  # (T, S, g, 16)
    return mx.contiguous(values.transpose(0, 3, 1, 2).reshape(n, supers * per_super))


def is_table(scales: mx.array) -> bool:
    return scales.dtype == mx.uint8


def is_offset(biases: mx.array) -> bool:
    """A layer's biases as one number: each bias is that x its scale (`compact_layer`)."""
    return biases.size == 1


def biases_of(scale_values: mx.array, biases: mx.array) -> mx.array:
    """Biases in MLX's layout, from the scales' values when they are an offset."""
    return scale_values * biases.astype(scale_values.dtype) if is_offset(biases) else biases


def symmetric(scales: mx.array, biases: mx.array, bits: int) -> bool:
    """Whether every bias is -2^(bits - 1) x its scale (Q4_0, Q5_0, Q8_0, Q6_K as imported):
    exact in float16, a power of two."""
    if biases.shape != scales.shape or biases.dtype != scales.dtype:
        return False
    return bool(mx.array_equal(biases, scales * -(2 ** (bits - 1))).item())


def compact_layer(scales, biases, tiled_scales, tiled_biases, *, group_size: int, bits: int):
    """A repacked layer's (scales, biases) in the fewest bytes that keep its values: a code table
    for the scales where they are factor x code, and for the biases, or the one number that
    times the scales gives them (the kernel then reads no biases at all). MLX's layout in,
    the tiles' (`tiled_*`) as they are when nothing fits."""
    if not ENABLED:
        return tiled_scales, tiled_biases
    offset = symmetric(scales, biases, bits)
    found = find_codes(scales, group_size)
    new_scales = tiled_scales if found is None else code_table(*found, group_size)
    if offset:
        return new_scales, mx.array([-(2 ** (bits - 1))], dtype=scales.dtype)
    found_biases = None if found is None else find_codes(biases, group_size)
    if found_biases is None:
        return tiled_scales, tiled_biases
    return new_scales, code_table(*found_biases, group_size)
