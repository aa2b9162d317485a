"""Shared pieces of the benchmarks: interleaved A/B runs, medians, tables, prompts."""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable, Iterable

FILLER = (
    "The committee reviewed the quarterly report on regional water usage, noting that "
    "consumption in the northern districts rose while the southern reservoirs stayed full. "
    "Engineers proposed new pipes, auditors asked for clearer figures, and the mayor promised "
    "a public hearing before any budget was approved. "
)


def filler_text(tokenizer, n_tokens: int) -> str:
    """Plain prose of about `n_tokens` tokens for this tokenizer."""
    per = max(1, len(tokenizer.encode(FILLER)))
    text = FILLER * (n_tokens // per + 1)
    ids = tokenizer.encode(text)[:n_tokens]
    return tokenizer.decode(ids)


def attention_shape(config: dict) -> dict:
    """kv_heads and head_dim of a model the bench was told to run (refuses one without
    attention heads in its config, which a KV bench cannot measure)."""
    from brisk.engine.kv.packed_cache import kv_shape

    shape = kv_shape(config)
    if shape is None:
        raise ValueError("this model's config names no attention heads")
    return shape


def token_clock(stream: Iterable) -> tuple[float, float, int]:
    """When a token stream yielded its first and its last token (perf_counter), and how
    many it yielded; refuses a stream that yields none."""
    first = last = 0.0
    count = 0
    for _ in stream:
        last = time.perf_counter()
        first = first if count else last
        count += 1
    if not count:
        raise RuntimeError("the model produced no token")
    return first, last, count


def interleave(runs: int, variants: dict[str, Callable[[], dict]]) -> dict[str, list[dict]]:
    """Run each variant `runs` times, alternating the order every round (ABAB, BABA...)."""
    names = list(variants)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(runs):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            results[name].append(variants[name]())
    return results


def with_blas_verify(run: Callable[[], dict], *models) -> Callable[[], dict]:
    """The variant `run` with the models' few-row native matmul off: its A/B partner."""
    from brisk.kernels.native_layers import blas_only

    def variant() -> dict:
        with blas_only(*models):
            return run()

    return variant


def median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def paired_ratio(a_rows: list[dict], b_rows: list[dict], key: str) -> float:
    """Median of per-round ratios a/b: each round's A and B ran back to back, so slow
    drifts of a shared machine cancel out better than in a ratio of medians."""
    return statistics.median(a[key] / b[key] for a, b in zip(a_rows, b_rows))


def print_table(title: str, header: list[str], rows: list[list], payload: dict, as_json: bool) -> None:
    """A benchmark's table, headed by the machine's kernel plan (its CPU and the paths it ran)."""
    from brisk.kernels import plan

    lines = plan.current().describe()
    if as_json:
        print(json.dumps({**payload, "kernel_plan": lines}, indent=2))
        return
    print(f"{title}\n  kernel plan: {lines[0]}")
    widths = [max(len(str(h)), *(len(_fmt(r[i])) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(str(h).rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(_fmt(v).rjust(w) for v, w in zip(row, widths)))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)
