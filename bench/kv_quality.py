"""`brisk bench kv-quality`: does a packed KV cache change what the model says?

For each prompt length and each packed mode (key bits, value bits, key layout): the
measurement of engine/kv/fidelity.py (lockstep greedy decoding against the unquantized
cache: top-1 agreement, mean and max KL) over `gen` positions, plus where free-running
packed greedy output first differs. The unquantized run is shared by the modes. Open-TQ-Metal
notes models with attention scale 1.0 degrade sooner, so the scale is reported too.
`--key-layouts token,channel` compares per-token keys (before KIVI) with per-channel keys
in one run.
"""

from __future__ import annotations

from typing import Any

from brisk.bench.common import attention_shape, filler_text, print_table
from brisk.engine.kv.fidelity import PackedMode, compare, reference_run


def run_kv_quality(
    model_id: str,
    lengths: list[int],
    *,
    gen: int,
    group_size: int,
    as_json: bool,
    modes: list[PackedMode] | None = None,
) -> dict:
    from brisk.engine.kv.packed_cache import check_kv_packable
    from brisk.engine.models.loader import load_model

    modes = modes or [PackedMode(4, 4)]
    lm = load_model(model_id)
    for mode in modes:
        check_kv_packable(lm.config, v_bits=mode.v_bits, group_size=group_size)
    args = lm.config.get("text_config") or lm.config
    scale = args.get("query_pre_attn_scalar", attention_shape(lm.config)["head_dim"]) ** -0.5
    payload: dict[str, Any] = {"model": model_id, "group_size": group_size, "attention_scale": scale, "lengths": []}
    rows = []
    for n in lengths:
        n = min(n, lm.context_length - gen - 1)
        tokens = lm.tokenizer.encode(filler_text(lm.tokenizer, n))[:n]
        reference = reference_run(lm, tokens, gen, group_size)
        for mode in modes:
            result = compare(lm, tokens, mode, reference, group_size=group_size)
            payload["lengths"].append(result)
            rows.append(
                [
                    result["prompt_tokens"],
                    mode.label,
                    gen,
                    result["top1_agreement"],
                    result["mean_kl"],
                    result["max_kl"],
                    str(result["free_running_first_difference"]),
                ]
            )
    print_table(
        f"brisk bench kv-quality: {model_id}, packed vs unquantized KV (value group {group_size}, "
        f"keys per channel in groups of 32 tokens unless marked), attention scale {scale:.4f}",
        ["prompt", "mode", "generated", "top-1 agree", "mean KL", "max KL", "first diff (free run)"],
        rows,
        payload,
        as_json,
    )
    return payload
