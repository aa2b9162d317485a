"""What the speculative decoder's loop and the cycles it runs share.

The loop (decoder.py) owns the target side: its cache and how many tokens of the answer it
holds, the sampler, the autopilot, the turn's metrics and the clock. Each cycle strategy
(plain_run.py, draft_cycle.py, lookup_cycle.py) decides what the target reads next and
calls back into the loop for the target's steps; `Loop` lists those calls. Some keep the
private names tests/engine reach them by (they replace or spy on them).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

import mlx.core as mx

from brisk.engine.accel.speculative.autopilot import SpeculationAutopilot
from brisk.engine.accel.speculative.drafters import Proposal
from brisk.engine.accel.speculative.lookup import LookupOffer
from brisk.engine.api.events import EngineWarned
from brisk.engine.decode.sampling import TokenDistribution

# (token, source): source is "draft", "lookup" or "" (the target's own token)
Step = tuple[int, str]


@dataclass
class SpecStats:
    cycles: int = 0  # cycles that verified at least one proposed token (either source)
    plain_steps: int = 0
    draft_cycles: int = 0
    draft_tokens: int = 0  # target tokens the draft model proposed for verification
    accepted_tokens: int = 0  # of those, kept
    lookup_tokens: int = 0  # tokens the context lookup proposed
    lookup_accepted: int = 0
    k_total: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    plain_s: float = 0.0
    draft_prefill_s: float = 0.0
    scouted: int = 0  # target tokens the draft scored between probes
    status: str = "off"
    sources: list[str] = field(default_factory=list)  # per yielded token: "draft", "lookup" or "" (the target's)

    def to_metrics(self) -> dict:
        produced = len(self.sources)
        busy = self.draft_s + self.verify_s + self.plain_s
        return {
            "spec_decode": self.status,
            "acceptance_rate": self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "lookup_tokens": self.lookup_tokens,
            "lookup_accepted": self.lookup_accepted,
            "lookup_acceptance": self.lookup_accepted / self.lookup_tokens if self.lookup_tokens else 0.0,
            "mean_accepted_run": ((self.accepted_tokens + self.lookup_accepted) / self.cycles) if self.cycles else 0.0,
            "tokens_per_cycle": (produced / (self.cycles + self.plain_steps)) if produced else 0.0,
            "mean_k": self.k_total / self.draft_cycles if self.draft_cycles else 0.0,
            "draft_time_share": self.draft_s / busy if busy else 0.0,
            "draft_prefill_s": self.draft_prefill_s,
        }


class Cycle(Protocol):
    """One way to produce the next tokens: `k` is a plain run's length or a proposal's size,
    `offer` what the context proposes now (None: nothing, or lookup is off)."""

    def run(self, sequence: list[int], k: int, offer: LookupOffer | None) -> Iterable[Step]: ...


class Loop(Protocol):
    """The loop's state and target steps, as its cycles use them."""

    model: Callable[..., Any]  # the target, through the prompt cache's view (shifted positions)
    cache: list[Any]  # the target's cache layers
    dist: TokenDistribution
    controller: SpeculationAutopilot
    stats: SpecStats
    warnings: list[EngineWarned]

    @property
    def looks_up(self) -> bool: ...

    def now(self) -> float: ...

    def read_token(self, token: mx.array) -> int: ...

    def _lookup_offer(self) -> LookupOffer | None: ...

    def _plain(self, sequence: list[int], *, tell_draft: bool = True) -> int: ...

    def _queue_step(self, token: mx.array) -> mx.array: ...

    def _after_plain(
        self, sequence: list[int], token: int, elapsed: float, *, tell_draft: bool = True, timed: bool = True
    ) -> None: ...

    def _verify(self, sequence: list[int], proposal: Proposal) -> tuple[int, int, float]: ...

    def _note_pace(self, seconds: float, tokens: int) -> None: ...


def weak(loop: Loop) -> Loop:
    """How a cycle holds its loop: weakly. The loop owns its cycles, and a strong reference
    back made each turn's decoder a reference cycle, kept (with its arrays) until Python's
    cyclic collector ran: measured on tiny models, 65-200 KB of MLX memory more per turn."""
    return weakref.proxy(loop)
