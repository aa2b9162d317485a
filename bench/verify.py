"""`brisk bench verify`: what a speculative verify pass costs, in plain decode steps.

After a prompt of `--context` tokens is cached, one forward pass over R rows (R = k+1 for
k drafted tokens) is timed with the few-row native matmul (kernels/skinny_matmul.py) and
with MLX's BLAS path, interleaved, and divided by a one-row step (plain decoding) timed
in the same round. Drafting k tokens pays only if the verify pass plus k draft steps costs
less than the tokens it yields: this is the cost side of that equation.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

from brisk.bench.common import interleave, median, paired_ratio, print_table, with_blas_verify


def _step(model, cache, rows: int, base: int) -> dict:
    import mlx.core as mx

    ids = mx.array([[(base + 7 * i) % 1000 + 10 for i in range(rows)]])
    started = time.perf_counter()
    mx.eval(model(ids, cache=cache))
    seconds = time.perf_counter() - started
    for layer in cache:
        layer.trim(rows)  # the cache is back at the prompt for the next variant
    return {"ms": seconds * 1e3}


def run_verify(model_id: str, rows_list: list[int], *, context: int, runs: int, as_json: bool) -> dict:
    import mlx.core as mx

    from brisk.bench.common import filler_text
    from brisk.engine.kv.half import make_layers
    from brisk.engine.models.loader import load_model

    lm = load_model(model_id)
    cache = make_layers(lm.model)
    prompt = lm.tokenizer.encode(filler_text(lm.tokenizer, context))
    for start in range(0, len(prompt), 512):
        lm.model(mx.array(prompt[start : start + 512])[None], cache=cache)
        mx.eval([c.state for c in cache])
    variants: dict[str, Callable[[], dict]] = {"1 row": lambda: _step(lm.model, cache, 1, 0)}
    for rows in rows_list:
        variants[f"{rows} native"] = partial(_step, lm.model, cache, rows, rows)
        variants[f"{rows} blas"] = with_blas_verify(partial(_step, lm.model, cache, rows, rows), lm.model)
    for run in variants.values():
        run()  # warm-up: first calls build the kernel and fault the weights in
    res = interleave(runs, variants)
    one = res["1 row"]
    payload: dict[str, Any] = {"model": model_id, "context": len(prompt), "runs": runs, "rows": []}
    table = []
    for rows in rows_list:
        native, blas = res[f"{rows} native"], res[f"{rows} blas"]
        entry = {
            "rows": rows,
            "native_ms": median(native, "ms"),
            "blas_ms": median(blas, "ms"),
            "one_row_ms": median(one, "ms"),
            "native_steps": paired_ratio(native, one, "ms"),
            "blas_steps": paired_ratio(blas, one, "ms"),
            "speedup": paired_ratio(blas, native, "ms"),
        }
        payload["rows"].append(entry)
        table.append(
            [
                rows,
                entry["one_row_ms"],
                entry["blas_ms"],
                entry["native_ms"],
                entry["blas_steps"],
                entry["native_steps"],
                entry["speedup"],
            ]
        )
    print_table(
        f"brisk bench verify: {model_id}, {len(prompt)} cached tokens, medians of {runs} interleaved rounds",
        ["rows", "1-row ms", "blas ms", "native ms", "blas in steps", "native in steps", "native speedup"],
        table,
        payload,
        as_json,
    )
    return payload
