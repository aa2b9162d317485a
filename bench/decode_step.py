"""`brisk bench decode-step`: plain decoding with the compiled step vs mlx-lm's generate_step.

The same chat turn through Session (greedy, no speculation), both variants interleaved
round by round; decode tok/s and TTFT medians, the paired ratio, and whether the two
answers were the same tokens (they must be: engine/decode/compiled.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

from brisk.bench.common import filler_text, interleave, median, paired_ratio, print_table


def _turn(lm, text: str, max_tokens: int, *, compiled: bool) -> dict:
    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.decode.compiled import generate_step_only

    settings = ChatSettings(model=lm.id, temperature=0.0, max_tokens=max_tokens, spec_decode="off", lookup=False)
    session = Session(lm, settings)
    with nullcontext() if compiled else generate_step_only():
        for event in session.send(text):
            if isinstance(event, TurnFinished):
                m = event.metrics
                return {
                    "decode_tps": m.decode_tps,
                    "ttft_s": m.ttft_s,
                    "step": m.decode_step,
                    "tokens": event.token_ids,
                }
    raise RuntimeError("the turn did not finish")


def run_decode_step(model_id: str, prompt_tokens: list[int], *, runs: int, gen_tokens: int, as_json: bool) -> dict:
    from brisk.engine.models.loader import load_model

    lm = load_model(model_id)
    payload: dict = {"model": model_id, "runs": runs, "gen_tokens": gen_tokens, "lengths": []}
    table = []
    for n in prompt_tokens:
        text = filler_text(lm.tokenizer, n) + "\nWrite a long story about the committee."
        variants: dict[str, Callable[[], dict]] = {
            "compiled": lambda: _turn(lm, text, gen_tokens, compiled=True),
            "generate_step": lambda: _turn(lm, text, gen_tokens, compiled=False),
        }
        for run in variants.values():
            run()  # warm-up: kernels built, weights faulted in
        res = interleave(runs, variants)
        a, b = res["compiled"], res["generate_step"]
        entry = {
            "prompt_tokens": n,
            "compiled_decode_tps": median(a, "decode_tps"),
            "generate_step_decode_tps": median(b, "decode_tps"),
            "decode_ratio": paired_ratio(a, b, "decode_tps"),
            "ttft_ratio": paired_ratio(a, b, "ttft_s"),
            "generated": [len(r["tokens"]) for r in a],
            "same_tokens": all(x["tokens"] == y["tokens"] for x, y in zip(a, b)),
            "steps": sorted({r["step"] for r in a + b}),
        }
        payload["lengths"].append(entry)
        table.append(
            [
                n,
                entry["compiled_decode_tps"],
                entry["generate_step_decode_tps"],
                entry["decode_ratio"],
                entry["ttft_ratio"],
                "yes" if entry["same_tokens"] else "NO",
            ]
        )
    print_table(
        f"brisk bench decode-step: {model_id}, {runs} interleaved rounds, {gen_tokens} tokens, medians "
        "(ratios: median of per-round compiled / generate_step)",
        ["prompt", "compiled tok/s", "generate_step tok/s", "decode ratio", "ttft ratio", "same tokens"],
        table,
        payload,
        as_json,
    )
    return payload
