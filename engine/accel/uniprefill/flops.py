"""Prefill FLOPs from the tokens each layer processed: the bound on UniPrefill's speedup
(measured speedups fall short of it by the scoring and the per-layer overheads)."""

from __future__ import annotations


def layer_flops(config: dict, tokens: int, prior: int) -> float:
    """One transformer layer over `tokens` new tokens that also attend to `prior` earlier
    ones: projections and MLP (2 FLOPs per weight per token) plus QK and PV."""
    args = config.get("text_config") or config
    hidden = args["hidden_size"]
    heads = args["num_attention_heads"]
    kv_heads = args.get("num_key_value_heads") or heads
    head_dim = args.get("head_dim") or hidden // heads
    intermediate = args.get("intermediate_size") or 4 * hidden
    weights = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate
    keys_seen = tokens * prior + tokens * (tokens + 1) / 2
    return 2.0 * weights * tokens + 4.0 * heads * head_dim * keys_seen


def flops_saved(config: dict, layer_tokens: list[int], prior: int) -> float:
    """Share of dense prefill FLOPs that a prefill processing `layer_tokens[i]` tokens in
    layer i skipped (dense: every layer processes layer_tokens[0])."""
    if not layer_tokens:
        return 0.0
    dense = len(layer_tokens) * layer_flops(config, layer_tokens[0], prior)
    sparse = sum(layer_flops(config, n, prior) for n in layer_tokens)
    return 1.0 - sparse / dense if dense else 0.0
