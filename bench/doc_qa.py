"""`brisk bench doc-qa`: questions about real documents, dense vs sparse prefill.

Documents and questions: bench/doc_corpus.py. Each question is asked with dense
prefill, SpecPrefill at each keep, UniPrefill at the model's p, and the router's `auto`
(engine/accel/quality_table.py: a sparse setting only where the table shows it keeps
answers, and dense where the turn's coverage says the question's own region was dropped).

Cost: the dense session keeps the document's prefix cached across a document's questions,
and SpecPrefill's draft keeps its own, so only a document's first question pays the full
read. "cold ttft" is what a first question about the document waits: dense's first
question; every SpecPrefill row with its scoring swapped for the document's cold scoring
(`cold_ttft`); every UniPrefill row (it reads each question cold). `auto`: where the
router's table allows a sparse read for a question, the turn `auto` runs is run (cold: the
engine then also keeps the question's own passages, and applies its thresholds); elsewhere
it reads densely, and dense's row stands for it.

Seeds: `--held-out` seeds are reported apart; the table in quality_table.py must come only
from the others (`suggested evidence` is printed from those).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from functools import partial
from itertools import zip_longest
from pathlib import Path
from typing import Any

from brisk.bench.common import print_table
from brisk.bench.doc_corpus import KINDS, build_document, score
from brisk.engine.accel.quality_table import allowed, evidence_from, length_band, model_key, question_kind
from brisk.engine.api.errors import BriskError

README = Path(__file__).resolve().parents[1] / "README.md"  # the checkout's


def _finish(events):
    from brisk.engine.api.errors import BriskError
    from brisk.engine.api.events import EngineErrored, TurnFinished

    for event in events:
        if isinstance(event, TurnFinished):
            return event
        if isinstance(event, EngineErrored):
            raise BriskError(event.message)
    raise BriskError("the turn did not finish")


def _settings(target_id: str, draft_id: str | None, method: str, max_tokens: int):
    from brisk.engine.api.settings import ChatSettings

    kw: dict[str, Any] = {"sparse_prefill": "off", "uniprefill": "off"}
    name, _, value = method.partition(" ")
    if name == "specprefill":
        kw = {"sparse_prefill": "on", "sparse_keep": float(value), "sparse_threshold": 0, "uniprefill": "off"}
    elif name == "uniprefill":
        kw = {"sparse_prefill": "off", "uniprefill": "on"}
    elif name == "auto":  # the router as a chat runs it (engine/accel/router.py), draft loaded
        kw = {"sparse_prefill": "auto", "uniprefill": "auto"}
    return ChatSettings(
        model=target_id,
        temperature=0.0,
        max_tokens=max_tokens,
        spec_decode="off",
        draft=draft_id if name in ("specprefill", "auto") else None,
        **kw,
    )


def _row(doc, q, method: str, event, *, cold: bool, held_out: bool, tokens: int) -> dict:
    m = event.metrics
    coverage = m.coverage or {}
    return {
        "seed": doc.seed,
        "held_out": held_out,
        "length": tokens,
        "kind": q.kind,
        "depth": q.depth,
        "question": q.text,
        "method": method,
        "answer": event.text.strip()[:160],
        **score(q, event.text),
        "ttft_s": m.ttft_s,
        "cold": cold,
        "read_share": coverage.get("read_share", 1.0),
        "flagged": bool(coverage.get("question_dropped")),
        "route": m.prefill_route,
        "scoring_s": m.scoring_s,
    }


def ask_all(target, draft, doc, methods: list[str], *, held_out: bool, tokens: int, on_row=None, log=print):
    """Every question of `doc` under every method: result rows (each also to `on_row`)."""
    from brisk.engine.accel.speculative.pair import DraftPair
    from brisk.engine.api.conversation import Message
    from brisk.engine.api.session import Session

    rows: list[dict] = []
    dense = Session(target, _settings(target.id, None, "dense", 16))
    pair = DraftPair.make(target, draft) if draft is not None else None
    for i, q in enumerate(doc.questions):
        prompt = doc.text + "\n\n" + q.text
        for method in (m for m in methods if m != "auto"):  # auto's own turn: below, where it reads sparsely
            settings = _settings(target.id, draft.id if draft else None, method, q.max_tokens)
            if method == "dense":
                dense.settings = settings
                event = _finish(dense.answer([Message("user", prompt)]))
            else:
                session = Session(target, settings)
                if method.startswith("specprefill"):
                    if pair is None:
                        continue
                    session.pair = pair  # the draft's cache of this document carries over
                event = _finish(session.send(prompt))
            cold = i == 0 or method == "uniprefill"
            rows.append(_row(doc, q, method, event, cold=cold, held_out=held_out, tokens=tokens))
            _logged(rows[-1], on_row, log)
        if "auto" in methods and _table_allows_sparse(target, draft, tokens, q.text):
            # The router allows a sparse read here: the turn `auto` really runs (it also keeps
            # the question's own passages, which the fixed settings above do not), read cold.
            settings = _settings(target.id, draft.id if draft else None, "auto", q.max_tokens)
            session = Session(target, settings)
            session.pair = pair
            event = _finish(session.send(prompt))
            rows.append(_row(doc, q, "auto", event, cold=True, held_out=held_out, tokens=tokens))
            _logged(rows[-1], on_row, log)
    return rows


def _table_allows_sparse(target, draft, tokens: int, question: str) -> bool:
    key = model_key(target.config, target.info.parameters)
    draft_key = model_key(draft.config, draft.info.parameters) if draft is not None else None
    return allowed(key, tokens, question_kind(question), draft=draft_key) is not None


def _logged(r: dict, on_row, log) -> None:
    if on_row:
        on_row(r)
    log(
        f"  seed {r['seed']} {r['kind']:11} {r['method']:15} right={r['right']!s:5} ttft={r['ttft_s']:.1f}s "
        f"read={r['read_share']:.2f} flag={r['flagged']!s:5} {r['answer'][:50]!r}",
        flush=True,
    )


def add_auto(rows: list[dict], key: str, draft_key: str | None, table: dict | None = None) -> list[dict]:
    """The router's `auto` for each question: the turn it ran where the run measured one
    (where the table allowed a sparse read); else, as runs saved before that were scored,
    the row of the setting it allows, or dense's where it allows none or where that
    setting's coverage flagged the question's region as dropped (TTFT = the scoring plus
    dense's)."""
    cold: dict[tuple, float] = {}
    for r in rows:
        if r["cold"]:
            cold.setdefault((r["seed"], r["length"], r["method"]), r["ttft_s"])
    out = []
    questions: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        questions.setdefault((r["seed"], r["length"], r["kind"], r["depth"], r.get("question", "")), {})[
            r["method"]
        ] = r
    for (seed, length, kind, _, text), by_method in questions.items():
        dense = by_method.get("dense")
        if dense is None:
            continue
        if "auto" in by_method:  # measured (ask_all): the turn the router ran is already a row
            continue
        ev = allowed(key, length, question_kind(text), draft=draft_key, table=table)
        name = "dense" if ev is None else ev.method if ev.keep is None else f"{ev.method} {ev.keep}"
        chosen = by_method.get(name, dense)
        dense_cold = cold.get((seed, length, "dense"), dense["ttft_s"])
        ttft = dense_cold if chosen is dense else cold_ttft(chosen, rows)
        if chosen is not dense and chosen["flagged"]:
            scoring = cold_ttft(chosen, rows) - chosen["ttft_s"] + chosen["scoring_s"]  # the cold scoring
            chosen, ttft = dense, scoring + dense_cold
        out.append({**chosen, "method": "auto", "chosen": chosen["method"], "ttft_s": ttft, "cold": True})
    return out


def summarize(rows: list[dict], methods: list[str]) -> tuple[list[list], dict]:
    """Per method: accuracy, its ratio to dense, agreement with dense (same verdict; same
    answer text), cold TTFT, read share, flags; and per method and kind, accuracy."""
    table, by_kind = [], {}
    dense = {_qid(r): r for r in rows if r["method"] == "dense"}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        acc = _acc(mine)
        pairs = [(r, dense[_qid(r)]) for r in mine if _qid(r) in dense]
        # on the questions both answered: a column run for some questions only is not
        # compared with dense's accuracy over all of them
        dense_acc = _acc([d for _, d in pairs])
        paired_acc = _acc([r for r, _ in pairs])
        agree = sum(r["right"] == d["right"] for r, d in pairs) / max(len(pairs), 1)
        same = sum(r["answer"] == d["answer"] for r, d in pairs) / max(len(pairs), 1)
        ttfts = [cold_ttft(r, rows) for r in mine if r["cold"] or r["method"].startswith("specprefill")]
        table.append(
            [
                method,
                len(mine),
                acc,
                paired_acc / dense_acc if dense_acc else float("nan"),
                agree,
                same,
                statistics.median(ttfts) if ttfts else float("nan"),
                statistics.mean(r["read_share"] for r in mine),
                sum(r["flagged"] for r in mine),
            ]
        )
        by_kind[method] = {
            k: f"{sum(r['right'] for r in mine if r['kind'] == k)}/{sum(r['kind'] == k for r in mine)}"
            for k in KINDS
            if any(r["kind"] == k for r in mine)
        }
    return table, by_kind


def cold_ttft(row: dict, rows: list[dict]) -> float:
    """A row's TTFT as a first question about its document would see it: SpecPrefill's rows
    after the first reuse the draft's reading of the document, so their scoring time is
    swapped for the cold scoring that document's first SpecPrefill row paid."""
    if not row["method"].startswith("specprefill"):
        return row["ttft_s"]
    same_doc = [r for r in rows if (r["seed"], r["length"]) == (row["seed"], row["length"])]
    cold = max((r["scoring_s"] for r in same_doc if r["method"].startswith("specprefill")), default=0.0)
    return row["ttft_s"] - row["scoring_s"] + cold


def _qid(r: dict) -> tuple:
    return (r["seed"], r["length"], r["kind"], r["depth"], r.get("question", ""))


def _acc(rows: list[dict]) -> float:
    return sum(r["right"] for r in rows) / len(rows) if rows else float("nan")


def report(payload: dict, *, as_json: bool) -> None:
    rows, methods = payload["rows"], payload["methods"] + ["auto"]
    key, draft_key = payload["model_key"], payload.get("draft_key")
    tuning = [r for r in rows if not r["held_out"]]
    payload["suggested_evidence"] = {}
    for length in sorted({r["length"] for r in rows}):
        band = length_band(length)
        ev = evidence_from([r for r in tuning if r["length"] == length], draft=draft_key or "")
        payload["suggested_evidence"][band] = [
            {"method": e.method, "keep": e.keep, "draft": e.draft, "kinds": sorted(e.kinds)} for e in ev
        ]
    for part, chosen in (("tuning seeds", False), ("held-out seeds", True)):
        mine = [r for r in rows if r["held_out"] == chosen]
        if not mine:
            continue
        for length in sorted({r["length"] for r in mine}):
            sub = [r for r in mine if r["length"] == length]
            sub += add_auto(sub, key, draft_key)
            table, by_kind = summarize(sub, methods)
            seeds = sorted({r["seed"] for r in sub})
            for line in table:
                line += [by_kind[line[0]].get(k, "-") for k in KINDS]
            print_table(
                f"brisk bench doc-qa: {payload['target']} (draft {payload['draft']}), {length} tokens, {part} {seeds}",
                ["method", "n", "acc", "vs dense", "agree", "same text", "cold ttft s", "read", "flagged", *KINDS],
                table,
                {**payload, "part": part, "length": length, "summary": table},
                as_json,
            )
    if not as_json:
        print("suggested evidence (tuning seeds only):", json.dumps(payload["suggested_evidence"]))


def run_doc_qa(
    target_id: str,
    draft_id: str | None,
    lengths: list[int],
    seeds: list[int],
    held_out: list[int],
    *,
    keeps: list[float],
    kinds: list[str] | None = None,
    with_uniprefill: bool = True,
    only: list[str] | None = None,
    save: str | None = None,
    as_json: bool,
) -> dict:
    """`only`: run just these of dense, specprefill, uniprefill and auto (a long run's missing
    column, merged with the rest by `rescore` of both saved files)."""
    from brisk.engine.models.loader import load_model

    if save and (Path(save).is_dir() or not Path(save).resolve().parent.is_dir()):
        raise BriskError(f"--save {save}: not a file in an existing folder")
    if save and Path(save).exists():  # a long run saved there would be replaced at the first answer
        raise BriskError(f"--save {save}: the file exists (a saved run?); give a new name, --rescore merges them")
    # an --only column that cannot run would run nothing, and save a file without it
    if only and "specprefill" in only and not draft_id:
        raise BriskError("--only specprefill needs --draft")
    if only and "uniprefill" in only and not with_uniprefill:
        raise BriskError("--only uniprefill and --no-uniprefill leave nothing to run")
    target = load_model(target_id)
    draft = load_model(draft_id) if draft_id else None
    methods = ["dense"] + ([f"specprefill {k}" for k in dict.fromkeys(keeps)] if draft else [])
    methods += ["uniprefill"] if with_uniprefill else []
    if only:
        methods = [m for m in methods if m.split()[0] in only]
    asked = methods + (["auto"] if not only or "auto" in only else [])
    payload: dict[str, Any] = {
        "target": target_id,
        "draft": draft_id,
        "model_key": model_key(target.config, target.info.parameters),
        "draft_key": model_key(draft.config, draft.info.parameters) if draft else None,
        "methods": methods,
        "held_out": held_out,
        "rows": [],
    }
    log = partial(print, file=sys.stderr if as_json else sys.stdout)  # --json: stdout holds only the JSON
    room = target.context_length - 256  # the question and the answer need their own room
    for tokens in dict.fromkeys(min(n, room) for n in lengths):  # lengths capped alike: asked once
        # tuning and held-out seeds alternate, so a run cut short still has both
        order = [s for pair in zip_longest(seeds, held_out) for s in pair if s is not None]
        for seed in dict.fromkeys(order):
            doc = build_document(seed, target.tokenizer, tokens, README)
            doc.questions = [q for q in doc.questions if not kinds or q.kind in kinds]
            log(f"doc seed {seed}, {tokens} tokens: {', '.join(doc.sources)}", flush=True)

            def keep(row: dict) -> None:  # every answer saved as it comes: a long run stopped keeps its rows
                payload["rows"].append(row)
                if save:
                    _save(save, payload)

            ask_all(target, draft, doc, asked, held_out=seed in held_out, tokens=tokens, on_row=keep, log=log)
    report(payload, as_json=as_json)
    return payload


def _save(path: str, payload: dict) -> None:
    """The run so far, replaced whole: Ctrl-C while writing leaves the previous answers, not
    a truncated file."""
    part = Path(f"{path}.part")
    part.write_text(json.dumps(payload, indent=1))
    os.replace(part, path)


ROW_KEYS = (
    *("seed", "held_out", "length", "kind", "depth", "method", "answer", "right", "ttft_s", "cold"),
    *("read_share", "flagged", "scoring_s"),
)


def load_saved(path: str) -> dict:
    """A saved run (`--save`); a file that is not one is a BriskError naming it. Runs saved
    before `methods` and `held_out` were written get them from their rows."""
    from brisk.engine.turn.text_input import read_text_file

    try:
        payload = json.loads(read_text_file(path, what="Saved run"))
    except ValueError as exc:
        raise BriskError(f"{path} is not a saved doc-qa run: {exc}") from exc
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or "target" not in payload or "model_key" not in payload:
        raise BriskError(f"{path} is not a saved doc-qa run (no target, model_key or rows)")
    for row in rows:
        missing = [k for k in ROW_KEYS if k not in row] if isinstance(row, dict) else ["all"]
        if missing:
            raise BriskError(f"{path} is not a saved doc-qa run: an answer lacks {', '.join(missing)}")
    payload.setdefault("draft", None)
    payload.setdefault("methods", list(dict.fromkeys(r["method"] for r in rows if r["method"] != "auto")))
    payload.setdefault("held_out", sorted({r["seed"] for r in rows if r["held_out"]}))
    return payload


def _draftless(payload: dict) -> bool:
    """No answer of the run was read with its draft (dense and UniPrefill only): it merges
    with a run of any draft."""
    return not any(r["method"].startswith("specprefill") or r["method"] == "auto" for r in payload["rows"])


def rescore(paths: list[str], *, as_json: bool) -> dict:
    """The tables again from saved runs (`--save`) of one model, with the router's table as
    it is now; several files are one run (e.g. a column run later with `--only`). An answer
    in two files (a file given twice, a column run again) counts once: the first file's."""
    payloads = [load_saved(p) for p in paths]
    payload = payloads[0]
    for other in payloads[1:]:
        if other["target"] != payload["target"]:
            raise BriskError(f"{paths[0]} and the other saved runs are not of one target and draft")
        if other["draft"] != payload["draft"]:
            if _draftless(payload):  # e.g. a column run later with `--only uniprefill` and no --draft
                payload["draft"], payload["draft_key"] = other["draft"], other.get("draft_key")
            elif not _draftless(other):
                raise BriskError(f"{paths[0]} and the other saved runs are not of one target and draft")
        payload["methods"] += [m for m in other["methods"] if m not in payload["methods"]]
        payload["held_out"] = sorted(set(payload["held_out"]) | set(other["held_out"]))
        payload["rows"] += other["rows"]
    once = {(_qid(r), r["method"]): r for r in reversed(payload["rows"])}  # the first one stays
    if len(once) < len(payload["rows"]):
        print(
            f"brisk bench doc-qa: {len(payload['rows']) - len(once)} answers given twice counted once", file=sys.stderr
        )
        payload["rows"] = [r for r in payload["rows"] if once[(_qid(r), r["method"])] is r]
    report(payload, as_json=as_json)
    return payload
