"""GGUF weight blocks as MLX affine quantization (w = scale * q + bias per group).

A GGUF's quantized tensors stay quantized: a user's 98 MB Q4_1 file must not become a
540 MB float32 model. Each tensor is converted on its own, so no float32 copy of the whole
model exists at any point.

- Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are affine already, in blocks of 32: they map to MLX's
  4-, 5- or 8-bit groups of 32 exactly (Q4_0: scale d, bias -8d; Q4_1: d, m; Q5_0: d,
  -16d; Q5_1: d, m; Q8_0: d, -128d for q + 128). Q5_0 is most of a Q4_K_M file whose rows
  K-quants cannot take (Qwen2.5-0.5B's 896 columns are not a multiple of 256).
- Q4_K and Q5_K (most of a Q4_K_M or Q5_K_M file) are affine in sub-blocks of 32 too:
  w = (d * sc) * q - dmin * m, with 6-bit sc and m per sub-block and d, dmin per 256. They
  map to 4- and 5-bit groups of 32 value for value, scale d * sc and bias -dmin * m rounded
  once to float16. Re-quantizing them instead (MLX recomputes each group's scale from its
  min and max, moving values off the grid) left Qwen2.5-Coder-1.5B's Q4_K_M import at top-1
  0.941 against its own float32 import (mean KL 2.9e-2; llama.cpp on the file: 0.977).
- Q6_K (w = d * sc * (q - 32), an int8 sc per 16 values) is a Q4_K_M file's head and half
  its v/down projections: 41% of the bytes Qwen2.5-1.5B streams per token. One group of 32
  cannot keep two sub-blocks' scales, so it goes to symmetric 6-bit groups of 32 (`q6_k`):
  step |d| x the larger |sc| of the two, bias -32 steps; the sub-block with that scale keeps
  its values. On the CPU that reads 6.375 bits a weight (kernels/scale_codes.py; the file
  holds 6.5625). Against the file's values it errs less than MLX's min/max re-quantization
  did (RMS 1.72-1.80% against 1.91-1.98%, Qwen2.5-1.5B's head and a layer), and against
  llama.cpp's logits on the same file over 256 greedy tokens: top-1 1.000, mean KL 1.8e-3
  (min/max: 0.992, 2.2e-3). At 8 bits (9 per weight with scales) Q6_K was nearly exact, but
  slower.
- Other quantized types are dequantized (the `gguf` package reads them all) and quantized
  again by MLX: 4 bits in groups of 32 for the 4-bit-or-less K-quants.
- Anything else goes to 8 bits in groups of 32.
- Float tensors (norms, biases, an F16/F32 file) stay float.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

GROUP = 32
DIRECT = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K")
SUPER_BLOCK = 256  # K-quants' values per super-block: 8 sub-blocks of 32 for Q4_K and Q5_K
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
# GGUF type -> MLX bits when it is re-quantized; types not named here go to 8 bits.
REQUANTIZED_BITS = {
    "Q6_K": 6,
    "Q2_K": 4,
    "Q3_K": 4,
    "IQ4_NL": 4,
    "IQ4_XS": 4,
    "IQ3_S": 4,
    "IQ3_XXS": 4,
    "IQ2_XXS": 4,
    "IQ2_XS": 4,
    "IQ2_S": 4,
    "IQ1_S": 4,
    "IQ1_M": 4,
    "MXFP4": 4,
}


@dataclass(frozen=True)
class Quantized:
    """One tensor in MLX's layout: packed (N, K * bits / 32) uint32, scales and biases (N, K / 32)."""

    weight: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int
    group_size: int = GROUP


@dataclass
class Report:
    """Which GGUF types went to which MLX format, for the import's log and note."""

    routes: Counter = field(default_factory=Counter)  # (gguf type, "4-bit g32 exact" ...) -> tensors

    def add(self, gguf_type: str, outcome: str) -> None:
        self.routes[(gguf_type, outcome)] += 1

    def lines(self) -> list[str]:
        return [f"{n} {t} tensor(s) -> {outcome}" for (t, outcome), n in sorted(self.routes.items())]


def _blocks(data: np.ndarray, rows: int, block_bytes: int) -> np.ndarray:
    return np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1, block_bytes)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., start : start + 2]).view(np.float16)[..., 0]


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """(N, K) integers 0..2^bits-1 in MLX's packing: each row one little-endian bit string,
    element k at bits [bits * k, bits * (k + 1)) (for 5 bits, 8 elements in every 5 bytes; for 6
    bits, 4 in every 3)."""
    q = q.astype(np.uint8)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    elif bits == 5:
        eights = q.reshape(q.shape[0], -1, 8).astype(np.uint64)
        words = (eights << (5 * np.arange(8, dtype=np.uint64))).sum(axis=-1, dtype=np.uint64)
        q = words[..., None].view(np.uint8)[..., :5].reshape(q.shape[0], -1)  # little-endian: low 5 bytes
    elif bits == 6:  # 4 elements in every 3 bytes
        fours = q.reshape(q.shape[0], -1, 4).astype(np.uint32)
        words = (fours << (6 * np.arange(4, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
        q = words[..., None].view(np.uint8)[..., :3].reshape(q.shape[0], -1)
    return np.ascontiguousarray(q).view(np.uint32)


def _nibbles(blocks: np.ndarray) -> np.ndarray:
    """A block's 32 4-bit values: GGUF keeps elements 0-15 in the low nibbles, 16-31 in the high ones."""
    return np.concatenate([blocks & 0x0F, blocks >> 4], axis=-1)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and mins, as (..., 8) each: bytes 0-3 hold scales
    0-3 and, in their top bits, the top bits of scales 4-7; bytes 4-7 the same for the mins;
    bytes 8-11 the low four bits of scales 4-7 (low nibble) and mins 4-7 (high nibble)."""
    d, m, low = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([d & 0x3F, (low & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([m & 0x3F, (low >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return scales, mins


def k_quant(gguf_type: str, data: np.ndarray, rows: int) -> Quantized:
    """Q4_K / Q5_K super-blocks as MLX groups of 32 (one per sub-block), value for value.
    Q4_K: d, dmin (f16), 12 bytes of scales, 128 bytes of nibbles (each run of 32 bytes holds
    sub-block 2c in its low nibbles, 2c + 1 in its high ones); Q5_K adds, before the nibbles,
    32 bytes whose bit i is sub-block i's fifth bit."""
    five = gguf_type == "Q5_K"
    blocks = _blocks(data, rows, 176 if five else 144)
    d, dmin = _f16(blocks, 0).astype(np.float32), _f16(blocks, 2).astype(np.float32)
    sc, mins = _k_scales(blocks[..., 4:16])
    nibbles = blocks[..., 48:] if five else blocks[..., 16:]
    runs = nibbles.reshape(*nibbles.shape[:2], 4, 1, 32)
    q = ((runs >> np.array([0, 4], dtype=np.uint8).reshape(2, 1)) & 0x0F).reshape(*nibbles.shape[:2], 8, 32)
    if five:
        high = blocks[..., 16:48].reshape(*nibbles.shape[:2], 1, 32)
        q = q | (((high >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1) << 4)
    scales = (d[..., None] * sc).astype(np.float16).reshape(rows, -1)
    biases = (-(dmin[..., None] * mins)).astype(np.float16).reshape(rows, -1)
    return Quantized(pack(q.reshape(rows, -1), 5 if five else 4), scales, biases, 5 if five else 4)


def direct(gguf_type: str, data: np.ndarray, rows: int) -> Quantized:
    """Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks of 32 (and Q4_K / Q5_K sub-blocks of 32) as MLX
    groups of 32, value for value."""
    if gguf_type in ("Q4_K", "Q5_K"):
        return k_quant(gguf_type, data, rows)
    if gguf_type == "Q8_0":  # d (f16), 32 x int8
        blocks = _blocks(data, rows, 34)
        d = _f16(blocks, 0)
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).reshape(rows, -1)
        return Quantized(pack(q, 8), d, (d * np.float16(-128)).astype(np.float16), 8)
    if gguf_type in ("Q5_0", "Q5_1"):  # d (f16)[, m (f16)], 32 high bits (u32), 16 bytes of low nibbles
        with_min = gguf_type == "Q5_1"
        at = 4 if with_min else 2
        blocks = _blocks(data, rows, at + 20)
        d = _f16(blocks, 0)
        high = np.ascontiguousarray(blocks[..., at : at + 4]).view(np.uint32)  # bit e: element e's fifth bit
        fifth = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
        q = (_nibbles(blocks[..., at + 4 :]) | fifth).reshape(rows, -1)
        bias = _f16(blocks, 2) if with_min else (d * np.float16(-16)).astype(np.float16)
        return Quantized(pack(q, 5), d, bias, 5)
    with_min = gguf_type == "Q4_1"  # Q4_1: d, m (f16), 16 bytes; Q4_0: d (f16), 16 bytes
    blocks = _blocks(data, rows, 20 if with_min else 18)
    d = _f16(blocks, 0)
    q = _nibbles(blocks[..., 4 if with_min else 2 :]).reshape(rows, -1)
    bias = _f16(blocks, 2) if with_min else (d * np.float16(-8)).astype(np.float16)
    return Quantized(pack(q, 4), d, bias, 4)


def q6_k(data: np.ndarray, rows: int, weight: np.ndarray) -> Quantized:
    """Q6_K (w = d * sc * (q - 32), an int8 sc per 16 values, d per 256) as symmetric 6-bit
    groups of 32: scale |d| * c, c the larger |sc| of the group's two sub-blocks, bias -32 x
    scale. The sub-block with that sc keeps its values exactly, the other is rounded to its
    grid (at most half a step off); biases as a multiple of the scale and scales as d x a code
    per 256 let the CPU kernel read 6.375 bits a weight, where the file holds 6.5625
    (kernels/scale_codes.py). `weight` is the tensor dequantized, (rows, K) float32."""
    blocks = _blocks(data, rows, 210)  # ql (128), qh (64), 16 int8 scales, d (f16)
    d = np.abs(_f16(blocks, 208).astype(np.float32))
    sc = np.abs(blocks[..., 192:208].view(np.int8).astype(np.float32)).reshape(rows, -1, 8, 2).max(-1)
    scales = (d[..., None] * sc).astype(np.float16).reshape(rows, -1)
    step = scales.astype(np.float32)
    grouped = weight.reshape(rows, -1, GROUP)
    ratio = np.divide(grouped, step[..., None], out=np.zeros_like(grouped), where=step[..., None] > 0)
    q = np.clip(np.rint(ratio) + 32, 0, 63).astype(np.uint8).reshape(rows, -1)
    return Quantized(pack(q, 6), scales, (scales * np.float16(-32)).astype(np.float16), 6)


def requantize(weight: np.ndarray, bits: int) -> Quantized:
    """A float (N, K) weight quantized by MLX to `bits` in groups of 32, scales in float16."""
    import mlx.core as mx

    packed, scales, biases = mx.quantize(mx.array(weight, dtype=mx.float32), group_size=GROUP, bits=bits)
    return Quantized(
        np.asarray(packed), np.asarray(scales.astype(mx.float16)), np.asarray(biases.astype(mx.float16)), bits
    )


def convert(tensor, dequantize) -> Quantized | np.ndarray:
    """One GGUF tensor as MLX quantized arrays, or as float32 for float and 1-D tensors.

    `dequantize(data, type)` is the gguf package's reader (passed in: the import owns it).
    """
    name = tensor.tensor_type.name
    shape = [int(n) for n in reversed(tensor.shape)]  # GGUF dims are reversed from HF's
    if name in FLOAT_TYPES or len(shape) != 2 or shape[1] % GROUP:
        return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
    if name in DIRECT and (name not in ("Q4_K", "Q5_K") or shape[1] % SUPER_BLOCK == 0):
        return direct(name, tensor.data, shape[0])
    weight = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
    if name == "Q6_K" and shape[1] % SUPER_BLOCK == 0:
        return q6_k(tensor.data, shape[0], weight)
    return requantize(weight, REQUANTIZED_BITS.get(name, 8))


def outcome(name: str, result) -> str:
    if isinstance(result, np.ndarray):
        return "float32"
    how = "exact" if name in DIRECT else "re-quantized"
    return f"{result.bits}-bit, groups of {result.group_size}, {how}"


def permute_rows(result: Quantized | np.ndarray, reorder) -> Quantized | np.ndarray:
    """Apply a row permutation (llama's q/k un-permute) to every array of a tensor."""
    if isinstance(result, np.ndarray):
        return reorder(result)
    return Quantized(
        reorder(result.weight), reorder(result.scales), reorder(result.biases), result.bits, result.group_size
    )
