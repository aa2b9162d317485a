"""Whether SpecPrefill runs this turn, and on which chunks: a plan the session applies.

The plan is data: the selection (or None for a full prefill), what happened in words and
as a `SparseOutcome`, the scoring time, and a warning when something failed (a failure
costs speed, never the turn).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from mlx_lm.models.cache import RotatingKVCache

from brisk.engine.accel.positions import install_position_shift
from brisk.engine.accel.specprefill.scoring import CHUNK, Selection, SparsePrefillDeclined, select_chunks
from brisk.engine.api.literal_types import SparseOutcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SparsePlan:
    selection: Selection | None  # None: prefill densely
    outcome: SparseOutcome
    note: str  # what happened, for the metrics and the dashboard
    scoring_s: float = 0.0
    warning: str = ""  # set when sparse prefill failed and fell back
    flat: bool = False  # declined by the guard against exhaustive tasks


def plan_sparse_prefill(pair, target, layers, tokens: list[int], cached: int, settings):
    """The plan for prefilling `tokens[cached:]` with `pair` (a DraftPair, or None): a
    generator of the draft's progress events that returns the SparsePlan."""
    mode, new = settings.sparse_prefill, len(tokens) - cached
    if mode == "off":
        return SparsePlan(None, "off", "off")
    if pair is None:
        return SparsePlan(None, "off", "off: no draft model")
    if mode == "auto" and new < settings.sparse_threshold:
        return SparsePlan(None, "off", f"off: {new} new tokens < threshold {settings.sparse_threshold}")
    if new < 2 * CHUNK:
        return SparsePlan(None, "off", "off: too few new tokens")
    started = time.perf_counter()
    try:
        importance = yield from pair.importance_steps(tokens, cached, settings.prefill_step_size)
        window = max((c.max_size for c in layers if isinstance(c, RotatingKVCache)), default=None)
        selection = select_chunks(importance, keep=None if mode == "auto" else settings.sparse_keep, window=window)
        install_position_shift(target.model)
    except SparsePrefillDeclined as exc:
        return SparsePlan(None, "declined", str(exc), time.perf_counter() - started, flat=exc.flat)
    except Exception as exc:  # any failure here costs speed, never the turn
        log.warning("sparse prefill fell back to full prefill: %s", exc)
        return SparsePlan(
            None,
            "fallback",
            f"fallback: {exc}",
            time.perf_counter() - started,
            warning=f"Sparse prefill unavailable, running a full prefill: {exc}",
        )
    return SparsePlan(
        selection, "used", f"used: kept {selection.kept} of {selection.total} new tokens", time.perf_counter() - started
    )
