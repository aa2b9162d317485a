"""`brisk bench counting`: an exhaustive task, where every part of the document matters.

A shipping log in which a few items, one in each equal stretch of it, are green and went
to cities no other item went to; the model must name every city that received a green
item and say how many there are. (Asking for entry numbers instead defeated the 1.5B
target even with full prefill: it listed runs of consecutive numbers.) A fixed keep can
only show the target the green lines inside its kept chunks. `auto` finds the importance
spread over many chunks and keeps more of them, or prefills fully and says so. The score
is the recall and precision of the named cities and whether the stated count is right,
for full prefill, fixed keep and auto, on the same documents.
"""

from __future__ import annotations

import random
import re
from typing import Any

from brisk.bench.common import print_table
from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.literal_types import AccelMode

COLOURS = ("red", "blue", "yellow", "white", "black", "grey", "brown", "orange")
OBJECTS = ("box", "crate", "bag", "barrel", "parcel", "case", "drum", "sack")
CITIES = ("Oslo", "Lyon", "Porto", "Turin", "Ghent", "Basel", "Cork", "Graz", "Split", "Bergen", "Malmo", "Leeds")
# only green items go here, so the answer is a set of names, each named once in the log
GREEN_CITIES = (
    "Tallinn",
    "Krakow",
    "Seville",
    "Dublin",
    "Munich",
    "Vienna",
    "Prague",
    "Zagreb",
    "Riga",
    "Nantes",
    "Bruges",
    "Verona",
)
ASK = (
    "\n\nWhich cities received a green item? List every one of them, separated by commas, then say how many there are."
)


def counting_document(entries: int, green: int, seed: int) -> tuple[str, list[str]]:
    """A log of `entries` lines with `green` green items, one in each equal stretch of it;
    returns the text and the green items' cities in log order."""
    if not 0 < green <= min(entries, len(GREEN_CITIES)):
        raise InvalidSettings(f"--green must be between 1 and {min(entries, len(GREEN_CITIES))}")
    rng = random.Random(seed)
    stretch = entries / green
    slots = [int(i * stretch + rng.random() * stretch) + 1 for i in range(green)]
    cities = rng.sample(GREEN_CITIES, green)
    lines = []
    for n in range(1, entries + 1):
        if n in slots:
            lines.append(f"A green {rng.choice(OBJECTS)} was shipped to {cities[slots.index(n)]}.")
        else:
            lines.append(f"A {rng.choice(COLOURS)} {rng.choice(OBJECTS)} was shipped to {rng.choice(CITIES)}.")
    return "Shipping log\n" + "\n".join(lines) + ASK, cities


def score_answer(answer: str, cities: list[str]) -> dict:
    """Recall and precision of the named cities; the count is the last number."""
    named = {c for c in CITIES + GREEN_CITIES if re.search(rf"\b{c}\b", answer)}
    hits = len(named & set(cities))
    numbers = re.findall(r"\d+", answer)
    return {
        "recall": hits / len(cities),
        "precision": hits / len(named) if named else 0.0,
        "count_right": bool(numbers) and int(numbers[-1]) == len(cities),
    }


def run_counting(
    target_id: str, draft_id: str, entries: int, green: int, seeds: list[int], keep: float, *, as_json: bool
) -> dict:
    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.session import Session
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.models.loader import load_model

    target, draft = load_model(target_id), load_model(draft_id)
    modes: dict[str, tuple[AccelMode, float]] = {
        "full": ("off", keep),
        f"keep {keep}": ("on", keep),
        "auto": ("auto", keep),
    }
    payload: dict[str, Any] = {
        "target": target_id,
        "draft": draft_id,
        "entries": entries,
        "green": green,
        "keep": keep,
        "rows": [],
    }
    rows = []
    for seed in seeds:
        text, cities = counting_document(entries, green, seed)
        for name, (mode, k) in modes.items():
            settings = ChatSettings(
                model=target_id,
                temperature=0.0,
                max_tokens=8 * green + 32,
                sparse_prefill=mode,
                sparse_keep=k,
                sparse_threshold=0,
                spec_decode="off",
                draft=draft_id,
            )
            for event in Session(target, settings, draft=draft).send(text):
                if isinstance(event, TurnFinished):
                    m = event.metrics
                    entry = {
                        "seed": seed,
                        "mode": name,
                        "prompt_tokens": m.prompt_tokens,
                        "kept": m.kept_tokens,
                        "sparse_prefill": m.sparse_prefill,
                        "ttft_s": m.ttft_s,
                        "answer": event.text.strip(),
                        **score_answer(event.text, cities),
                    }
                    payload["rows"].append(entry)
                    rows.append(
                        [
                            seed,
                            name,
                            m.prompt_tokens,
                            m.kept_tokens or m.prompt_tokens,
                            entry["recall"],
                            entry["precision"],
                            entry["count_right"],
                            m.ttft_s,
                            m.sparse_prefill[:40],
                        ]
                    )
    for name in modes:
        mine = [r for r in payload["rows"] if r["mode"] == name]
        rows.append(
            [
                "mean",
                name,
                "",
                "",
                sum(r["recall"] for r in mine) / len(mine),
                sum(r["precision"] for r in mine) / len(mine),
                f"{sum(r['count_right'] for r in mine)}/{len(mine)}",
                sum(r["ttft_s"] for r in mine) / len(mine),
                "",
            ]
        )
    print_table(
        f"brisk bench counting: {target_id} (draft {draft_id}), {entries} entries, {green} green, "
        f"keep {keep} vs auto vs full",
        ["seed", "mode", "prompt", "kept", "recall", "precision", "count ok", "ttft s", "sparse prefill"],
        rows,
        payload,
        as_json,
    )
    return payload
