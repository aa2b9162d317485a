"""`brisk bench overhead`: Brisk's run path vs bare mlx-lm `stream_generate`.

Same model object (Brisk's native layers in both), same prompt tokens, same prefill chunk
size, greedy, no speculation; A and B runs interleaved, medians reported. Goal: TTFT within
3% of 1.0 (Brisk adds no overhead); decode above 1.0 where Brisk's compiled step runs
(engine/decode/compiled.py), within 3% where it does not.
"""

from __future__ import annotations

import time
from typing import Any

from brisk.bench.common import filler_text, interleave, median, paired_ratio, print_table, token_clock


def _brisk_run(lm, text: str, max_tokens: int, step: int) -> dict:
    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings

    # no speculation: lookup decoding would quote the prompt and measure itself, not the path
    settings = ChatSettings(
        model=lm.id, temperature=0.0, max_tokens=max_tokens, prefill_step_size=step, spec_decode="off"
    )
    session = Session(lm, settings)
    for event in session.send(text):
        if isinstance(event, TurnFinished):
            m = event.metrics
            return {
                "ttft_s": m.ttft_s,
                "decode_tps": m.decode_tps,
                "tokens": m.generated_tokens,
                "spec_decode": m.spec_decode,
                "decode_step": m.decode_step,
            }
    raise RuntimeError("turn did not finish")


def _mlx_lm_run(lm, tokens: list[int], max_tokens: int, step: int) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    start = time.perf_counter()
    first, last, n = token_clock(
        stream_generate(lm.model, lm.tokenizer, tokens, max_tokens=max_tokens, prefill_step_size=step)
    )
    mx.clear_cache()
    return {"ttft_s": first - start, "decode_tps": (n - 1) / max(last - first, 1e-9), "tokens": n}


def run_overhead(
    model_id: str, prompt_tokens: list[int], *, runs: int, gen_tokens: int, step: int, as_json: bool
) -> dict:
    from brisk.engine.api.conversation import Message
    from brisk.engine.models.loader import load_model
    from brisk.engine.turn.prompt import encode_messages

    lm = load_model(model_id)
    rows = []
    payload: dict[str, Any] = {
        "model": model_id,
        "runs": runs,
        "gen_tokens": gen_tokens,
        "prefill_step": step,
        "lengths": [],
    }
    for n in prompt_tokens:
        text = filler_text(lm.tokenizer, n) + "\nRepeat the first sentence above."
        tokens = encode_messages(lm, [Message("user", text)])
        _brisk_run(lm, text, 2, step)  # warm-up both paths (kernels, allocator)
        _mlx_lm_run(lm, tokens, 2, step)
        res = interleave(
            runs,
            {
                "brisk": lambda: _brisk_run(lm, text, gen_tokens, step),
                "mlx_lm": lambda: _mlx_lm_run(lm, tokens, gen_tokens, step),
            },
        )
        b, m = res["brisk"], res["mlx_lm"]
        entry = {
            "prompt_tokens": len(tokens),
            "brisk_ttft_s": median(b, "ttft_s"),
            "mlx_lm_ttft_s": median(m, "ttft_s"),
            "brisk_decode_tps": median(b, "decode_tps"),
            "mlx_lm_decode_tps": median(m, "decode_tps"),
            "generated": [r["tokens"] for r in b],
        }
        entry["ttft_ratio"] = paired_ratio(b, m, "ttft_s")
        entry["decode_ratio"] = paired_ratio(b, m, "decode_tps")
        payload["lengths"].append(entry)
        rows.append(
            [
                len(tokens),
                entry["brisk_ttft_s"],
                entry["mlx_lm_ttft_s"],
                entry["ttft_ratio"],
                entry["brisk_decode_tps"],
                entry["mlx_lm_decode_tps"],
                entry["decode_ratio"],
            ]
        )
        entry["time_split"] = _time_split(lm, len(tokens), step, entry)
    print_table(
        f"brisk bench overhead: {model_id}, {runs} interleaved runs, medians "
        "(ratio = median of per-round brisk / mlx-lm)",
        ["prompt", "ttft brisk s", "ttft mlx-lm s", "ttft ratio", "decode brisk", "decode mlx-lm", "decode ratio"],
        rows,
        payload,
        as_json,
    )
    if not as_json:
        for entry in payload["lengths"]:
            _print_split(entry)
    return payload


def _time_split(lm, n: int, step: int, entry: dict) -> dict | None:
    from brisk.bench.profile import profile_time

    parts = profile_time(lm, n, step)
    if parts is None:
        return None
    parts["prefill"]["measured_total"] = entry["brisk_ttft_s"]
    parts["decode"]["measured_total"] = 1 / entry["brisk_decode_tps"]
    return parts


def _print_split(entry: dict) -> None:
    split = entry.get("time_split")
    if not split:
        return
    print(f"\nwhere the time goes at {entry['prompt_tokens']} tokens (components timed alone x layers)")
    for phase, unit, factor in (("prefill", "s", 1.0), ("decode", "ms/token", 1000.0)):
        print("  " + split_line(phase, unit, factor, split[phase]))


def split_line(phase: str, unit: str, factor: float, parts: dict) -> str:
    """The pieces' shares of their own sum, and how their sum compares with the measured
    time. Isolated pieces miss work (norms, RoPE, cache writes) but each also pays its own
    dispatch and thread wake-up, so the sum can exceed the measured time: a remainder
    would then be negative, which is why none is printed."""
    total = parts["measured_total"]
    named = {k: v for k, v in parts.items() if k != "measured_total"}
    pieces = sum(named.values())
    row = ", ".join(f"{k} {v * factor:.3g} ({100 * v / pieces:.0f}%)" for k, v in named.items())
    return (
        f"{phase}: measured {total * factor:.3g} {unit}; pieces timed alone: {row}; "
        f"they sum to {100 * pieces / total:.0f}% of the measured time"
    )
