"""Where sparse prefill has shown that it keeps answers: the evidence `auto` routes by.

`auto` may read a prompt sparsely only where `brisk bench doc-qa` showed the method
answering at least KEEP_SHARE of what dense prefill answered, for that model, length band
and question kind. Anywhere else, including every model, band or kind the suite has not
measured, the prompt is read densely: a fast wrong answer is worse than a slow right one.

The question's kind comes from its words (`question_kind`): counting and listing,
quoting, and code questions have their own rows; any other question must be covered for
single facts and two-hop questions alike (the words cannot tell those apart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEEP_SHARE = 0.97
MIN_QUESTIONS = 3  # fewer questions of a kind show nothing either way
OTHER = ("fact", "two_hop")  # an unclassified question needs evidence for both
BANDS = ((6 * 1024, "4K"), (12 * 1024, "8K"), (24 * 1024, "16K"), (48 * 1024, "32K"))


@dataclass(frozen=True)
class Evidence:
    """One sparse setting, and the question kinds where it kept >= KEEP_SHARE of dense's
    accuracy (with dense answering at least one question of the kind: nothing is shown by
    two methods that both always fail)."""

    method: str  # "specprefill" or "uniprefill"
    keep: float | None = None  # SpecPrefill's kept share
    draft: str = ""  # SpecPrefill's draft, by model key (the evidence is for that pair)
    kinds: frozenset[str] = frozenset()


# Per model key (architecture-parameters in millions, `model_key`), per length band: the
# settings in the order `auto` prefers them (fastest first), from `brisk bench doc-qa`
# tuning seeds only. Empty until the suite shows a setting keeping answers: every model,
# band and kind reads densely under `auto` (the numbers behind this are in the note below).
TABLE: dict[str, dict[str, tuple[Evidence, ...]]] = {}


def model_key(config: dict, parameters: int) -> str:
    args = config.get("text_config") or config
    return f"{args.get('model_type', '?')}-{round(parameters / 1e6)}"


def length_band(new_tokens: int) -> str:
    return next((name for top, name in BANDS if new_tokens <= top), "longer")


def question_kind(question: str) -> str | None:
    """aggregation, quote or code from the question's words; None for any other question."""
    q = question.lower()
    if re.search(r"\bhow many\b|\blist (every|all|each)\b|\bcount\b|\bevery\b.*\bname", q):
        return "aggregation"
    if re.search(r"\bquote\b|\bword for word\b|\bverbatim\b|\bexact (words|wording|text)\b", q):
        return "quote"
    if re.search(r"`[^`]+`|\bfunction\b|\bmethod\b|\bclass\b|\bcalls?\b|\bdef\b", q):
        return "code"
    return None


def covers(evidence: Evidence, kind: str | None) -> bool:
    return set(OTHER if kind is None else (kind,)) <= evidence.kinds


def allowed(
    key: str,
    new_tokens: int,
    kind: str | None,
    *,
    draft: str | None,
    table: dict | None = None,
    methods: set[str] | frozenset[str] = frozenset({"specprefill", "uniprefill"}),
) -> Evidence | None:
    """The sparse setting `auto` may use for this prompt (one of `methods`), or None (read
    densely). A SpecPrefill row needs the draft it was measured with."""
    rows = (TABLE if table is None else table).get(key, {}).get(length_band(new_tokens), ())
    for evidence in rows:
        if evidence.method not in methods:
            continue
        if evidence.method == "specprefill" and evidence.draft != draft:
            continue
        if covers(evidence, kind):
            return evidence
    return None


def evidence_from(rows: list[dict], *, draft: str = "") -> list[Evidence]:
    """Evidence rows from doc-qa result rows (method, kind, right) of one model and band:
    the kinds where each sparse setting, asked at least MIN_QUESTIONS of them, kept
    KEEP_SHARE of dense's accuracy."""
    kinds = sorted({r["kind"] for r in rows})
    dense = {k: [r["right"] for r in rows if r["method"] == "dense" and r["kind"] == k] for k in kinds}
    found = []
    for method in sorted({r["method"] for r in rows} - {"dense", "auto"}):
        kept = set()
        for k in kinds:
            mine = [r["right"] for r in rows if r["method"] == method and r["kind"] == k]
            d = sum(dense[k]) / max(len(dense[k]), 1)
            if len(mine) >= MIN_QUESTIONS and d > 0 and sum(mine) / len(mine) >= KEEP_SHARE * d:
                kept.add(k)
        if kept:
            name, _, value = method.partition(" ")
            keep = float(value) if name == "specprefill" and value else None
            found.append(Evidence(name, keep, draft if name == "specprefill" else "", frozenset(kept)))
    return found
