"""`brisk bench kv-quality`: does an int4 KV cache change what the model says?

For each prompt length: prefill the same prompt into an unquantized and an int4 cache,
then decode greedily in lockstep, feeding both the unquantized model's token. Reports
top-1 agreement of the next-token choice, mean and max KL(p_16 || p_4) of the next-token
distributions, and where free-running int4 greedy output first differs. Open-TQ-Metal
notes models with attention scale 1.0 degrade sooner, so the scale is reported too.
"""

from __future__ import annotations

from engine.bench.common import filler_text, print_table


def _prefill(lm, tokens: list[int], bits: int, group_size: int, step: int):
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.kvcache import maybe_quantize_kv_cache
    from engine.prefill import prefill_chunks

    cache = make_prompt_cache(lm.model)
    for _ in prefill_chunks(lm.model, cache, tokens[:-1], step):
        maybe_quantize_kv_cache(cache, bits=bits, group_size=group_size, start=0)
    logits = lm.model(mx.array(tokens[-1:])[None], cache=cache)[0, -1]
    maybe_quantize_kv_cache(cache, bits=bits, group_size=group_size, start=0)
    return cache, logits


def compare(lm, tokens: list[int], *, gen: int, group_size: int, step: int = 512) -> dict:
    import mlx.core as mx

    dense, d_logits = _prefill(lm, tokens, 16, group_size, step)
    packed, p_logits = _prefill(lm, tokens, 4, group_size, step)
    agree, kls, reference = 0, [], []
    for _ in range(gen):
        d_logp = d_logits - mx.logsumexp(d_logits)
        p_logp = p_logits - mx.logsumexp(p_logits)
        kl = mx.sum(mx.exp(d_logp) * (d_logp - p_logp))
        token = mx.argmax(d_logits)
        same = mx.argmax(p_logits) == token
        mx.eval(kl, token, same)
        kls.append(max(kl.item(), 0.0))
        agree += int(same.item())
        reference.append(token.item())
        feed = token.reshape(1, 1)
        d_logits = lm.model(feed, cache=dense)[0, -1]
        p_logits = lm.model(feed, cache=packed)[0, -1]
    del dense, packed
    free = _free_running(lm, tokens, gen, group_size, step)
    first_diff = next((i for i, (a, b) in enumerate(zip(reference, free)) if a != b), None)
    return {"prompt_tokens": len(tokens), "generated": gen, "top1_agreement": agree / gen,
            "mean_kl": sum(kls) / len(kls), "max_kl": max(kls),
            "free_running_first_difference": first_diff}


def _free_running(lm, tokens: list[int], gen: int, group_size: int, step: int) -> list[int]:
    import mlx.core as mx

    cache, logits = _prefill(lm, tokens, 4, group_size, step)
    out = []
    for _ in range(gen):
        token = mx.argmax(logits)
        out.append(token.item())
        logits = lm.model(token.reshape(1, 1), cache=cache)[0, -1]
    return out


def run_kv_quality(model_id: str, lengths: list[int], *, gen: int, group_size: int, as_json: bool) -> dict:
    from engine.kvcache import check_kv_packable, kv_shape
    from engine.models.loader import load_model

    lm = load_model(model_id)
    check_kv_packable(lm.config, group_size)
    args = lm.config.get("text_config") or lm.config
    scale = args.get("query_pre_attn_scalar", kv_shape(lm.config)["head_dim"]) ** -0.5
    payload = {"model": model_id, "group_size": group_size, "attention_scale": scale, "lengths": []}
    rows = []
    for n in lengths:
        n = min(n, lm.context_length - gen - 1)
        tokens = lm.tokenizer.encode(filler_text(lm.tokenizer, n))[:n]
        result = compare(lm, tokens, gen=gen, group_size=group_size)
        payload["lengths"].append(result)
        rows.append([result["prompt_tokens"], gen, result["top1_agreement"], result["mean_kl"], result["max_kl"],
                     str(result["free_running_first_difference"])])
    print_table(f"brisk bench kv-quality: {model_id}, int4 group {group_size} vs unquantized, "
                f"attention scale {scale:.4f}",
                ["prompt", "generated", "top-1 agree", "mean KL", "max KL", "first diff (free run)"],
                rows, payload, as_json)
    return payload
