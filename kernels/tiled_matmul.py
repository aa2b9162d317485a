"""Quantized layers in column tiles, for CPUs with AVX512-VNNI (kernels/csrc/tiled_matmul.cpp).

MLX stores a quantized (N, K) weight one output column (row of the matrix) after another.
On a CPU the one-row product then sums each column's block of 32 products across a
register, and rows of x share little: on a Zen 4 (AVX-512 VNNI, no AMX) decode read
Qwen2.5-1.5B's weights at 15-20 GB/s of 34, where llama.cpp, which repacks its blocks for
the CPU (Q4_0x8 and kin), reads them at ~25. As a model loads, Brisk repacks each of its
quantized layers into tiles of 16 output columns, four consecutive k values of each column
in one 32-bit lane: one vpdpbusd then adds four products for 16 columns, and a block of 32
k values leaves each lane with the exact integer sum of its column's block. The same small
kernel takes one row (decode, ~30 GB/s), a few (a verify pass, each weight unpacked once
for all rows) or many (prefill, about 2x MKL's sgemm on dequantized tiles), and every
(row, column) takes the same float steps whatever the rows and columns around it: a
verify pass's rows equal one-row decode bit for bit.

- `tile` / `untile`: the layout in plain MLX ops, its definition (the native repack and the
  kernel are tested against it; `untile` also gives MLX's own paths their layout back).
- `tiled_matmul_reference`: untile, then MLX's quantized_matmul.
- `tiled_matmul_native`, `tiled_gather_native`, `repack_native`: the kernels, as lazy MLX
  primitives (kernels/csrc/mlx_primitives/tiled.cpp).
- `TiledQuantizedLinear`, `TiledQuantizedEmbedding`: the layers, and `use_tiled_layers(model)`
  which repacks a loaded model's quantized layers in place, one at a time.
Each weight keeps its shape, dtype and size: only the order of its bytes changes. Scales and
biases that are a K-quant's factor x code become kernels/scale_codes.py's tables (fewer bytes,
the same values); others keep their dtype, reordered.
- Inside kernels/coarse.py's `coarse_products()` products built round x to 8 bits a block
  instead of 15 (one integer pass, not two: prefill products ~1.6x): for a sparse-prefill
  draft's scoring, which reads only a ranking of the prompt's tokens.
`why_not_tiled()` says when the layout is not used: BRISK_TILED=0 (the A/B partner), no
VNNI-512, or float x asked for (BRISK_INTEGER_ACTIVATIONS=0). On a CPU with AMX only 6-bit
layers are tiled (`tiled_bits()`): AMX's prefill tiles (kernels/csrc/amx_matmul.cpp) read
MLX's layout for 4, 5 and 8 bits and do not take 6.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from brisk.kernels import ctypes_library, mlx_extension, plan, quantized_matmul, scale_codes
from brisk.kernels.coarse import COARSE
from brisk.kernels.native_attention import threads
from brisk.kernels.quantized_matmul import (
    SCALE_TYPES,
    NativeQuantizedEmbedding,
    NativeQuantizedLinear,
    quantized_matmul_reference,
)

TILE = 16  # output columns per tile: one per 32-bit lane of a 512-bit register
BLOCK = 32  # k values per block: x's integer scale, and the smallest weight group
BITS = (4, 5, 6, 8)
GROUPS = (32, 64)
CODES = 3  # the kernel's scale type for scale code tables (kernels/scale_codes.py)
SYMMETRIC = 8  # or'ed into it: the biases are one number x the scales, and not read
# BRISK_TILED=0 keeps MLX's layout and the few-row kernels of quantized_matmul.py (the A/B
# partner; kernels/plan.py). Tests switch it per test.
ENABLED = plan.switch_on("BRISK_TILED")


# --- the layout, in plain MLX ops ---------------------------------------------------------


def _bit_or(parts: list[mx.array]) -> mx.array:
    """Fields that do not overlap, put together."""
    out = parts[0]
    for part in parts[1:]:
        out = out | part
    return out


def _values(weight: mx.array, bits: int) -> mx.array:
    """An MLX-layout quantized weight's values, one per byte: (N, K) uint8."""
    n = weight.shape[0]
    raw = weight.view(mx.uint8).reshape(n, -1)
    if bits == 8:
        return raw
    if bits == 4:  # byte m holds values 2m (low nibble) and 2m + 1
        return mx.stack([raw & 15, raw >> 4], axis=-1).reshape(n, -1)
    if bits == 6:  # 4 values in each 3 bytes, little-endian
        three = raw.reshape(n, -1, 3).astype(mx.uint32)
        word = _bit_or([three[..., i] << (8 * i) for i in range(3)])
        return ((word[..., None] >> (mx.arange(4, dtype=mx.uint32) * 6)) & 63).astype(mx.uint8).reshape(n, -1)
    chunks = raw.reshape(n, -1, 5).astype(mx.uint64)  # 5 bits: 8 values in each 5 bytes, little-endian
    word = _bit_or([chunks[..., i] << (8 * i) for i in range(5)])
    shifts = mx.arange(8, dtype=mx.uint64) * 5
    return ((word[..., None] >> shifts) & 31).astype(mx.uint8).reshape(n, -1)


def _mlx_packed(values: mx.array, bits: int) -> mx.array:
    """(N, K) values, one per byte, in MLX's layout: (N, K * bits / 32) uint32."""
    n = values.shape[0]
    if bits == 8:
        packed = values
    elif bits == 4:
        pairs = values.reshape(n, -1, 2)
        packed = pairs[..., 0] | (pairs[..., 1] << 4)
    elif bits == 6:
        word = _bit_or([values.reshape(n, -1, 4).astype(mx.uint32)[..., i] << (6 * i) for i in range(4)])
        packed = mx.stack([(word >> (8 * i)) & 255 for i in range(3)], axis=-1)
    else:
        word = _bit_or([values.reshape(n, -1, 8).astype(mx.uint64)[..., i] << (5 * i) for i in range(8)])
        packed = mx.stack([(word >> (8 * i)) & 255 for i in range(5)], axis=-1)
    return packed.astype(mx.uint8).reshape(n, -1).view(mx.uint32)


def _tile_groups(a: mx.array) -> mx.array:  # (N, G) -> memory order [tile][group][16 columns]
    n, g = a.shape
    return mx.contiguous(a.reshape(n // TILE, TILE, g).transpose(0, 2, 1).reshape(n, g))


def _untile_groups(a: mx.array) -> mx.array:
    n, g = a.shape
    return mx.contiguous(a.reshape(n // TILE, g, TILE).transpose(0, 2, 1).reshape(n, g))


def tile(weight: mx.array, scales: mx.array, biases: mx.array, bits: int):
    """MLX's layout -> tiles. Per tile t (columns 16t..16t+15) and block j (k 32j..32j+31), in
    order: quad u (k = 32j + 4u .. + 3) of the 16 columns as 64 bytes, column c at 4c. 8 bits:
    the eight quads. 4 bits: chunk p holds quad 2p in its low nibbles and 2p + 1 in its high
    ones. 5 bits: those four chunks of low bits, then quad u's fifth bits as one 64-bit mask
    each. 6 bits: the four chunks, then two of 64 bytes holding quad 4h + r's top two bits at
    bits 2r of byte 4c + i. Scales and biases: [tile][group][16 columns]."""
    n = weight.shape[0]
    values = _values(weight, bits)
    tiles, blocks = n // TILE, values.shape[1] // BLOCK
    quads = values.reshape(tiles, TILE, blocks, 8, 4).transpose(0, 2, 3, 1, 4)  # (T, J, u, c, i)
    if bits == 8:
        body = quads.reshape(tiles, blocks, -1)
    else:
        low = (quads & 15).reshape(tiles, blocks, 4, 2, TILE, 4)  # u = 2p + h
        body = (low[:, :, :, 0] | (low[:, :, :, 1] << 4)).reshape(tiles, blocks, -1)
        if bits == 5:
            fifth = (quads >> 4).reshape(tiles, blocks, 8, 8, 8)  # (T, J, u, byte of the mask, bit)
            masks = _bit_or([fifth[..., i] << i for i in range(8)]).astype(mx.uint8)
            body = mx.concatenate([body, masks.reshape(tiles, blocks, -1)], axis=-1)
        if bits == 6:
            top = (quads >> 4).reshape(tiles, blocks, 2, 4, TILE, 4)  # (T, J, h, r, c, i)
            planes = _bit_or([top[:, :, :, r] << (2 * r) for r in range(4)]).astype(mx.uint8)
            body = mx.concatenate([body, planes.reshape(tiles, blocks, -1)], axis=-1)
    return body.astype(mx.uint8).reshape(n, -1).view(mx.uint32), _tile_groups(scales), _tile_groups(biases)


def untile(weight: mx.array, scales: mx.array, biases: mx.array, bits: int):
    """Tiles -> MLX's layout (`tile`'s inverse; scale code tables back to float16 groups)."""
    n = weight.shape[0]
    raw = weight.view(mx.uint8).reshape(n, -1)
    k = raw.shape[1] * 8 // bits
    tiles, blocks = n // TILE, k // BLOCK
    raw = raw.reshape(tiles, blocks, TILE * BLOCK * bits // 8)
    if bits == 8:
        quads = raw.reshape(tiles, blocks, 8, TILE, 4)
    else:
        chunks = raw[..., :256].reshape(tiles, blocks, 4, TILE, 4)
        quads = mx.stack([chunks & 15, chunks >> 4], axis=3).reshape(tiles, blocks, 8, TILE, 4)
        if bits == 5:
            masks = raw[..., 256:].reshape(tiles, blocks, 8, 8, 1)
            fifth = ((masks >> mx.arange(8, dtype=mx.uint8)) & 1).reshape(tiles, blocks, 8, TILE, 4)
            quads = quads | (fifth << 4)
        if bits == 6:
            planes = raw[..., 256:].reshape(tiles, blocks, 2, 1, TILE, 4)
            shifts = (mx.arange(4, dtype=mx.uint8) * 2).reshape(4, 1, 1)
            top = ((planes >> shifts) & 3).reshape(tiles, blocks, 8, TILE, 4)
            quads = quads | (top << 4)
    values = quads.transpose(0, 3, 1, 2, 4).reshape(n, k)  # (T, c, J, u, i)
    if scale_codes.is_table(scales):
        scales = scale_codes.table_values(scales, k)
    else:
        scales = _untile_groups(scales)
    if scale_codes.is_table(biases):
        biases = scale_codes.table_values(biases, k)
    elif not scale_codes.is_offset(biases):
        biases = _untile_groups(biases)
    return _mlx_packed(values, bits), scales, scale_codes.biases_of(scales, biases)


def takes(weight: mx.array, scales: mx.array, biases: mx.array | None, bits: int, group_size: int) -> bool:
    """Whether the tiled layout takes this quantized weight."""
    if biases is None or bits not in BITS or group_size not in GROUPS or weight.ndim != 2:
        return False
    k = weight.shape[1] * 32 // bits
    return (
        weight.dtype == mx.uint32
        and weight.shape[0] % TILE == 0
        and k % group_size == 0
        and scales.dtype in SCALE_TYPES
        and biases.dtype == scales.dtype
    )


# --- the kernels ----------------------------------------------------------------------------


def why_not_tiled() -> str | None:
    """None when this process repacks quantized layers into tiles, else why it does not."""
    if not ENABLED:
        return "turned off (BRISK_TILED=0)"
    if not quantized_matmul.INTEGER_ACTIVATIONS:  # read here: tests switch it per test
        return "float x asked for (BRISK_INTEGER_ACTIVATIONS=0)"
    primitives = mlx_extension.load()
    if primitives is None:
        return f"no MLX primitives ({mlx_extension.unavailable_reason()})"
    if not primitives.tiled_available():
        return "this CPU has no AVX512-VNNI (or BRISK_ISA is below vnni)"
    return None


def tiled_bits() -> frozenset[int]:
    """The bit widths whose layers this process repacks: the kernel plan's (on an AMX CPU, only
    those its prefill tiles do not take), none when `why_not_tiled()`."""
    if why_not_tiled() is not None:
        return frozenset()
    lib = ctypes_library.load()
    if quantized_matmul.AMX and lib is not None and lib.brisk_amx_available():
        return plan.QUANTIZED_BITS - plan.AMX_BITS
    return plan.QUANTIZED_BITS


def _primitives():
    primitives = mlx_extension.load()
    if primitives is None:
        raise RuntimeError(f"the tiled kernels need the MLX primitives ({mlx_extension.unavailable_reason()})")
    return primitives


def repack_native(weight: mx.array, scales: mx.array, biases: mx.array, bits: int):
    """`tile`, by the native repack (the weight) and MLX (scales and biases); lazy."""
    return _primitives().tiled_repack(weight, bits, threads()), _tile_groups(scales), _tile_groups(biases)


def tiled_matmul_reference(x, weight, scales, biases, *, bits: int, group_size: int, bias=None):
    w, s, b = untile(weight, scales, biases, bits)
    return quantized_matmul_reference(x, w, s, b, bits=bits, group_size=group_size, bias=bias)


def _scale_type(scales: mx.array, biases: mx.array) -> int:
    kind = CODES if scale_codes.is_table(scales) else SCALE_TYPES[scales.dtype]
    return kind | SYMMETRIC if scale_codes.is_offset(biases) else kind


def tiled_matmul_native(x, weight, scales, biases, *, bits: int, group_size: int, bias=None) -> mx.array:
    scale_type = _scale_type(scales, biases)
    out = _primitives().tiled_matmul(
        x, weight, scales, biases, bias, bits, group_size, scale_type, threads(), COARSE.active
    )
    return out.astype(x.dtype)


def tiled_gather_native(ids, weight, scales, biases, *, bits: int, group_size: int) -> mx.array:
    return _primitives().tiled_gather(ids, weight, scales, biases, bits, group_size, _scale_type(scales, biases))


def tiled_matmul(x, weight, scales, biases, *, bits: int, group_size: int, bias=None, native_ok: bool = True):
    """The kernel on the CPU, else untiled weights through MLX's op: slow, for the benchmarks'
    A/B, other devices, and float x (BRISK_INTEGER_ACTIVATIONS=0: exact comparisons)."""
    integer = quantized_matmul.INTEGER_ACTIVATIONS  # read per call: tests switch it on loaded models
    if native_ok and integer and mx.default_device() == mx.cpu and x.dtype in (mx.float32, mx.float16, mx.bfloat16):
        return tiled_matmul_native(x, weight, scales, biases, bits=bits, group_size=group_size, bias=bias)
    return tiled_matmul_reference(x, weight, scales, biases, bits=bits, group_size=group_size, bias=bias)


# --- the layers -----------------------------------------------------------------------------


class _Tiles:
    """The arrays `use_tiled_layers` repacked for one layer, and its call into the primitive
    with the checks done once: verify passes and prefill call ~200 layers from Python."""

    def __init__(self, primitives, arrays: tuple, bits: int, group_size: int):
        self.primitives, self.arrays = primitives, arrays
        self.args = (bits, group_size, _scale_type(arrays[1], arrays[2]))

    def held_by(self, layer) -> bool:
        """Arrays put in later (`update`, `load_weights`) are in MLX's layout and read as such.
        Spelled out, not a loop over names: asked on every call, ~200 a verify pass."""
        weight, scales, biases = self.arrays
        return layer.get("weight") is weight and layer.get("scales") is scales and layer.get("biases") is biases

    def fast(self, layer, x: mx.array) -> bool:
        """Whether this call takes the primitive straight away."""
        return (
            layer._route.native
            and x.dtype == mx.float32
            and quantized_matmul.INTEGER_ACTIVATIONS
            and mx.default_device() == mx.cpu
        )

    def __call__(self, x: mx.array, bias) -> mx.array:
        return self.primitives.tiled_matmul(x, *self.arrays, bias, *self.args, threads(), COARSE.active)


def _tiled_product(layer, tiles: _Tiles, x: mx.array, bias) -> mx.array:
    """A tiled layer's x @ W.T (+ bias): the checked primitive call when it fits, else `tiled_matmul`."""
    if tiles.fast(layer, x):
        return tiles(x, bias)
    w, s, b = layer["weight"], layer["scales"], layer["biases"]
    return tiled_matmul(
        x, w, s, b, bits=layer.bits, group_size=layer.group_size, bias=bias, native_ok=layer._route.native
    )


def _tiles_of(layer) -> _Tiles | None:
    tiles = layer.__dict__.get("_tiled")
    return tiles if tiles is not None and tiles.held_by(layer) else None


class TiledQuantizedLinear(NativeQuantizedLinear):
    """A quantized linear layer whose weight, scales and biases hold the tiled layout."""

    def __call__(self, x: mx.array) -> mx.array:
        tiles = _tiles_of(self)
        if tiles is None:
            return super().__call__(x)
        return _tiled_product(self, tiles, x, self.get("bias"))


class TiledQuantizedEmbedding(NativeQuantizedEmbedding):
    """A quantized embedding in the tiled layout: the lookup, and `as_linear` (a tied head)."""

    def __call__(self, ids: mx.array) -> mx.array:
        if _tiles_of(self) is None:
            return super().__call__(ids)
        w, s, b = self["weight"], self["scales"], self["biases"]
        if self._route.native and mx.default_device() == mx.cpu:
            return tiled_gather_native(ids, w, s, b, bits=self.bits, group_size=self.group_size)
        w, s, b = untile(w, s, b, self.bits)
        return mx.dequantize(w[ids], s[ids], b[ids], group_size=self.group_size, bits=self.bits)

    def as_linear(self, x: mx.array) -> mx.array:
        tiles = _tiles_of(self)
        if tiles is None:
            return super().as_linear(x)
        return _tiled_product(self, tiles, x, None)


TILED: dict[type, type] = {
    NativeQuantizedLinear: TiledQuantizedLinear,
    NativeQuantizedEmbedding: TiledQuantizedEmbedding,
}


def use_tiled_layers(model: nn.Module) -> int:
    """Repack the model's native quantized layers (kernels/native_layers.py swapped them in)
    into tiles, in place and one at a time: each old array is freed as its repacked one takes
    its place, so loading needs one layer's worth of memory more, not a model's. Returns how
    many layers were repacked (0 when `why_not_tiled()`). Only the plan's bit widths
    (`tiled_bits()`) are repacked; the others keep MLX's layout and the few-row kernels."""
    bits = tiled_bits()
    if not bits:
        return 0
    repacked, primitives = 0, _primitives()
    for _, module in model.named_modules():
        cls = TILED.get(type(module))
        if cls is None or getattr(module, "mode", "affine") != "affine" or module.bits not in bits:
            continue
        weight, scales, biases = module["weight"], module["scales"], module.get("biases")
        if not takes(weight, scales, biases, module.bits, module.group_size):
            continue
        tiled = repack_native(weight, scales, biases, module.bits)
        # fewer bytes a token, the same values
        compact = scale_codes.compact_layer(scales, biases, *tiled[1:], group_size=module.group_size, bits=module.bits)
        tiled = (tiled[0], *compact)
        mx.eval(*tiled)
        module["weight"], module["scales"], module["biases"] = tiled
        # which arrays hold tiles, and the checked call (a plain attribute, not a parameter)
        module.__dict__["_tiled"] = _Tiles(primitives, tiled, module.bits, module.group_size)
        module.__dict__.pop("_prepared", None)  # the MLX-layout shortcut of the arrays just replaced
        module.__class__ = cls  # a subclass with the same state
        repacked += 1
    return repacked
