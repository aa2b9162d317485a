"""`brisk bench specprefill` and `brisk bench needle`.

specprefill: cold TTFT of a long prompt with full prefill vs SpecPrefill at several keep
fractions, interleaved round by round, medians. r = draft scoring time / target full
prefill time; the ideal speedup is 1/(r + k); G = ideal / measured (1.0 = no overhead
beyond the draft and the kept tokens; the paper's best is 1.1).

needle: a fact hidden at several depths of a filler document; the target must retrieve
it with full prefill and with sparse prefill.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any, Callable

from brisk.bench.common import filler_text, interleave, median, print_table
from brisk.engine.api.literal_types import AccelMode
from brisk.engine.runtime.mx_values import item_float

QUESTION = "\n\nIn one sentence, what did the committee discuss?"


def _ttft(target, draft, text: str, *, mode: AccelMode, keep: float) -> dict:
    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings

    settings = ChatSettings(
        model=target.id,
        temperature=0.0,
        max_tokens=1,
        sparse_prefill=mode,
        sparse_keep=keep,
        spec_decode="off",
        draft=draft.id if draft else None,
    )
    for event in Session(target, settings, draft=draft).send(text):
        if isinstance(event, TurnFinished):
            m = event.metrics
            return {
                "ttft_s": m.ttft_s,
                "scoring_s": m.scoring_s,
                "kept": m.kept_tokens,
                "prompt": m.prompt_tokens,
                "note": m.sparse_prefill,
            }
    raise RuntimeError("turn did not finish")


def run_specprefill(
    target_id: str, draft_id: str, lengths: list[int], keeps: list[float], *, runs: int, as_json: bool
) -> dict:
    from brisk.engine.models.loader import load_model

    target, draft = load_model(target_id), load_model(draft_id)
    payload: dict[str, Any] = {"target": target_id, "draft": draft_id, "runs": runs, "rows": []}
    rows = []
    _ttft(target, draft, filler_text(target.tokenizer, 256) + QUESTION, mode="on", keep=0.2)  # warm-up
    for n in lengths:
        text = filler_text(target.tokenizer, n) + QUESTION
        variants: dict[str, Callable[[], dict]] = {"full": lambda: _ttft(target, None, text, mode="off", keep=1.0)}
        for k in keeps:
            variants[f"keep {k}"] = partial(_ttft, target, draft, text, mode="on", keep=k)
        res = interleave(runs, variants)
        full = median(res["full"], "ttft_s")
        for k in keeps:
            sparse = res[f"keep {k}"]
            ttft, scoring = median(sparse, "ttft_s"), median(sparse, "scoring_s")
            r = scoring / full
            speedup = full / ttft
            bound = 1 / (r + k)
            entry = {
                "prompt_tokens": res["full"][0]["prompt"],
                "keep": k,
                "kept_tokens": sparse[0]["kept"],
                "full_ttft_s": full,
                "sparse_ttft_s": ttft,
                "scoring_s": scoring,
                "r": r,
                "speedup": speedup,
                "bound": bound,
                "G": bound / speedup,
                "note": sparse[0]["note"],
            }
            payload["rows"].append(entry)
            rows.append(
                [entry["prompt_tokens"], k, entry["kept_tokens"], full, ttft, scoring, r, speedup, bound, entry["G"]]
            )
    print_table(
        f"brisk bench specprefill: target {target_id}, draft {draft_id}, medians of {runs}",
        ["prompt", "keep", "kept", "full ttft s", "sparse ttft s", "scoring s", "r", "speedup", "1/(r+k)", "G"],
        rows,
        payload,
        as_json,
    )
    return payload


NEEDLE = "The secret passcode of the {name} vault is {code}."
ASK = "\n\nWhat is the secret passcode of the {name} vault? Answer with the number only."


def run_needle(
    target_id: str,
    draft_id: str,
    tokens: int,
    depths: list[float],
    keep: float,
    *,
    as_json: bool,
    k_bits: int = 16,
    v_bits: int = 16,
) -> dict:
    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.models.loader import load_model

    target, draft = load_model(target_id), load_model(draft_id)
    filler = filler_text(target.tokenizer, tokens)
    payload: dict[str, Any] = {
        "target": target_id,
        "draft": draft_id,
        "tokens": tokens,
        "keep": keep,
        "k_bits": k_bits,
        "v_bits": v_bits,
        "rows": [],
    }
    rows = []
    for i, depth in enumerate(depths):
        name, code = ["Aurora", "Basalt", "Cedar", "Delta", "Ember"][i % 5], str(48213 + 1111 * i)
        cut = filler.rfind(". ", 0, int(len(filler) * depth)) + 2
        text = filler[:cut] + NEEDLE.format(name=name, code=code) + " " + filler[cut:] + ASK.format(name=name)
        result: dict[str, Any] = {"depth": depth}
        for mode in ("off", "on"):
            settings = ChatSettings(
                model=target_id,
                temperature=0.0,
                max_tokens=16,
                sparse_prefill=mode,
                sparse_keep=keep,
                draft=draft_id,
                k_bits=k_bits,
                v_bits=v_bits,
            )
            for event in Session(target, settings, draft=draft).send(text):
                if isinstance(event, TurnFinished):
                    result[mode] = {
                        "answer": event.text.strip(),
                        "found": code in event.text,
                        "kept": event.metrics.kept_tokens,
                        "ttft_s": event.metrics.ttft_s,
                    }
        payload["rows"].append(result)
        rows.append(
            [
                depth,
                result["off"]["found"],
                result["on"]["found"],
                result["on"]["kept"],
                result["off"]["ttft_s"],
                result["on"]["ttft_s"],
                result["on"]["answer"][:24],
            ]
        )
    print_table(
        f"brisk bench needle: {target_id} (draft {draft_id}), ~{tokens}-token document, keep {keep}, "
        f"KV K{k_bits}/V{v_bits}",
        ["depth", "full found", "sparse found", "kept", "full ttft s", "sparse ttft s", "sparse answer"],
        rows,
        payload,
        as_json,
    )
    return payload


def _continuation_nll(model, cache, last: int, continuation: list[int], shift: int) -> float:
    """Mean negative log-likelihood of `continuation` after the cached context."""
    import mlx.core as mx

    from brisk.engine.accel.positions import position_shift

    with position_shift(model, shift):
        logits = model(mx.array([last] + continuation[:-1])[None], cache=cache)[0]  # (C, V)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(logp, mx.array(continuation)[:, None], axis=-1).mean()
    return item_float(nll)


def cut_offsets(text_tokens: int, context: int, continuation: int, cuts: int) -> list[int]:
    """Where each of `cuts` windows (a context, then its continuation) starts in a text of
    `text_tokens`: spread evenly from the start to the last place a whole window fits."""
    room = text_tokens - context - continuation
    if room < 0:
        return []
    if cuts == 1:
        return [0]
    return sorted({round(j * room / (cuts - 1)) for j in range(cuts)})


def read_texts(text_files: list[str]) -> dict[str, str]:
    """Each text file once, by its name (its path where two share a name); a missing, binary
    or non-UTF-8 file is a BriskError naming it."""
    from pathlib import Path

    from brisk.engine.turn.text_input import read_text_file

    files = list({Path(f).resolve(): f for f in text_files}.values())  # the same file given twice: once
    names = [Path(f).name for f in files]
    return {name if names.count(name) == 1 else f: read_text_file(f, what="Text file") for name, f in zip(names, files)}


def run_perplexity(
    target_id: str,
    draft_id: str,
    text_files: list[str],
    lengths: list[int],
    keep: float,
    *,
    continuation: int,
    cuts: int = 1,
    as_json: bool,
) -> dict:
    """Perplexity of the next `continuation` tokens of real texts after full vs sparse
    prefill of the preceding context (the paper: mean ratio 1.14 at keep 0.2).

    One continuation moves the ratio a lot (the same text gave 1.47 at 6K and 1.01 at 8K),
    so each text can be cut in `cuts` places, and the table ends with the geometric mean
    of the ratios per context length."""
    import math

    from brisk.engine.accel.specprefill.scoring import (
        DraftScorer,
        SparsePrefillDeclined,
        select_chunks,
        sparse_prefill,
    )
    from brisk.engine.api.errors import BriskError
    from brisk.engine.kv.half import make_layers
    from brisk.engine.models.loader import load_model
    from brisk.engine.turn.dense_prefill import prefill_chunks

    texts = read_texts(text_files)
    lengths = list(dict.fromkeys(lengths))  # a context given twice would count its windows twice
    target, draft = load_model(target_id), load_model(draft_id)
    same = draft.info.tokenizer_fingerprint == target.info.tokenizer_fingerprint
    if max(lengths) + continuation > target.context_length:  # past it the target reads garbage positions
        raise BriskError(
            f"{target_id} holds {target.context_length} tokens; a {max(lengths)}-token context and "
            f"{continuation} more do not fit; try a shorter --context or --continuation"
        )
    if same and max(lengths) > draft.context_length:
        raise BriskError(
            f"{draft_id} holds {draft.context_length} tokens, too few to score a {max(lengths)}-token context"
        )
    encoded = {name: target.tokenizer.encode(text) for name, text in texts.items()}
    for name, ids in encoded.items():  # every text checked before the first window is read
        for n in lengths:
            if not cut_offsets(len(ids), n, continuation, cuts):
                raise BriskError(
                    f"{name} has {len(ids)} tokens, too few for a {n}-token context and {continuation} more"
                )
    payload: dict[str, Any] = {
        "target": target_id,
        "draft": draft_id,
        "keep": keep,
        "texts": list(texts),
        "cuts": cuts,
        "rows": [],
        "geomean": {},
    }
    rows = []
    for name, ids in encoded.items():
        for n in lengths:
            for at in cut_offsets(len(ids), n, continuation, cuts):
                context, cont = ids[at : at + n], ids[at + n : at + n + continuation]
                cache = make_layers(target.model)
                list(prefill_chunks(target.model, cache, context[:-1], 512))
                full = math.exp(_continuation_nll(target.model, cache, context[-1], cont, 0))
                scorer = DraftScorer(draft)
                try:
                    importance = (
                        scorer.importance(context, 0, 512)
                        if same
                        else scorer.importance_across(target.tokenizer, context, 0, 512)
                    )
                except SparsePrefillDeclined as exc:  # e.g. the draft's own tokens outgrow its context
                    raise BriskError(
                        f"{draft_id} cannot score a {n}-token context: {exc}; try a shorter --context"
                    ) from exc
                selection = select_chunks(importance, keep=keep)
                runs = [(s, min(e, n - 1)) for s, e in selection.runs if s < n - 1]
                cache = make_layers(target.model)
                list(sparse_prefill(target.model, cache, context, runs, base=0, step=512))
                shift = n - 1 - next(c.offset for c in cache if hasattr(c, "offset"))
                sparse = math.exp(_continuation_nll(target.model, cache, context[-1], cont, shift))
                entry = {
                    "text": name,
                    "at": at,
                    "context": n,
                    "kept": selection.kept,
                    "ppl_full": full,
                    "ppl_sparse": sparse,
                    "ratio": sparse / full,
                }
                payload["rows"].append(entry)
                rows.append([name, at, n, selection.kept, full, sparse, sparse / full])
                # a run of many windows takes an hour on a CPU: each one said as it ends
                print(f"  {name} at token {at}, {n} tokens: ratio {sparse / full:.3f}", file=sys.stderr, flush=True)
    for n in lengths:
        ratios = [r["ratio"] for r in payload["rows"] if r["context"] == n]
        mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        payload["geomean"][str(n)] = mean
        rows.append([f"geometric mean of {len(ratios)}", "", n, "", "", "", mean])
    print_table(
        f"brisk bench sparse-ppl: {target_id} (draft {draft_id}), keep {keep}, next {continuation} tokens",
        ["text", "at token", "context", "kept", "ppl full", "ppl sparse", "ratio"],
        rows,
        payload,
        as_json,
    )
    return payload
