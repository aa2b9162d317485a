"""What a sparse prefill read at full depth: the data behind the app's coverage map.

A user whose answer misses a fact deserves to see that the model never read that part.
For each drop layer (UniPrefill) or for the whole model (SpecPrefill: layer -1), the kept
[start, end) runs of the new prompt tokens; and the largest passages skipped by the
deepest layers, with the text they begin with.
"""

from __future__ import annotations

SKIPPED_SHOWN = 5  # largest skipped passages listed
PREVIEW_TOKENS = 24


def coverage_map(
    tokenizer,
    new_tokens: list[int],
    kept_by_layer: list[tuple[int, list[tuple[int, int]]]],
    *,
    method: str = "",
    focus: list[tuple[int, int]] | None = None,
) -> dict:
    """`focus`: the passages the question points at (engine/accel/question_focus.py), in
    new-token positions; `question_dropped` says the deepest layers read less than
    MOSTLY_DROPPED of them (the app warns and offers to read it all)."""
    from brisk.engine.accel.question_focus import MOSTLY_DROPPED, read_share

    total = len(new_tokens)
    if not kept_by_layer:
        return {}
    deepest = kept_by_layer[-1][1]
    gaps, at = [], 0
    for start, end in deepest:
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    if at < total:
        gaps.append((at, total))
    largest = sorted(gaps, key=lambda g: g[0] - g[1])[:SKIPPED_SHOWN]
    skipped = [[s, e, tokenizer.decode(new_tokens[s : min(e, s + PREVIEW_TOKENS)]).strip()] for s, e in sorted(largest)]
    read = sum(e - s for s, e in deepest)
    focus = [(s, min(e, total)) for s, e in focus or [] if s < total]
    question_read = read_share(focus, deepest)
    return {
        "method": method,
        "question_regions": [list(r) for r in focus],
        "question_read": question_read,
        "question_dropped": bool(focus) and question_read < MOSTLY_DROPPED,
        "new_tokens": total,
        "read_share": read / total if total else 1.0,
        "layers": [[layer, [list(r) for r in runs]] for layer, runs in kept_by_layer],
        "skipped": skipped,
    }
