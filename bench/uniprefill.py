"""`brisk bench uniprefill` and `brisk bench uniprefill-quality`.

uniprefill: cold TTFT of a long prompt, dense vs UniPrefill at several p, interleaved
round by round, medians; tokens kept per drop layer, the FLOP-based bound on the speedup
(1 / (1 - FLOPs saved)) beside the measured one, and peak memory.

uniprefill-quality, on the same model and p: a needle at several depths (found with dense
and with UniPrefill), the counting task's recall (bench/counting.py), and the
perplexity of a real text's continuation after dense vs UniPrefill prefill of what
precedes it.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

from brisk.bench.common import filler_text, interleave, median, print_table
from brisk.bench.specprefill import ASK, NEEDLE, QUESTION
from brisk.engine.runtime.mx_values import item_float


def _settings(model_id: str, p: float | None, **kw):
    from brisk.engine.api.settings import ChatSettings

    uni = {"uniprefill": "on", "uniprefill_p": p} if p is not None else {"uniprefill": "off"}
    return ChatSettings(model=model_id, temperature=0.0, spec_decode="off", **uni, **kw)


def _answer(lm, text: str, p: float | None, max_tokens: int, drop_layers=None):
    from brisk.engine.api.errors import BriskError
    from brisk.engine.api.events import EngineErrored, TurnFinished
    from brisk.engine.api.session import Session

    settings = _settings(lm.id, p, max_tokens=max_tokens, drop_layers=drop_layers)
    for event in Session(lm, settings).send(text):
        if isinstance(event, TurnFinished):
            return event
        if isinstance(event, EngineErrored):
            raise BriskError(event.message)
    raise BriskError("the turn did not finish")


def _ttft(lm, text: str, p: float | None, drop_layers) -> dict:
    m = _answer(lm, text, p, 1, drop_layers).metrics
    return {
        "ttft_s": m.ttft_s,
        "prompt": m.prompt_tokens,
        "drops": m.drops,
        "saved": m.flops_saved,
        "peak": m.peak_memory_bytes,
        "route": m.prefill_route,
    }


def _prompt(lm, n: int, text_file: str | None) -> str:
    """About `n` tokens of the bench's filler prose or of a real text, then the question
    (how much a drop layer keeps depends on the text: measure on the kind you care about)."""
    if not text_file:
        return filler_text(lm.tokenizer, n) + QUESTION
    from pathlib import Path

    ids = lm.tokenizer.encode(Path(text_file).read_text(encoding="utf-8"))
    if len(ids) < n:
        ids = ids * (n // max(len(ids), 1) + 1)  # a short text repeats to length
    return lm.tokenizer.decode(ids[:n]) + "\n\nIn one sentence, what is this text about?"


def run_uniprefill(
    model_id: str,
    lengths: list[int],
    ps: list[float],
    *,
    runs: int,
    drop_layers=None,
    text_file: str | None = None,
    as_json: bool,
) -> dict:
    from brisk.engine.models.loader import load_model

    lm = load_model(model_id)
    payload: dict[str, Any] = {"model": model_id, "runs": runs, "text": text_file or "filler", "rows": []}
    rows = []
    _ttft(lm, _prompt(lm, min(512, *lengths), text_file), ps[0], drop_layers)  # warm-up (kernels, caches)
    for n in lengths:
        text = _prompt(lm, n, text_file)
        variants: dict[str, Callable[[], dict]] = {"dense": lambda: _ttft(lm, text, None, drop_layers)}
        for p in ps:
            variants[f"p {p}"] = partial(_ttft, lm, text, p, drop_layers)
        res = interleave(runs, variants)
        dense = median(res["dense"], "ttft_s")
        for p in ps:
            mine = res[f"p {p}"]
            ttft, saved = median(mine, "ttft_s"), mine[0]["saved"]
            kept = " ".join(f"{k / max(n_in, 1):.2f}@{layer}" for layer, n_in, k in mine[0]["drops"])
            entry = {
                "prompt_tokens": mine[0]["prompt"],
                "p": p,
                "dense_ttft_s": dense,
                "uniprefill_ttft_s": ttft,
                "speedup": dense / ttft,
                "flops_saved": saved,
                "bound": 1 / max(1 - saved, 1e-9),
                "kept_per_drop": mine[0]["drops"],
                "dense_peak_gib": res["dense"][0]["peak"] / 2**30,
                "uniprefill_peak_gib": mine[0]["peak"] / 2**30,
                "route": mine[0]["route"],
            }
            payload["rows"].append(entry)
            rows.append(
                [
                    entry["prompt_tokens"],
                    p,
                    dense,
                    ttft,
                    entry["speedup"],
                    entry["bound"],
                    kept,
                    entry["dense_peak_gib"],
                    entry["uniprefill_peak_gib"],
                ]
            )
    print_table(
        f"brisk bench uniprefill: {model_id}, {text_file or 'filler prose'}, medians of {runs} (interleaved)",
        [
            "prompt",
            "p",
            "dense ttft s",
            "uni ttft s",
            "speedup",
            "FLOP bound",
            "kept share per drop layer",
            "dense peak GiB",
            "uni peak GiB",
        ],
        rows,
        payload,
        as_json,
    )
    return payload


def _continuation_ppl(lm, context: list[int], continuation: list[int], p: float | None, drop_layers) -> float:
    import mlx.core as mx

    from brisk.engine.accel.uniprefill.prefill import UniPrefill
    from brisk.engine.kv import PromptCache
    from brisk.engine.turn.dense_prefill import prefill_chunks

    cache = PromptCache(lm.model)
    cache.reuse(context)
    layers = cache.layers or []  # reuse() made them
    if p is None:
        list(prefill_chunks(lm.model, layers, context[:-1], 512))
    else:
        list(UniPrefill(lm.model, layers, drop_layers=drop_layers, p=p, step=512).run(context[:-1], base=0))
    cache.mark_sparse(context[:-1])
    logits = cache.model_view()(mx.array([context[-1]] + continuation[:-1])[None], cache=cache.layers)[0]
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(logp, mx.array(continuation)[:, None], axis=-1).mean()
    return math.exp(item_float(nll))


def run_uniprefill_quality(
    model_id: str,
    p: float,
    *,
    tokens: int,
    depths: list[float],
    text_file: str | None,
    contexts: list[int],
    continuation: int,
    entries: int,
    green: int,
    seeds: list[int],
    drop_layers=None,
    as_json: bool,
) -> dict:
    from pathlib import Path

    from brisk.bench.counting import counting_document, score_answer
    from brisk.engine.models.loader import load_model

    lm = load_model(model_id)
    payload: dict[str, Any] = {"model": model_id, "p": p, "needle": [], "counting": [], "ppl": []}
    rows = []
    filler = filler_text(lm.tokenizer, tokens)
    for i, depth in enumerate(depths):
        name, code = ["Aurora", "Basalt", "Cedar", "Delta", "Ember"][i % 5], str(48213 + 1111 * i)
        cut = filler.rfind(". ", 0, int(len(filler) * depth)) + 2
        text = filler[:cut] + NEEDLE.format(name=name, code=code) + " " + filler[cut:] + ASK.format(name=name)
        dense, uni = (_answer(lm, text, q, 16, drop_layers) for q in (None, p))
        entry = {
            "depth": depth,
            "dense_found": code in dense.text,
            "uni_found": code in uni.text,
            "kept": uni.metrics.drops,
            "uni_answer": uni.text.strip()[:40],
        }
        payload["needle"].append(entry)
        rows.append(
            ["needle", f"depth {depth}", entry["dense_found"], entry["uni_found"], _kept_text(uni.metrics.drops)]
        )
    for seed in seeds:
        text, cities = counting_document(entries, green, seed)
        dense, uni = (_answer(lm, text, q, 8 * green + 32, drop_layers) for q in (None, p))
        entry = {
            "seed": seed,
            "dense": score_answer(dense.text, cities),
            "uni": score_answer(uni.text, cities),
            "kept": uni.metrics.drops,
        }
        payload["counting"].append(entry)
        rows.append(
            [
                "counting",
                f"seed {seed}",
                f"recall {entry['dense']['recall']:.2f}",
                f"recall {entry['uni']['recall']:.2f}",
                _kept_text(uni.metrics.drops),
            ]
        )
    if payload["counting"]:
        dense_recall = sum(e["dense"]["recall"] for e in payload["counting"]) / len(payload["counting"])
        uni_recall = sum(e["uni"]["recall"] for e in payload["counting"]) / len(payload["counting"])
        payload["counting_recall_ratio"] = uni_recall / dense_recall if dense_recall else float("nan")
        rows.append(
            [
                "counting",
                "mean",
                f"recall {dense_recall:.2f}",
                f"recall {uni_recall:.2f}",
                f"ratio {payload['counting_recall_ratio']:.2f}",
            ]
        )
    if text_file:
        ids = lm.tokenizer.encode(Path(text_file).read_text(encoding="utf-8"))
        for n in contexts:
            context, cont = ids[:n], ids[n : n + continuation]
            full, sparse = (_continuation_ppl(lm, context, cont, q, drop_layers) for q in (None, p))
            payload["ppl"].append({"context": n, "ppl_dense": full, "ppl_uni": sparse, "ratio": sparse / full})
            rows.append(["ppl", f"context {n}", f"{full:.3f}", f"{sparse:.3f}", f"ratio {sparse / full:.3f}"])
    print_table(
        f"brisk bench uniprefill-quality: {model_id}, p {p}, needle in ~{tokens} tokens",
        ["task", "case", "dense", "uniprefill", "kept per drop layer / ratio"],
        rows,
        payload,
        as_json,
    )
    return payload


def _kept_text(drops: list) -> str:
    return " ".join(f"{k}/{n}@{layer}" for layer, n, k in drops) or "(dense)"
