"""`brisk bench counting`: an exhaustive task, where every part of the document matters.

A shipping log in which a few entries, spread evenly, are green; the model must list
every green entry and say how many there are. A fixed keep can only show the target
the green entries inside its kept chunks. `auto` finds the importance spread over many
chunks and keeps more of them, or prefills fully and says so. The score is the recall
of the green entry numbers and whether the stated count is right, for full prefill,
fixed keep and auto, on the same documents.
"""

from __future__ import annotations

import random
import re

from engine.bench.common import print_table

COLOURS = ("red", "blue", "yellow", "white", "black", "grey", "brown", "orange")
OBJECTS = ("box", "crate", "bag", "barrel", "parcel", "case", "drum", "sack")
CITIES = ("Oslo", "Lyon", "Porto", "Turin", "Ghent", "Basel", "Cork", "Graz", "Split", "Bergen", "Malmo", "Leeds")
ASK = ("\n\nWhich entries in the log above mention a green item? List all their entry numbers, separated by "
       "commas, then say how many there are.")


def counting_document(entries: int, green: int, seed: int) -> tuple[str, list[int]]:
    """A log of `entries` lines with `green` green items, one in each equal stretch of it."""
    rng = random.Random(seed)
    stretch = entries / green
    greens = sorted(int(i * stretch + rng.random() * stretch) + 1 for i in range(green))
    lines = []
    for n in range(1, entries + 1):
        colour = "green" if n in greens else rng.choice(COLOURS)
        lines.append(f"Entry {n}: a {colour} {rng.choice(OBJECTS)} was shipped to {rng.choice(CITIES)}.")
    return "Shipping log\n" + "\n".join(lines) + ASK, greens


def score_answer(answer: str, greens: list[int]) -> dict:
    """Recall and precision of the listed entry numbers; the count is the last number."""
    numbers = [int(x) for x in re.findall(r"\d+", answer)]
    listed = set(numbers[:-1]) if len(numbers) > 1 else set(numbers)
    hits = len(listed & set(greens))
    return {"recall": hits / len(greens), "precision": hits / len(listed) if listed else 0.0,
            "count_right": bool(numbers) and numbers[-1] == len(greens)}


def run_counting(target_id: str, draft_id: str, entries: int, green: int, seeds: list[int], keep: float, *,
                 as_json: bool) -> dict:
    from engine.events import TurnFinished
    from engine.models.loader import load_model
    from engine.session import Session
    from engine.settings import ChatSettings

    target, draft = load_model(target_id), load_model(draft_id)
    modes = {"full": ("off", keep), f"keep {keep}": ("on", keep), "auto": ("auto", keep)}
    payload = {"target": target_id, "draft": draft_id, "entries": entries, "green": green, "keep": keep, "rows": []}
    rows = []
    for seed in seeds:
        text, greens = counting_document(entries, green, seed)
        for name, (mode, k) in modes.items():
            settings = ChatSettings(model=target_id, temperature=0.0, max_tokens=8 * green + 32, sparse_prefill=mode,
                                    sparse_keep=k, sparse_threshold=0, spec_decode="off", draft=draft_id)
            for event in Session(target, settings, draft=draft).send(text):
                if isinstance(event, TurnFinished):
                    m = event.metrics
                    entry = {"seed": seed, "mode": name, "prompt_tokens": m.prompt_tokens, "kept": m.kept_tokens,
                             "sparse_prefill": m.sparse_prefill, "ttft_s": m.ttft_s, "answer": event.text.strip(),
                             **score_answer(event.text, greens)}
                    payload["rows"].append(entry)
                    rows.append([seed, name, m.prompt_tokens, m.kept_tokens or m.prompt_tokens, entry["recall"],
                                 entry["precision"], entry["count_right"], m.ttft_s, m.sparse_prefill[:40]])
    for name in modes:
        mine = [r for r in payload["rows"] if r["mode"] == name]
        rows.append(["mean", name, "", "", sum(r["recall"] for r in mine) / len(mine),
                     sum(r["precision"] for r in mine) / len(mine),
                     f"{sum(r['count_right'] for r in mine)}/{len(mine)}", sum(r["ttft_s"] for r in mine) / len(mine),
                     ""])
    print_table(f"brisk bench counting: {target_id} (draft {draft_id}), {entries} entries, {green} green, "
                f"keep {keep} vs auto vs full", ["seed", "mode", "prompt", "kept", "recall", "precision", "count ok",
                                                 "ttft s", "sparse prefill"], rows, payload, as_json)
    return payload
