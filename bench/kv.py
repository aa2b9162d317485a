"""`brisk bench kv`: int4 KV cache speed and size.

Per context length, with the model's attention shapes:
- one decode step of attention (one layer): dequantize-then-attend, mlx-lm's
  `quantized_scaled_dot_product_attention` (its own per-token layout), Brisk's dispatcher
  (the native CPU kernel when it could be built) on per-channel keys and on per-token
  keys, Brisk's portable MLX path, and fp32 SDPA on the unquantized cache for scale;
- end-to-end decode tok/s of the real model with an unquantized and an int4 cache of that
  length (filled with random K/V: decode cost does not depend on the values);
- KV bytes of both caches, measured and by formula;
- peak memory of a real prefill with each cache mode.
Variants are interleaved round by round; medians.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

from brisk.bench.common import attention_shape, interleave, median, print_table


def _timed(fn) -> float:
    import mlx.core as mx

    start = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - start


def attention_step_times(n_q: int, n_kv: int, head_dim: int, context: int, *, runs: int, group_size: int) -> dict:
    import mlx.core as mx

    from brisk.engine.kv.packed_cache import MLX_LM_QUANTIZED_SDPA
    from brisk.kernels.kv_attention import kv_attention
    from brisk.kernels.packed_kv import ChannelPacked, TokenPacked

    bits, scale = 4, head_dim**-0.5
    q = mx.random.normal((1, n_q, 1, head_dim))
    k = mx.random.normal((1, n_kv, context, head_dim))
    v = mx.random.normal((1, n_kv, context, head_dim))
    packed = context - 32  # what a decode step reads packed; the newest 32 keys dense
    keys = ChannelPacked.pack(k[:, :, :packed], bits=bits, recent=k[:, :, packed:].astype(mx.float16))
    token_keys = TokenPacked.pack(k, bits=bits, group=group_size)
    values = TokenPacked.pack(v, bits=bits, group=group_size)
    qk, qv = (mx.quantize(x, group_size=group_size, bits=bits) for x in (k, v))  # mlx-lm's own layout
    mx.eval(q, k, v, keys, token_keys, values, qk, qv)
    q_args = dict(group_size=group_size, bits=bits)

    def dequant_then_attend():
        return mx.fast.scaled_dot_product_attention(q, keys.dequantize(), values.dequantize(), scale=scale)

    variants: dict[str, Callable[[], float]] = {
        "dequant_then_attend": lambda: _timed(dequant_then_attend),
        # mlx-lm scales its queries argument in place: hand it a copy
        "mlx_lm_quantized": lambda: _timed(lambda: MLX_LM_QUANTIZED_SDPA(q * 1, qk, qv, scale, None, **q_args)),
        "brisk_packed": lambda: _timed(lambda: kv_attention(q, keys, values, scale=scale)),
        "brisk_token_keys": lambda: _timed(lambda: kv_attention(q, token_keys, values, scale=scale)),
        "brisk_portable": lambda: _timed(lambda: kv_attention(q, keys, values, scale=scale, native=False)),
        "fp32_unquantized": lambda: _timed(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)),
    }
    for fn in variants.values():
        fn()  # warm-up
    rows = interleave(runs, {name: _as_row("s", fn) for name, fn in variants.items()})
    return {name: median(r, "s") for name, r in rows.items()}


def _as_row(key: str, measure: Callable[[], float]) -> Callable[[], dict]:
    """A measurement as interleave() takes it: a function returning one result row."""
    return lambda: {key: measure()}


def _filled_cache(lm, context: int, bits: int, group_size: int):
    import mlx.core as mx
    from mlx_lm.models.cache import trim_prompt_cache

    from brisk.engine.kv.half import DENSE_CACHES, make_layers
    from brisk.engine.kv.packed_cache import maybe_quantize_kv_cache

    shape = attention_shape(lm.config)
    cache = make_layers(lm.model)  # the app's cache: unpacked layers store float16
    for layer in cache:
        n = context if type(layer) in DENSE_CACHES else min(context, getattr(layer, "max_size", context))
        keys = mx.random.normal((1, shape["kv_heads"], n, shape["head_dim"]))
        layer.update_and_fetch(keys, mx.random.normal(keys.shape))
    maybe_quantize_kv_cache(cache, k_bits=bits, v_bits=bits, group_size=group_size, start=0)
    lm.model(mx.array([[lm.tokenizer.encode("the")[-1]]]), cache=cache)  # a decode step packs what it reads
    trim_prompt_cache(cache, 1)
    mx.eval([c.state for c in cache])
    return cache


def decode_tps(lm, cache, steps: int) -> float:
    import mlx.core as mx
    from mlx_lm.models.cache import trim_prompt_cache

    token = mx.array([[lm.tokenizer.encode("the")[-1]]])
    mx.eval(lm.model(token, cache=cache))  # warm the shapes
    start = time.perf_counter()
    for _ in range(steps):
        logits = lm.model(token, cache=cache)
        mx.eval(logits)
    elapsed = time.perf_counter() - start
    trim_prompt_cache(cache, steps + 1)  # back to `context` tokens for the next round
    return steps / elapsed


def prefill_peak_memory(lm, tokens: int, bits: int, group_size: int) -> dict:
    from brisk.bench.common import filler_text
    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings

    settings = ChatSettings(model=lm.id, temperature=0.0, max_tokens=1, kv_bits=bits, kv_group_size=group_size)
    for event in Session(lm, settings).send(filler_text(lm.tokenizer, tokens)):
        if isinstance(event, TurnFinished):
            m = event.metrics
            return {"peak_memory_bytes": m.peak_memory_bytes, "kv_bytes": m.kv_bytes, "ttft_s": m.ttft_s}
    raise RuntimeError("prefill did not finish")


def run_kv(
    model_id: str, contexts: list[int], *, runs: int, steps: int, group_size: int, prefill_tokens: int, as_json: bool
) -> dict:
    import mlx.core as mx

    from brisk.engine.api.metrics import kv_bytes_formula, kv_bytes_measured
    from brisk.engine.kv.packed_cache import check_kv_packable
    from brisk.engine.models.loader import load_model
    from brisk.kernels import ctypes_library

    lm = load_model(model_id)
    check_kv_packable(lm.config, v_bits=4, group_size=group_size)
    shape = attention_shape(lm.config)
    n_q = (lm.config.get("text_config") or lm.config)["num_attention_heads"]
    payload: dict[str, Any] = {
        "model": model_id,
        "group_size": group_size,
        "runs": runs,
        "decode_steps": steps,
        "attention_scale": shape["head_dim"] ** -0.5,
        "brisk_path": "native CPU kernel"
        if ctypes_library.load()
        else f"portable MLX ({ctypes_library.unavailable_reason()})",
        "contexts": [],
    }
    rows = []
    for context in contexts:
        attn = attention_step_times(
            n_q, shape["kv_heads"], shape["head_dim"], context, runs=runs, group_size=group_size
        )
        caches = {16: _filled_cache(lm, context, 16, group_size), 4: _filled_cache(lm, context, 4, group_size)}
        tps = interleave(
            runs, {str(bits): _as_row("tps", partial(decode_tps, lm, c, steps)) for bits, c in caches.items()}
        )
        sizes = {bits: (kv_bytes_measured(c), kv_bytes_formula(c, **shape, itemsize=4)) for bits, c in caches.items()}
        entry = {
            "context": context,
            "attention_step_s": attn,
            "brisk_vs_mlx_lm": attn["mlx_lm_quantized"] / attn["brisk_packed"],
            "brisk_vs_dequant": attn["dequant_then_attend"] / attn["brisk_packed"],
            "channel_vs_token_keys": attn["brisk_token_keys"] / attn["brisk_packed"],
            "decode_tps_16": median(tps["16"], "tps"),
            "decode_tps_4": median(tps["4"], "tps"),
            "kv_bytes_16": sizes[16][0],
            "kv_bytes_4": sizes[4][0],
            "kv_formula_matches": all(measured == formula for measured, formula in sizes.values()),
        }
        entry["kv_ratio_4_vs_16"] = entry["kv_bytes_4"] / entry["kv_bytes_16"]
        payload["contexts"].append(entry)
        del caches
        mx.clear_cache()
        rows.append(
            [
                context,
                attn["dequant_then_attend"] * 1e3,
                attn["mlx_lm_quantized"] * 1e3,
                attn["brisk_packed"] * 1e3,
                attn["brisk_token_keys"] * 1e3,
                attn["brisk_portable"] * 1e3,
                attn["fp32_unquantized"] * 1e3,
                entry["brisk_vs_mlx_lm"],
                entry["brisk_vs_dequant"],
                entry["decode_tps_16"],
                entry["decode_tps_4"],
                entry["kv_bytes_16"] / 2**20,
                entry["kv_bytes_4"] / 2**20,
                entry["kv_ratio_4_vs_16"],
            ]
        )
    if prefill_tokens:
        payload["prefill_peak"] = {bits: prefill_peak_memory(lm, prefill_tokens, bits, group_size) for bits in (16, 4)}
    print_table(
        f"brisk bench kv: {model_id}, int4 (keys per channel, values per token, group {group_size}), "
        f"medians of {runs} interleaved rounds (attention ms per layer per decode step); "
        f"brisk path: {payload['brisk_path']}",
        [
            "context",
            "deq+attn ms",
            "mlx-lm q ms",
            "brisk ms",
            "token-K ms",
            "portable ms",
            "fp32 ms",
            "vs mlx-lm",
            "vs deq",
            "tok/s kv16",
            "tok/s kv4",
            "KV16 MiB",
            "KV4 MiB",
            "4/16",
        ],
        rows,
        payload,
        as_json,
    )
    if not as_json and prefill_tokens:
        for bits, p in payload["prefill_peak"].items():
            print(
                f"prefill of {prefill_tokens} tokens, kv {bits}: peak {p['peak_memory_bytes'] / 2**20:.0f} MiB, "
                f"KV {p['kv_bytes'] / 2**20:.1f} MiB, ttft {p['ttft_s']:.1f} s"
            )
    return payload
