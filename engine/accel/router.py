"""Which prefill a turn runs: dense, SpecPrefill (a draft scores the prompt) or UniPrefill
(the target drops blocks at its own layers), and why, in words for the metrics.

- SpecPrefill goes first when a draft is set and it is on: its plan (with its own
  threshold and its guard against exhaustive tasks, where importance is flat) decides.
  When its guard declines, nothing sparse runs: the same task would lose facts under
  UniPrefill too.
- UniPrefill `on` runs on every prompt long enough to drop anything; `auto` only from
  the break-even length `brisk bench uniprefill` measured for the model's architecture
  (uniprefill/plan.py; below it the scoring costs more than the dropped work saves), or
  from the chat's own `uniprefill_threshold`.
- `auto` (either method set to auto, neither to on) keeps answers: past those thresholds it
  may read sparsely only with a setting engine/accel/quality_table.py shows keeping >= 97%
  of dense's doc-qa accuracy for this model, length band and question kind; otherwise the
  prompt is read densely. The band counts the whole prompt (cached prefix too), and the
  kind must hold for the chat's other questions too (`asked_kinds`: one asked above its
  document, or the one a follow-up repeats). Under `auto` the passages the question points at
  (engine/accel/question_focus.py) are always read in full. A method set to auto beside
  one forced on runs only where the table allows it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from brisk.engine.accel import quality_table
from brisk.engine.accel.question_focus import QUESTION_TOKENS, prompt_regions, question_text
from brisk.engine.accel.specprefill.plan import SparsePlan, plan_sparse_prefill
from brisk.engine.accel.uniprefill.plan import break_even, worth_dropping
from brisk.engine.api.events import result_of

PrefillMethod = Literal["dense", "specprefill", "uniprefill"]


@dataclass(frozen=True)
class PrefillRoute:
    method: PrefillMethod
    reason: str
    spec: SparsePlan  # SpecPrefill's own plan (its note and timing go to the metrics)
    # the passages the question points at, in new-token positions (coverage and guard)
    focus: list[tuple[int, int]] = field(default_factory=list)
    keep_focus: bool = False  # `auto`: the read must keep `focus` in full


def route_prefill(pair, target, layers, tokens: list[int], cached: int, settings, *, asked=()) -> PrefillRoute:
    """The route, without the progress of SpecPrefill's scoring (see route_prefill_steps)."""
    return result_of(route_prefill_steps(pair, target, layers, tokens, cached, settings, asked=asked))


def route_prefill_steps(pair, target, layers, tokens: list[int], cached: int, settings, *, asked=()):
    """A generator of SpecPrefill's scoring progress (when a draft scores); returns the
    PrefillRoute. `asked`: the question kinds the chat's user messages ask besides the
    prompt's end (`asked_kinds`)."""
    sparse_on = settings.sparse_prefill != "off" or settings.uniprefill != "off"
    focus = _focus(target, tokens, cached) if sparse_on else []
    auto = is_auto(settings)
    if auto:
        settings, why = auto_settings(pair, target, tokens, cached, settings, asked=asked)
        if settings is None:
            return PrefillRoute("dense", f"dense: auto: {why}", SparsePlan(None, "off", f"off: {why}"), focus)
    elif "auto" in (settings.sparse_prefill, settings.uniprefill):
        settings = _auto_beside_on(pair, target, tokens, cached, settings, asked)
    route = yield from _route(pair, target, layers, tokens, cached, settings)
    route = replace(route, focus=focus, keep_focus=auto)
    if route.method == "specprefill" and route.keep_focus and route.spec.selection is not None:
        grown = with_runs(route.spec.selection, focus)
        note = f"used: kept {grown.kept} of {grown.total} new tokens (the question's passages included)"
        # the reason is what `brisk run` prints: it must count what was read, as the note does
        route = replace(route, reason=f"specprefill: {note}", spec=replace(route.spec, selection=grown, note=note))
    if auto:
        route = replace(route, reason=f"{route.reason} (auto: {why})")
    return route


def _auto_beside_on(pair, target, tokens: list[int], cached: int, settings, asked):
    """One method forced on, the other `auto`: the forced one runs as asked, and the `auto`
    one still only where the table shows it keeping answers (off elsewhere)."""
    forced, chosen = (
        ("sparse_prefill", "uniprefill") if settings.sparse_prefill == "on" else ("uniprefill", "sparse_prefill")
    )
    alone = replace(settings, **{forced: "off"})
    if auto_settings(pair, target, tokens, cached, alone, asked=asked)[0] is None:
        return replace(settings, **{chosen: "off"})
    return settings


def is_auto(settings) -> bool:
    """`auto` routing: a method set to auto and neither forced on."""
    modes = (settings.sparse_prefill, settings.uniprefill)
    return "auto" in modes and "on" not in modes


def _focus(target, tokens: list[int], cached: int) -> list[tuple[int, int]]:
    if len(tokens) - cached <= QUESTION_TOKENS:
        return []
    regions = prompt_regions(target.tokenizer, tokens)
    return [(max(s - cached, 0), e - cached) for s, e in regions if e > cached]


ASKED_CHARS = 400  # a question's length at most: a longer paragraph is document text
# a document sent with no words typed: no question the doc-qa suite measured (it may ask for
# a summary, which needs every part as a count does); no table row names it: dense
NO_QUESTION = "no_question"
# the last message asks above its document: the suite asks below it (SpecPrefill's draft
# scores by what the last tokens attend to, and the question's passages are found from
# the last words), so no row measured this layout: dense
QUESTION_FIRST = "question_first"
# earlier turns read again with the last (a server request, a reopened chat, after a sparse
# turn): the suite asks one question per prompt, and a follow-up's words ("Are you sure?")
# would steer the scoring and the question's passages: dense
EARLIER_TURNS = "earlier_turns"
TEMPLATE_SLACK = 64  # tokens a chat template adds around one message (and a default system prompt)


def asked_kinds(messages, *, new_tokens: int = 0, count=None) -> tuple[str | None, ...]:
    """The question kinds a chat's user messages ask, beyond the prompt's last words: each
    message's last paragraph (an earlier question: "Are you sure?" asks it again), and its
    first when that is a question (one asked above the document it is about). Attached
    documents aside; a message of attached documents alone asks NO_QUESTION, and the last
    message asking above its document QUESTION_FIRST, and EARLIER_TURNS when the
    `new_tokens` to read hold more than the last message (`count`: its tokens)."""
    from brisk.engine.turn.documents import split_attached

    found: list[str | None] = []
    users = [m for m in messages if m.role == "user"]
    for message in users:
        documents, typed = split_attached(message.content)
        parts = [p.strip() for p in typed.split("\n\n") if p.strip()]
        if documents and not parts:
            found.append(NO_QUESTION)
        if parts and len(parts[0]) <= ASKED_CHARS and parts[0].endswith("?"):
            found.append(quality_table.question_kind(parts[0]))
            if len(parts) > 1 and message is users[-1]:
                found.append(QUESTION_FIRST)
        if parts:
            found.append(quality_table.question_kind(parts[-1][-ASKED_CHARS:]))
    if len(users) > 1 and count is not None and new_tokens > count(users[-1].content) + TEMPLATE_SLACK:
        found.append(EARLIER_TURNS)
    return tuple(found)


def auto_settings(pair, target, tokens: list[int], cached: int, settings, *, table=None, asked=()):
    """`auto`'s settings for this prompt: a fixed sparse setting the quality table allows
    (marked auto-chosen), or (None, why) to read densely."""
    new = len(tokens) - cached
    key = quality_table.model_key(target.config, target.info.parameters)
    draft = quality_table.model_key(pair.draft.config, pair.draft.info.parameters) if pair is not None else None
    question = question_text(target.tokenizer.decode(tokens[-QUESTION_TOKENS:]))
    kind = quality_table.question_kind(question)
    also = tuple(dict.fromkeys(k for k in asked if k != kind))
    kinds = " and ".join(dict.fromkeys(n for k in (kind, *also) for n in ((k,) if k else quality_table.OTHER)))
    # the table measured whole prompts read afresh: the band is the length the model reads,
    # cached prefix included (a 4K document after a long chat is not a 4K prompt)
    band = quality_table.length_band(len(tokens))
    methods, below = set(), []
    if settings.sparse_prefill == "auto" and pair is None:
        below.append("SpecPrefill has no draft")
    elif settings.sparse_prefill == "auto":
        if new >= settings.sparse_threshold:
            methods.add("specprefill")
        else:
            below.append(f"{new} new tokens < SpecPrefill's threshold {settings.sparse_threshold}")
    if settings.uniprefill == "auto" and worth_dropping(new):
        threshold = break_even(settings, target.config)
        if new >= threshold:
            methods.add("uniprefill")
        else:
            below.append(f"{new} new tokens < UniPrefill's break-even {threshold}")
    elif settings.uniprefill == "auto":
        below.append(f"{new} new tokens are too few to drop any")
    if not methods:
        return None, "; ".join(below)
    evidence = quality_table.allowed(key, len(tokens), kind, draft=draft, table=table, methods=methods, also=also)
    if evidence is None:
        return None, f"no doc-qa evidence that sparse prefill keeps {kinds} answers for {key} at {band}"
    shown = f"doc-qa evidence for {kinds} questions at {band}"
    if evidence.method == "specprefill":
        return replace(settings, sparse_prefill="on", sparse_keep=evidence.keep, uniprefill="off"), shown
    # as doc-qa measured it: the model's own p and drop layers, not the chat's
    return replace(settings, sparse_prefill="off", uniprefill="on", uniprefill_p=None, drop_layers=None), shown


def with_runs(selection, extra: list[tuple[int, int]]):
    """`selection` with the `extra` token runs kept too."""
    from brisk.engine.accel.question_focus import merge
    from brisk.engine.accel.specprefill.scoring import Selection

    runs = merge(sorted([*selection.runs, *((s, min(e, selection.total)) for s, e in extra if s < selection.total)]))
    kept = sum(e - s for s, e in runs)
    return Selection(runs, kept, selection.total, kept / max(selection.total, 1))


def _route(pair, target, layers, tokens: list[int], cached: int, settings):
    spec = yield from plan_sparse_prefill(pair, target, layers, tokens, cached, settings)
    if spec.selection is not None:
        return PrefillRoute("specprefill", f"specprefill: {spec.note}", spec)
    if spec.flat:
        return PrefillRoute("dense", f"dense: SpecPrefill's guard ({spec.note})", spec)
    new = len(tokens) - cached
    mode = settings.uniprefill
    if mode == "off":
        return PrefillRoute(
            "dense",
            "dense: sparse prefill off" if settings.sparse_prefill == "off" else f"dense: SpecPrefill {spec.note}",
            spec,
        )
    if not worth_dropping(new):
        return PrefillRoute("dense", f"dense: {new} new tokens are too few to drop any", spec)
    threshold = break_even(settings, target.config)
    if mode == "auto" and new < threshold:
        return PrefillRoute("dense", f"dense: {new} new tokens < UniPrefill's break-even {threshold}", spec)
    return PrefillRoute("uniprefill", f"uniprefill: {mode}, {new} new tokens", spec)
