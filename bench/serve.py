"""`brisk bench serve`: what the HTTP API costs over running the engine in process.

One model, loaded once and shared by both paths. At one client, requests alternate
between `Session.answer` in process and a streaming chat completion through a local
`brisk serve` (the official openai client on loopback), each with its own prompt so no
prompt cache is reused; medians of latency, TTFT and decode tok/s, and the overhead
ratio. With more clients, that many threads send requests at once: latency percentiles
and total tokens/s, with the queue taking them one at a time.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from brisk.bench.common import interleave, paired_ratio, print_table
from brisk.engine.api.conversation import Message
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings

PROMPT = "Request {i}: in two sentences, why do rivers meander across flat plains?"


def _in_process(lm, settings: ChatSettings, i: int) -> dict:
    start = time.perf_counter()
    finished = list(Session(lm, settings).answer([Message("user", PROMPT.format(i=i))]))[-1]
    if not isinstance(finished, TurnFinished):
        raise RuntimeError(f"the turn ended with {finished!r}")
    m = finished.metrics
    return {"latency_s": time.perf_counter() - start, "ttft_s": m.ttft_s, "tokens": m.generated_tokens}


def _over_http(client, settings: ChatSettings, i: int) -> dict:
    start = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model=settings.model,
        messages=[{"role": "user", "content": PROMPT.format(i=i)}],
        stream=True,
        max_tokens=settings.max_tokens,
        temperature=0,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return {"latency_s": time.perf_counter() - start, "ttft_s": first or 0.0, "tokens": tokens}


def _decode_tps(row: dict) -> float:
    return (row["tokens"] - 1) / max(row["latency_s"] - row["ttft_s"], 1e-9)


def _summary(rows: list[dict]) -> dict:
    latencies = sorted(r["latency_s"] for r in rows)

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    return {
        "requests": len(rows),
        "p50_s": statistics.median(latencies),
        "p90_s": pct(0.9),
        "p99_s": pct(0.99),
        "ttft_s": statistics.median(r["ttft_s"] for r in rows),
        "decode_tps": statistics.median(_decode_tps(r) for r in rows),
    }


def run_serve_bench(model_id: str, *, clients: list[int], requests: int, gen_tokens: int, as_json: bool) -> dict:
    import openai

    from brisk.engine.host.serve.app import Server
    from brisk.engine.host.serve.local import LocalServer
    from brisk.engine.host.serve.scheduler import EngineQueue
    from brisk.engine.host.worker import EngineWorker
    from brisk.engine.models.loader import load_model

    lm = load_model(model_id)
    settings = ChatSettings(model=model_id, max_tokens=gen_tokens, temperature=0.0).validate()
    queue = EngineQueue(EngineWorker(load=lambda _: lm))
    local = LocalServer(Server(queue, default_model=model_id).app())
    client = openai.OpenAI(base_url=f"{local.url}/v1", api_key="bench", max_retries=0)
    report: dict = {"model": model_id, "gen_tokens": gen_tokens, "requests": requests}
    try:
        _in_process(lm, settings, -1), _over_http(client, settings, -2)  # warm both paths
        counter = iter(range(10**9))
        runs = interleave(
            requests,
            {
                "in_process": lambda: _in_process(lm, settings, next(counter)),
                "http": lambda: _over_http(client, settings, next(counter)),
            },
        )
        one: dict[str, Any] = {name: _summary(rows) for name, rows in runs.items()}
        # each round ran both paths back to back: the median of per-round ratios
        one["overhead"] = paired_ratio(runs["http"], runs["in_process"], "latency_s") - 1
        report["one_client"] = one
        report["concurrent"] = {}
        for n in (c for c in clients if c > 1):
            report["concurrent"][n] = _concurrent(client, settings, n, requests, counter)
    finally:
        local.stop()
        queue.close()
    _print(report, as_json)
    return report


def _concurrent(client, settings, n: int, requests: int, counter) -> dict:
    rows: list[dict] = []
    lock = threading.Lock()

    def worker():
        for _ in range(max(1, requests // n)):
            with lock:
                i = next(counter)
            row = _over_http(client, settings, i)
            with lock:
                rows.append(row)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {**_summary(rows), "total_tps": sum(r["tokens"] for r in rows) / wall}


def _print(report: dict, as_json: bool) -> None:
    rows = [
        [name, r["requests"], r["p50_s"], r["p90_s"], r["p99_s"], r["ttft_s"], r["decode_tps"]]
        for name, r in (
            ("in process", report["one_client"]["in_process"]),
            ("HTTP, 1 client", report["one_client"]["http"]),
        )
    ]
    rows += [
        [f"HTTP, {n} clients", r["requests"], r["p50_s"], r["p90_s"], r["p99_s"], r["ttft_s"], r["total_tps"]]
        for n, r in report["concurrent"].items()
    ]
    print_table(
        f"{report['model']}: {report['gen_tokens']} tokens per request (last column: decode tok/s; "
        "with several clients, total tok/s)",
        ["path", "requests", "p50 s", "p90 s", "p99 s", "TTFT s", "tok/s"],
        rows,
        report,
        as_json,
    )
    if not as_json:
        print(f"HTTP overhead at one client (median of paired latency ratios): {report['one_client']['overhead']:+.1%}")
