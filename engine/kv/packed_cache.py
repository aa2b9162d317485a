"""KV-cache modes per conversation: unquantized, or K and V each packed at its own bits
(16/8/4, as llama.cpp's -ctk/-ctv), with attention on the packed data.

- Keys are packed per channel over groups of 32 tokens (KIVI, Liu et al. 2024): Qwen2's
  keys have outlier channels, and per-token groups smeared them over their neighbours
  (`brisk bench kv-quality`, int4, top-1 agreement with 16-bit KV on Qwen2.5-Coder-0.5B at
  8K: 0.844 per token, 0.996 per channel). Tokens that
  do not yet fill a group stay dense float16 (the recent window, 32 to 63 tokens once a
  group has been packed, so a speculative rollback never reaches packed keys).
- Values are packed per token in groups of `group_size` channels (Open-TQ-Metal, 2026:
  asymmetric int4, fp16 scale and zero point, 5 bits per element at group 32).
- Layouts and packing live in kernels/packed_kv.py; `PackedKVCache` stores them and
  hands each attention call views of what it holds.
- Layers start unquantized, so the first prefill chunk attends with plain SDPA, and are
  packed by `maybe_quantize_kv_cache` once they hold `start` tokens.
- Sliding-window layers (RotatingKVCache) stay unquantized: they hold at most `window`
  tokens, so packing them saves little.
- mlx-lm's attention sends every cache with `bits` to `quantized_scaled_dot_product_attention`
  in `mlx_lm.models.base`; `use_packed_attention()` points that name at Brisk's kernels
  (kernels/kv_attention.py), which read the layouts this cache hands them.
"""

from __future__ import annotations

from mlx_lm.models import base as mlx_lm_base
from mlx_lm.models import cache as mlx_lm_cache
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from brisk.engine.api.errors import InvalidSettings
from brisk.engine.kv.half import DENSE_CACHES
from brisk.engine.kv.stores import ChannelStore, RowStore
from brisk.engine.runtime.mx_values import tree_leaves
from brisk.kernels.kv_attention import kv_attention
from brisk.kernels.packed_kv import SCALE_DTYPE, TOKEN_GROUP, Dense, KVLayout, TokenPacked
from brisk.kernels.quantized_attention import quantized_attention

# Group 32 is Open-TQ-Metal's choice: finer groups, better int4 accuracy, 5 bits/element.
DEFAULT_KV_GROUP_SIZE = 32
KEY_LAYOUTS = ("channel", "token")  # "token" is the per-token key layout (kept for comparison)

MLX_LM_QUANTIZED_SDPA = mlx_lm_base.quantized_scaled_dot_product_attention


def _packed_sdpa(queries, q_keys, q_values, scale, mask, group_size=64, bits=8):
    if isinstance(q_values, (Dense, TokenPacked)):  # a PackedKVCache's views
        return kv_attention(queries, q_keys, q_values, scale=scale, mask=mask)
    return quantized_attention(queries, q_keys, q_values, scale=scale, mask=mask, group_size=group_size, bits=bits)


def use_packed_attention() -> None:
    """Route mlx-lm's quantized attention to Brisk's kernels (idempotent)."""
    mlx_lm_base.quantized_scaled_dot_product_attention = _packed_sdpa


class PackedKVCache(QuantizedKVCache):
    """K and V each dense or packed at its own bits: keys per channel, values per token."""

    step = 256  # a multiple of TOKEN_GROUP

    def __init__(
        self, *, k_bits: int = 4, v_bits: int = 4, group_size: int = DEFAULT_KV_GROUP_SIZE, key_layout: str = "channel"
    ):
        if key_layout not in KEY_LAYOUTS:
            raise ValueError(f"key_layout must be one of {KEY_LAYOUTS}")
        self.k_bits, self.v_bits, self.group_size, self.key_layout = k_bits, v_bits, group_size, key_layout
        self.bits = min(k_bits, v_bits)  # mlx-lm sends any cache with `bits` to the packed attention
        self.offset = 0
        self._reset_stores()

    def _reset_stores(self) -> None:
        by_channel = self.k_bits < 16 and self.key_layout == "channel"
        self.k = ChannelStore(self.k_bits) if by_channel else RowStore(self.k_bits, self.group_size)
        self.v = RowStore(self.v_bits, self.group_size)

    # mlx-lm's caches hold keys and values as attributes; here they are views of the stores
    @property
    def keys(self) -> KVLayout | None:  # type: ignore[override]  # None when empty, as mlx-lm's caches say it
        return self.views()[0] if self.offset else None

    @property
    def values(self) -> KVLayout | None:  # type: ignore[override]
        return self.views()[1] if self.offset else None

    def update_and_fetch(self, keys, values):
        start = self.offset
        if isinstance(self.k, ChannelStore):
            self.k.begin(start, keys.shape[2], self.step)
            self.k.append(keys)
        else:
            self.k.write(keys, start, self.step)
        self.v.write(values, start, self.step)
        self.offset += keys.shape[2]
        return self.views()

    def views(self) -> tuple[KVLayout, KVLayout]:
        keys = self.k.view() if isinstance(self.k, ChannelStore) else self.k.view(self.offset)
        return keys, self.v.view(self.offset)

    def keys_and_values(self):
        return self.views()

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.offset == 0

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        if isinstance(self.k, ChannelStore):
            self.k.truncate(self.offset)
        return n

    def held_arrays(self) -> list:
        keys = self.k.arrays() if isinstance(self.k, ChannelStore) else self.k.arrays(self.offset)
        return keys + self.v.arrays(self.offset)

    @property
    def nbytes(self) -> int:  # what the buffers reserve (they grow in steps of 256 tokens)
        buffers = (self.k.buffers or []) + (self.v.buffers or [])
        recent = getattr(self.k, "recent", None)
        return sum(a.nbytes for a in buffers) + (recent.nbytes if recent is not None else 0)

    @property
    def state(self):
        channels = isinstance(self.k, ChannelStore)
        meta = [
            self.offset,
            self.k_bits,
            self.v_bits,
            self.group_size,
            self.key_layout,
            self.k.packed if channels else 0,
            self.k.recent_from if channels else 0,
        ]
        return {
            "meta": meta,
            "k": self.k.arrays() if channels else self.k.arrays(self.offset),
            "v": self.v.arrays(self.offset),
        }

    @state.setter
    def state(self, state):
        offset, self.k_bits, self.v_bits, self.group_size, self.key_layout, packed, recent_from = state["meta"]
        self.bits, self.offset = min(self.k_bits, self.v_bits), 0
        self._reset_stores()
        keys, values = state.get("k") or [], state.get("v") or []
        self.v.adopt(values)
        if isinstance(self.k, ChannelStore):
            self.k.packed, self.k.recent_from = packed, recent_from
            self.k.buffers = list(keys[:3]) if packed else None
            self.k.recent = keys[-1] if len(keys) in (1, 4) else None
        else:
            self.k.adopt(keys)
        self.offset = offset

    @classmethod
    def from_dense(
        cls, dense: KVCache, *, k_bits: int, v_bits: int, group_size: int, key_layout: str = "channel"
    ) -> "PackedKVCache":
        packed = cls(k_bits=k_bits, v_bits=v_bits, group_size=group_size, key_layout=key_layout)
        if dense.keys is not None:
            held = dense.offset
            packed.update_and_fetch(dense.keys[..., :held, :], dense.values[..., :held, :])
        return packed


# mlx-lm's load_prompt_cache rebuilds caches by class name from its own module.
setattr(mlx_lm_cache, "PackedKVCache", PackedKVCache)


def maybe_quantize_kv_cache(
    cache: list, *, k_bits: int, v_bits: int, group_size: int, start: int, key_layout: str = "channel"
) -> None:
    """Pack each plain KVCache layer holding at least `start` tokens (in place)."""
    if k_bits >= 16 and v_bits >= 16:
        return
    use_packed_attention()
    for i, layer in enumerate(cache):
        if type(layer) in DENSE_CACHES and layer.offset >= max(start, 1):
            cache[i] = PackedKVCache.from_dense(
                layer, k_bits=k_bits, v_bits=v_bits, group_size=group_size, key_layout=key_layout
            )


def held_arrays(layer) -> list:
    """The arrays a layer cache uses for the tokens it holds (its buffers may be larger)."""
    if isinstance(layer, PackedKVCache):
        return layer.held_arrays()
    if not hasattr(layer, "keys"):  # e.g. recurrent state: all of it is held
        return [a for a in tree_leaves(layer.state) if a is not None]
    if layer.keys is None:
        return []
    held = layer.size()
    return [a[..., :held, :] for a in tree_leaves([layer.keys, layer.values])]


def _packed_row_bytes(head_dim: int, bits: int, group: int) -> float:
    """One token of one head packed in groups of `group`: bits per value plus a float16
    scale and bias per group."""
    return head_dim * bits / 8 + head_dim / group * 2 * SCALE_DTYPE.size


def layer_bytes_formula(layer, *, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """2·kv_heads·tokens·(head_dim·bytes), or for packed layers head_dim·bits/8 plus the
    float16 scale and bias of each group (keys per channel: the recent tokens dense float16)."""
    if not hasattr(layer, "keys"):  # recurrent state has a fixed size, no per-token formula
        return sum(a.nbytes for a in held_arrays(layer))
    tokens = layer.size()
    if not isinstance(layer, PackedKVCache):
        return 2 * kv_heads * head_dim * tokens * itemsize
    if layer.v_bits >= 16:
        values = head_dim * itemsize * tokens
    else:
        values = _packed_row_bytes(head_dim, layer.v_bits, layer.group_size) * tokens
    if layer.k_bits >= 16:
        keys = head_dim * itemsize * tokens
    elif isinstance(layer.k, ChannelStore):
        dense = tokens - layer.k.recent_from  # the recent keys, float16 (the newest packed group may be both)
        keys = _packed_row_bytes(head_dim, layer.k_bits, TOKEN_GROUP) * layer.k.packed + head_dim * 2 * dense
    else:  # keys packed per token
        keys = _packed_row_bytes(head_dim, layer.k_bits, layer.group_size) * tokens
    return int(kv_heads * (keys + values))


def kv_bytes_per_token(
    layers: int, kv_heads: int, head_dim: int, *, k_bits: int, v_bits: int, group_size: int, itemsize: int
) -> float:
    """Bytes a token adds to the cache (the recent window of at most 63 dense keys per
    layer is a constant, not per token)."""

    def per_head(bits: int, group: int) -> float:
        return head_dim * itemsize if bits >= 16 else _packed_row_bytes(head_dim, bits, group)

    return layers * kv_heads * (per_head(k_bits, TOKEN_GROUP) + per_head(v_bits, group_size))


def check_kv_packable(config: dict, *, v_bits: int, group_size: int) -> None:
    """Packed values need groups that divide the head dimension (keys are grouped by token)."""
    shape = kv_shape(config)
    if v_bits < 16 and shape and shape["head_dim"] % group_size:
        raise InvalidSettings(
            f"A {group_size}-wide quantization group does not divide this model's head "
            f"dimension ({shape['head_dim']}); use v_bits 16 or a smaller group"
        )


def kv_shape(config: dict) -> dict | None:
    """kv_heads and head_dim from the model config (the formula's independent inputs)."""
    args = config.get("text_config") or config
    heads = args.get("num_key_value_heads") or args.get("num_attention_heads")
    if not heads or not args.get("num_attention_heads"):
        return None
    head_dim = args.get("head_dim") or args["hidden_size"] // args["num_attention_heads"]
    return {"kv_heads": heads, "head_dim": head_dim}
