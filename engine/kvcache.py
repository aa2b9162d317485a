"""KV-cache modes per conversation: unquantized, or int8/int4 packed with attention on the
packed data (Open-TQ-Metal, 2026: asymmetric int4 per group of 32 with fp16 scale and
zero point, 5 bits per element, 3.2x smaller than fp16).

- `PackedKVCache` is mlx-lm's `QuantizedKVCache` storing scales and biases in float16
  whatever the activation dtype (float32 on the CPU), so int4/group-32 costs exactly
  4 + 2·16/32 = 5 bits per element. Trimming (prompt cache, speculative rollback) is
  mlx-lm's: an offset change.
- Layers start unquantized, so the first prefill chunk attends with plain SDPA, and are
  packed by `maybe_quantize_kv_cache` once they hold `start` tokens.
- Sliding-window layers (RotatingKVCache) stay unquantized: they hold at most `window`
  tokens, so packing them saves little, and mlx-lm cannot quantize them (it raises).
- mlx-lm's attention sends every cache with `bits` to `quantized_scaled_dot_product_attention`
  in `mlx_lm.models.base`; `use_packed_attention()` points that name at
  `kernels.quantized_attention`, which computes the same function (tests compare both
  with the dequantize-then-attend reference) without materializing long score matrices.
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models import base as mlx_lm_base
from mlx_lm.models import cache as mlx_lm_cache
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from engine.errors import InvalidSettings
from kernels.quantized_attention import quantized_attention

# Group 32 is Open-TQ-Metal's choice: finer groups, better int4 accuracy, 5 bits/element.
DEFAULT_KV_GROUP_SIZE = 32
SCALE_DTYPE = mx.float16

MLX_LM_QUANTIZED_SDPA = mlx_lm_base.quantized_scaled_dot_product_attention


def _packed_sdpa(queries, q_keys, q_values, scale, mask, group_size=64, bits=8):
    return quantized_attention(queries, q_keys, q_values, scale=scale, mask=mask, group_size=group_size, bits=bits)


def use_packed_attention() -> None:
    """Route mlx-lm's quantized attention to Brisk's kernel (idempotent)."""
    mlx_lm_base.quantized_scaled_dot_product_attention = _packed_sdpa


class PackedKVCache(QuantizedKVCache):
    """QuantizedKVCache with float16 scales/biases (see module docstring)."""

    def update_and_fetch(self, keys, values):
        b, n_kv, steps, k_dim = keys.shape
        prev = self.offset
        if self.keys is None or prev + steps > self.keys[0].shape[-2]:
            self._grow(b, n_kv, steps, k_dim, values.shape[-1], keys.dtype)
        self.offset += steps
        for stored, new in ((self.keys, keys), (self.values, values)):
            packed = mx.quantize(new, group_size=self.group_size, bits=self.bits)
            for buffer, part in zip(stored, packed):
                buffer[..., prev:self.offset, :] = part  # scales/biases cast to float16 here
        return self.keys_and_values()

    def _grow(self, b, n_kv, steps, k_dim, v_dim, dtype):
        per_word = 32 // self.bits
        new_steps = (self.step + steps - 1) // self.step * self.step

        def empty(dim):  # (B, Hkv, S, D/per_word) packed + (B, Hkv, S, D/group) scales, biases
            return (mx.zeros((b, n_kv, new_steps, dim // per_word), mx.uint32),
                    mx.zeros((b, n_kv, new_steps, dim // self.group_size), SCALE_DTYPE),
                    mx.zeros((b, n_kv, new_steps, dim // self.group_size), SCALE_DTYPE))

        if self.keys is None:
            self.keys, self.values = empty(k_dim), empty(v_dim)
            return
        keep = self.offset
        self.keys = tuple(mx.concatenate([x[..., :keep, :], e], axis=2) for x, e in zip(self.keys, empty(k_dim)))
        self.values = tuple(mx.concatenate([x[..., :keep, :], e], axis=2) for x, e in zip(self.values, empty(v_dim)))

    def size(self) -> int:
        return self.offset

    @classmethod
    def from_dense(cls, dense: KVCache, *, bits: int, group_size: int) -> "PackedKVCache":
        packed = cls(group_size=group_size, bits=bits)
        if dense.keys is not None:
            keys, values = dense.keys_and_values()
            packed.update_and_fetch(keys, values)
        return packed


# mlx-lm's load_prompt_cache rebuilds caches by class name from its own module.
mlx_lm_cache.PackedKVCache = PackedKVCache


def maybe_quantize_kv_cache(cache: list, *, bits: int, group_size: int, start: int) -> None:
    """Pack each plain KVCache layer holding at least `start` tokens (in place)."""
    if bits >= 16:
        return
    use_packed_attention()
    for i, layer in enumerate(cache):
        if type(layer) is KVCache and layer.offset >= max(start, 1):
            cache[i] = PackedKVCache.from_dense(layer, bits=bits, group_size=group_size)


def held_arrays(layer) -> list:
    """The arrays a layer cache uses for the tokens it holds (its buffers may be larger)."""
    if not hasattr(layer, "keys"):  # e.g. recurrent state: all of it is held
        return [a for _, a in tree_flatten(layer.state) if a is not None]
    if layer.keys is None:
        return []
    held = layer.size()
    return [a[..., :held, :] for _, a in tree_flatten([layer.keys, layer.values])]


def layer_bytes_formula(layer, *, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """2·kv_heads·tokens·(head_dim·bytes), or for packed layers head_dim·bits/8 plus the
    float16 scale and bias of each group."""
    if not hasattr(layer, "keys"):  # recurrent state has a fixed size, no per-token formula
        return sum(a.nbytes for a in held_arrays(layer))
    tokens = layer.size()
    if isinstance(layer, QuantizedKVCache):
        per_head = head_dim * layer.bits // 8 + (head_dim // layer.group_size) * 2 * SCALE_DTYPE.size
        return 2 * kv_heads * tokens * per_head
    return 2 * kv_heads * head_dim * tokens * itemsize


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, *, bits: int, group_size: int,
                       itemsize: int) -> float:
    if bits >= 16:
        return 2 * layers * kv_heads * head_dim * itemsize
    return 2 * layers * kv_heads * (head_dim * bits / 8 + head_dim / group_size * 2 * SCALE_DTYPE.size)


def check_kv_packable(config: dict, group_size: int) -> None:
    shape = kv_shape(config)
    if shape and shape["head_dim"] % group_size:
        raise InvalidSettings(f"A {group_size}-wide quantization group does not divide this model's head "
                              f"dimension ({shape['head_dim']}); use kv_bits 16 or a smaller group")


def kv_shape(config: dict) -> dict | None:
    """kv_heads and head_dim from the model config (the formula's independent inputs)."""
    args = config.get("text_config") or config
    heads = args.get("num_key_value_heads") or args.get("num_attention_heads")
    if not heads or not args.get("num_attention_heads"):
        return None
    head_dim = args.get("head_dim") or args["hidden_size"] // args["num_attention_heads"]
    return {"kv_heads": heads, "head_dim": head_dim}
