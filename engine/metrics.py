"""Per-turn metrics, and KV-cache bytes measured two ways."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TurnMetrics:
    ttft_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # reused from the session's prompt cache
    prefilled_tokens: int = 0  # actually run through the model this turn
    prefill_tps: float = 0.0
    generated_tokens: int = 0
    decode_tps: float = 0.0
    kv_bytes: int = 0  # measured from the cache arrays, for the tokens they hold
    kv_bytes_formula: int = 0  # 2·layers·kv_heads·head_dim·tokens·bytes, the cross-check
    kv_bytes_allocated: int = 0  # what the buffers reserve (mlx-lm grows them in 256-token steps)
    peak_memory_bytes: int = 0
    finish_reason: str = ""  # stop | length | context | cancelled | error
    total_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _layer_arrays(layer_cache):
    """(keys, values) trimmed to the tokens held, for the caches that expose them."""
    if hasattr(layer_cache, "keys_and_values") and getattr(layer_cache, "keys", None) is not None:
        return layer_cache.keys_and_values()
    return ()


def kv_bytes_measured(cache) -> int:
    total = 0
    for layer_cache in cache:
        arrays = _layer_arrays(layer_cache)
        total += sum(a.nbytes for a in arrays) if arrays else layer_cache.nbytes
    return total


def kv_bytes_allocated(cache) -> int:
    return sum(c.nbytes for c in cache)


def kv_bytes_formula(cache, *, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """2 (K and V) · kv_heads · head_dim · tokens · bytes, summed over layers."""
    return sum(2 * kv_heads * head_dim * c.size() * itemsize for c in cache)
