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
# tuning seeds only (seed 1; seed 3 held out). Measured 2026-11-27 on an AMD EPYC (2 cores
# shared with other jobs, float32 MLX CPU), 4K-token documents, answers right / asked:
# - qwen2-630 (Qwen2.5-Coder-0.5B, draft SmolLM2-135M = llama-135, cross tokenizer):
#   dense fact 2/3, two_hop 1/1, code 0/1 (cold TTFT 140 s); SpecPrefill keep 0.1 3/3, 0/1,
#   0/1 (65 s); 0.2 3/3, 1/1, 0/1 (76 s); 0.3 2/3, 1/1, 0/1 (84 s); UniPrefill at p 0.985
#   0/3, 0/1, 0/1 (54 s; its coverage flagged the question's passage as dropped on all 5).
#   Held-out seed 3 (not used above): dense 1/5, keep 0.1 2/5, 0.2 1/5, 0.3 2/5, UniPrefill 0/5.
#   Only "fact" had the 3 questions evidence needs, and a question the words cannot tell
#   from a two-hop one needs both: `auto` still reads Qwen-0.5B's 4K documents densely.
# - llama-135 (SmolLM2-135M, no draft: dense, UniPrefill at p 0.99): 4K dense 0/7 (twice,
#   sessions apart), UniPrefill 0/7; 8K (7,936 tokens, its context) dense 1/7, UniPrefill 0/7
#   (7 of 7 flagged); held-out seed 3: 4K dense 0/7, UniPrefill 1/7; 8K dense 1/7 (quote),
#   UniPrefill 0/7. Dense answers too little to show anything: no row.
# - qwen2-1777 (Qwen2.5-Coder-1.5B, draft Qwen2.5-Coder-0.5B = qwen2-630, same tokenizer), 8K-token
#   documents, measured 2026-11-27 at nice 19 beside CI runs (TTFTs loaded; ratios only): tuning
#   seed 1, dense 4/7 (fact 2/3, two_hop 1/1, aggregation 0/1, quote 1/1, code 0/1; cold TTFT
#   248 s); SpecPrefill keep 0.1 6/7 (67 s), 0.2 6/7 (82 s), 0.3 5/7 (95 s); UniPrefill 3/7
#   (77 s, 6 of 7 flagged). The tuning seed suggests SpecPrefill for "fact" at every keep, but
#   held-out seed 3 (dense 7/7) has keep 0.2 losing a fact dense got (2/3) and keep 0.1 a quote
#   and the code question (5/7): no row. `auto` reads Qwen-1.5B's 8K documents densely.
#   16K-token documents (2026-11-28, nice 19 beside other benchmarks; SpecPrefill at keep 0.2
#   only, UniPrefill not run): tuning seed 3, dense 5/7 (fact 2/3, two_hop 1/1, aggregation
#   1/1, quote 1/1, code 0/1; cold TTFT 689 s), SpecPrefill 0.2 the same on every kind
#   (174 s, 4.0x); held-out seed 1, dense 5/7 (fact 3/3, two_hop 1/1, aggregation 1/1,
#   quote 0/1, code 0/1; 512 s), SpecPrefill 0.2 the same on every kind (142 s, 3.6x). Only
#   "fact" had the 3 questions evidence needs: a "fact" row (out since; below), which no
#   question the words cannot tell from a two-hop one used, so `auto` read these densely.
#   UniPrefill at the model's p, 16K, tuning seed 3 only (2026-11-28, beside perplexity
#   runs, TTFT 242-640 s by load): 5/7, right and wrong on the same questions as dense on
#   every kind (the code question's passage flagged as dropped), reading 25-27% of the
#   tokens in full; the held-out seed was not run, so no row (the tuning seed alone
#   suggests one for "fact").
# SpecPrefill's rows above (qwen2-630 4K fact at keep 0.1/0.2/0.3; qwen2-1777 16K fact at
# keep 0.2) were measured with its 32-token observation window. Its scorer reads 128 rows
# since 2026-11-28 (engine/accel/specprefill/scoring.py): evidence for one scorer is not
# evidence for another, so those rows are out. They changed no route (only "fact" was
# shown, and no question's words say "fact" alone).
# - qwen2-1777 16K with the 128-row scorer (2026-11-28, AMD EPYC, mostly idle; SpecPrefill at
#   keep 0.2 with Qwen-0.5B drafting; answers right / asked): tuning seeds 2, 3 and 4, dense
#   fact 8/9, two_hop 3/3, aggregation 2/3, quote 2/3, code 1/3 (cold TTFT 276 s);
#   SpecPrefill 7/9, 3/3, 1/3, 2/3, 1/3 (102 s; seed 4 answered one fact with a
#   neighbouring entry's, seed 3 listed part of an aggregation). Held-out seeds 1 and 5:
#   dense 6/6, 2/2, 1/2, 0/2, 0/2 (378 s); SpecPrefill 6/6, 2/2, 2/2, 0/2, 0/2 (104 s). The
#   tuning seeds show two-hop, quote and code questions. Quotes are out all the same: the
#   suite's quote is a sentence planted once in the document, and a user's trial on a real
#   one (15K tokens of Apache-2.0, shlex.py, man ls, textwrap.py, MPL-2.0: "quote the
#   sentence defining Legal Entity") got it wrong under auto, two definitions spliced where a
#   32-token chunk cut the sentence, and right densely. The row lacks "fact", so a question
#   the words cannot classify still reads densely: `auto` reads sparsely only for questions
#   about named code (which function calls `x`) in 12K-24K-token documents.
# Every other model and band: no row, dense.
TABLE: dict[str, dict[str, tuple[Evidence, ...]]] = {
    "qwen2-1777": {
        "16K": (Evidence("specprefill", 0.2, "qwen2-630", frozenset({"two_hop", "code"})),),
    },
}


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
    # lists, totals and summaries in other words: every part of the document counts, as in a count
    if re.search(
        r"\blist\b|\bname (all|every|each)\b|\bnames of (all|every|each)\b|\btotal\b|\bhow much\b"
        r"|\baltogether\b|\bsumm?ar(y|i[sz]e)|\benumerate\b",
        q,
    ):
        return "aggregation"
    if re.search(r"\bquote\b|\bword for word\b|\bverbatim\b|\bexact (words|wording|text)\b", q):
        return "quote"
    # About code: a name in backticks, or code words beside a name that can only be code
    # (snake_case, a call, a dotted path, camelCase). Code words alone say nothing: "the
    # function of the NOTICE file", "what class of works" are prose questions.
    if re.search(r"`[^`]+`", q):
        return "code"
    code_words = re.search(r"\bfunctions?\b|\bmethods?\b|\bclass(es)?\b|\bcall(s|ed|ing)?\b|\bdef\b", q)
    if code_words and re.search(r"\b\w+_\w*|\b\w+\(|\b[a-z_]\w+\.[a-z_]\w+\b|\b[a-z]+[A-Z]\w*", question):
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
    also: tuple[str | None, ...] = (),
) -> Evidence | None:
    """The sparse setting `auto` may use for this prompt (one of `methods`), or None (read
    densely). A SpecPrefill row needs the draft it was measured with; the row must cover
    `kind` and every kind in `also` (the conversation's other questions)."""
    rows = (TABLE if table is None else table).get(key, {}).get(length_band(new_tokens), ())
    for evidence in rows:
        if evidence.method not in methods:
            continue
        if evidence.method == "specprefill" and evidence.draft != draft:
            continue
        if all(covers(evidence, k) for k in (kind, *also)):
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
