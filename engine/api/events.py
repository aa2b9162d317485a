"""Typed events the engine yields. The GUI and the CLI consume the same ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union


@dataclass(frozen=True)
class PrefillProgressed:
    done: int
    total: int
    phase: str = "prompt"  # a PrefillPhase (engine/api/literal_types.py): what `done` of `total` counts
    # Seconds this phase has left, estimated by engine/turn/prefill_eta.py from its chunks so far
    # (None: not measurable yet, or a phase that does not count tokens)
    seconds_left: float | None = None


@dataclass(frozen=True)
class TokenEmitted:
    text: str  # exact text delta: may be "" while a multi-byte character is incomplete
    token_id: int
    source: str = ""  # a speculated token the target kept: "draft" (the draft model) or "lookup" (the context)


@dataclass(frozen=True)
class ContextTruncated:
    dropped_messages: int
    prompt_tokens: int


@dataclass(frozen=True)
class TurnFinished:
    text: str
    token_ids: list[int]
    metrics: Any  # brisk.engine.api.metrics.TurnMetrics


@dataclass(frozen=True)
class EngineErrored:
    message: str
    kind: str = "error"
    detail: str = ""


@dataclass(frozen=True)
class EngineWarned:
    """Something degraded but the turn goes on (e.g. sparse prefill fell back to full)."""

    message: str
    kind: str = "warning"


@dataclass(frozen=True)
class DownloadProgressed:
    repo_id: str
    done_bytes: int
    total_bytes: int
    file: str = ""


@dataclass(frozen=True)
class ModelLoaded:
    model_id: str
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelLoadProgressed:
    """A step of loading a model: on first run, downloading and converting the default."""

    model_id: str
    message: str


# Everything a turn or a model operation reports, as one declared type.
EngineEvent = Union[
    PrefillProgressed,
    TokenEmitted,
    ContextTruncated,
    TurnFinished,
    EngineErrored,
    EngineWarned,
    DownloadProgressed,
    ModelLoaded,
    ModelLoadProgressed,
]


def result_of(steps):
    """Run a generator of events to its end, dropping the events: its return value (for
    callers that do not show progress, such as benches)."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
