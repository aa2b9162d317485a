"""Where prefill and decode time goes: each piece of one decoder layer timed alone.

For a prompt of N tokens prefilled in chunks of S, every chunk at offset P runs, per
layer: the q/k/v/o projections, attention over P+S keys (split into the two matmuls
QK^T and PV, and the rest: scaling, mask, softmax), and the MLP. Decode at context N is
the same with S = 1, plus the LM head. Pieces are timed in isolation (median of
repeats) and scaled by the layer count, then set against the measured end-to-end time.
Isolation misses some work (norms, RoPE, cache writes) and adds some (each piece pays its
own dispatch and thread wake-up), so their sum is reported as a share of the measured time.
"""

from __future__ import annotations

import statistics
import time


def _timed(fn, repeats: int = 3) -> float:
    import mlx.core as mx

    mx.eval(fn())
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(fn())
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _layer_parts(layer, hidden: int, n_q: int, n_kv: int, head_dim: int, length: int, kv_len: int) -> dict:
    import mlx.core as mx

    attn = layer.self_attn
    x = mx.random.normal((1, length, hidden))
    q = mx.random.normal((1, n_q, length, head_dim))
    k = mx.random.normal((1, n_kv, kv_len, head_dim))
    v = mx.random.normal((1, n_kv, kv_len, head_dim))
    out = mx.random.normal((1, length, n_q * head_dim))
    rep = n_q // n_kv
    kr, vr = mx.repeat(k, rep, axis=1), mx.repeat(v, rep, axis=1)  # (B, H, Lk, D)
    probs = mx.random.normal((1, n_q, length, kv_len))  # (B, H, Lq, Lk)
    mx.eval(x, q, k, v, out, kr, vr, probs)
    mask = "causal" if length > 1 else None
    scale = head_dim**-0.5
    sdpa = _timed(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask))
    matmuls = _timed(lambda: q @ kr.swapaxes(-1, -2)) + _timed(lambda: probs @ vr)
    return {
        "projections": _timed(lambda: [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x), attn.o_proj(out)]),
        "attention_matmuls": max(matmuls, 0.0),
        "attention_softmax_etc": max(sdpa - matmuls, 0.0),
        "mlp": _timed(lambda: layer.mlp(x)),
    }


def _shape(lm):
    args = lm.config.get("text_config") or lm.config
    n_q = args["num_attention_heads"]
    return (
        args["hidden_size"],
        n_q,
        args.get("num_key_value_heads") or n_q,
        args.get("head_dim") or args["hidden_size"] // n_q,
        args["num_hidden_layers"],
    )


def profile_time(lm, prompt_tokens: int, step: int) -> dict | None:
    """Estimated seconds per component for one prefill of `prompt_tokens` and one decode step."""
    import mlx.core as mx

    body = getattr(lm.model, "model", None)
    layers = getattr(body, "layers", None)
    if not layers or not hasattr(layers[0], "self_attn") or not hasattr(layers[0], "mlp"):
        return None  # not the standard mlx-lm decoder layout
    hidden, n_q, n_kv, head_dim, n_layers = _shape(lm)
    prefill: dict[str, float] = {}
    for start in range(0, prompt_tokens, step):
        length = min(step, prompt_tokens - start)
        for key, value in _layer_parts(layers[0], hidden, n_q, n_kv, head_dim, length, start + length).items():
            prefill[key] = prefill.get(key, 0.0) + value * n_layers
    decode = {
        k: v * n_layers for k, v in _layer_parts(layers[0], hidden, n_q, n_kv, head_dim, 1, prompt_tokens).items()
    }
    x = mx.random.normal((1, 1, hidden))
    head = getattr(lm.model, "lm_head", None) or getattr(body, "embed_tokens").as_linear  # tied embeddings
    decode["lm_head"] = _timed(lambda: head(x))
    return {"prefill": prefill, "decode": decode}
