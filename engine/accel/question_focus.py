"""Where in the document the question points: the passages holding the question's rare words.

A question about "the Heron ledger" points at the few places that name it. A sparse plan
that drops those places cannot answer, whatever it kept elsewhere (the 17K-token case of
issue 60: "Read in full: 10%", and the fact in the middle gone). So the router keeps these
passages under `auto`, and the turn's coverage says when a plan dropped most of them.

The question is the prompt's last QUESTION_TOKENS tokens (chat-template words are not
content); its words of 4+ letters, stop words aside, that occur at most MAX_HITS times in
the rest of the prompt mark REACH tokens either side of each occurrence.
"""

from __future__ import annotations

import bisect
import re

QUESTION_TOKENS = 64
MAX_HITS = 8  # a word found more often than this points nowhere in particular
REACH = 16  # tokens kept either side of a hit
MAX_REGIONS = 24
MOSTLY_DROPPED = 0.5  # the question's passages read in full below this share: flagged

STOP = frozenset(
    """what which where when whose with from that this there these those have has had does did
    into about answer only word name names every list quote exactly other than them they their
    your were will would should could being been some more most very also just each
    im_start im_end assistant user system""".split()
)


def _words(question: str) -> list[str]:
    seen: list[str] = []
    for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{3,}", question):
        stem = w.lower().rstrip("s") if len(w) > 4 else w.lower()
        if stem not in STOP and w.lower() not in STOP and stem not in seen:
            seen.append(stem)
    return seen


def question_regions(text: str, spans: list[tuple[int, int]], question_start: int) -> list[tuple[int, int]]:
    """[start, end) token ranges of the document (tokens before `question_start`) near the
    question's rare words. `text` is the prompt, `spans` each token's characters in it."""
    if question_start <= 0 or question_start > len(spans):
        return []
    doc_end = spans[question_start - 1][1]
    question, doc = text[spans[question_start][0] if question_start < len(spans) else doc_end :], text[:doc_end]
    starts = [s for s, _ in spans[:question_start]]
    regions: list[tuple[int, int]] = []
    for word in _words(question):
        hits = [m.start() for m in re.finditer(rf"(?i)\b{re.escape(word)}", doc)]
        if not hits or len(hits) > MAX_HITS:
            continue
        for at in hits:
            token = max(bisect.bisect_right(starts, at) - 1, 0)
            regions.append((max(token - REACH, 0), min(token + REACH + 1, question_start)))
    return merge(sorted(regions))[:MAX_REGIONS]


def merge(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in runs:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def read_share(regions: list[tuple[int, int]], kept: list[tuple[int, int]]) -> float:
    """The share of the regions' tokens inside the kept runs (1.0 when there are none)."""
    total = sum(e - s for s, e in regions)
    if not total:
        return 1.0
    covered = sum(max(0, min(e, ke) - max(s, ks)) for s, e in regions for ks, ke in kept)
    return covered / total


def prompt_regions(tokenizer, tokens: list[int]) -> list[tuple[int, int]]:
    """question_regions of a prompt of target `tokens` (positions in `tokens`); [] when its
    text cannot be mapped back to its tokens."""
    from brisk.engine.accel.translate import text_and_spans

    if len(tokens) <= QUESTION_TOKENS:
        return []
    try:
        text, spans = text_and_spans(tokenizer, tokens)
    except ValueError:
        return []
    return question_regions(text, spans, question_start(text, spans))


def question_start(text: str, spans: list[tuple[int, int]]) -> int:
    """The question's first token: after the last blank line of the last QUESTION_TOKENS
    tokens (a question set apart from its document), else QUESTION_TOKENS from the end."""
    tail = len(spans) - QUESTION_TOKENS
    cut = text.rfind("\n\n", spans[tail][0])
    if cut < 0:
        return tail
    return next((i for i in range(tail, len(spans)) if spans[i][0] >= cut + 2), tail)


def question_text(tail: str) -> str:
    """The question in the decoded end of a prompt: after its last blank line, if any."""
    parts = [p for p in tail.split("\n\n") if p.strip()]
    return parts[-1] if parts else tail
