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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.accel.specprefill.plan import SparsePlan, plan_sparse_prefill
from engine.accel.uniprefill.plan import break_even, worth_dropping
from engine.events import result_of

PrefillMethod = Literal["dense", "specprefill", "uniprefill"]


@dataclass(frozen=True)
class PrefillRoute:
    method: PrefillMethod
    reason: str
    spec: SparsePlan  # SpecPrefill's own plan (its note and timing go to the metrics)


def route_prefill(pair, target, layers, tokens: list[int], cached: int, settings) -> PrefillRoute:
    """The route, without the progress of SpecPrefill's scoring (see route_prefill_steps)."""
    return result_of(route_prefill_steps(pair, target, layers, tokens, cached, settings))


def route_prefill_steps(pair, target, layers, tokens: list[int], cached: int, settings):
    """A generator of SpecPrefill's scoring progress (when a draft scores); returns the PrefillRoute."""
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
