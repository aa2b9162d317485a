"""One speculation autopilot: each cycle, plain decoding, a lookup proposal from the context
(lookup.py), or the draft model (controller.py's k choice), whichever promises the most
tokens per second.

Both sources go through the same cost model: a cycle yields E[τ] = (1 − α^(k+1)) / (1 − α)
tokens for a proposal cost plus a verify pass over k + 1 positions (measured per length,
shared by the sources: it is the target's cost). A draft's proposal costs k draft steps; a
lookup's is counted as free (~7 µs, and the decoder looks it up on every plain step anyway,
to scout), so it pays whenever its acceptance covers the verify pass's extra cost over a
plain step.

Lookup acceptance is measured per match-length class (a 16-token match is a quote in
progress, a 2-token one often a coincidence), and apart for offers that continue a lookup
whose every token was kept (a copy in progress). Besides the lookups' own cycles it is learnt
for free: on every plain step the autopilot checks whether the lookup's first token would have
been the target's, so prose where lookups miss never pays for a verify pass to find out; on
every draft cycle, how many of the target's tokens the lookup would have kept.
"""

from __future__ import annotations

from brisk.engine.accel.speculative.controller import (
    MIN_GAIN,
    PLAIN_SAMPLES_FIRST,
    DraftLengthController,
    expected_tokens,
)
from brisk.engine.accel.speculative.lookup import MATCH_CLASSES, MAX_MATCH, LookupOffer, match_class

LOOKUP_MAX_K = 12  # a quote or a copied file accepts long runs; verify cost bounds it
# Per-token observations fade faster than the draft's per-cycle ones: the same match class
# means "quoting" in one paragraph and "coincidence" in the next.
LOOKUP_DECAY = 0.95
# Acceptance before any observation, as (accepted, rejected) pseudo-counts per class: short
# matches start pessimistic (most are "of the"), long ones at even odds.
LOOKUP_PRIOR = ((0.5, 1.5), (0.8, 1.2), (1.0, 1.0), (1.2, 0.8))
assert len(LOOKUP_PRIOR) == len(MATCH_CLASSES)
# An offer that continues a lookup whose every token was kept (the same place in the context:
# its match grew by the kept tokens and the target's own) has an acceptance of its own, with
# an optimistic prior: a copy in progress mostly goes on. Pooled with its match class, a
# copied file's first lookups were verified 1, 1, 1, 2, 5, 2, 5, 10 tokens at a time while
# 12 would have been kept each time; replayed over SmolLM2's answers, code edit 1.04-1.08x,
# quote 1.03-1.05x, follow-up 1.01-1.05x, summary and prose within 1.2%.
CONTINUATION_PRIOR = (3.0, 0.5)


class SpeculationAutopilot(DraftLengthController):
    """DraftLengthController (the draft's k, probes and scouts) plus the lookup arm."""

    def __init__(self, mode: str, k: int, *, has_draft: bool, lookup: bool, **kw):
        super().__init__(mode, k, **kw)
        self.has_draft, self.lookup = has_draft, lookup
        self.lookup_counts = [list(prior) for prior in LOOKUP_PRIOR]
        self.continuation_counts = list(CONTINUATION_PRIOR)
        self._continues_at: int | None = None  # the match an offer continuing the last lookup has

    def lookup_alpha(self, offer: LookupOffer) -> float:
        accepted, rejected = self._counts_for(offer)
        return accepted / (accepted + rejected)

    def _counts_for(self, offer: LookupOffer) -> list[float]:
        if offer.match == self._continues_at:
            return self.continuation_counts
        return self.lookup_counts[match_class(offer.match)]

    def pick(self, offer: LookupOffer | None, *, draft_usable: bool) -> tuple[str, int]:
        """("lookup" | "draft" | "plain", k) for the next cycle."""
        if offer is not None and self.lookup:
            k, speed = self._best_lookup(offer)
            if k and speed >= self._draft_speed(draft_usable):
                return "lookup", k
        if self.has_draft and draft_usable:
            k = self.choose()
            if k:
                return "draft", k
        return "plain", 0

    def lookup_pays(self, offer: LookupOffer | None) -> bool:
        """Would the autopilot verify this offer (ends a pipelined plain run)?"""
        return offer is not None and self.lookup and self._best_lookup(offer)[0] > 0

    def plain_run(self, *, draft_usable: bool = True, lookup: bool = False) -> int:
        """Plain steps to take before asking again. A lookup offer that pays ends the run
        early (the decoder asks after every token)."""
        if self.has_draft and draft_usable:
            return super().plain_run()
        if lookup and self.plain_samples < PLAIN_SAMPLES_FIRST:
            return PLAIN_SAMPLES_FIRST - self.plain_samples  # t_plain first: the lookup needs it
        return 1 << 30

    def scout_due(self) -> bool:
        return self.has_draft and super().scout_due()

    def _best_lookup(self, offer: LookupOffer) -> tuple[int, float]:
        available = min(len(offer.tokens), LOOKUP_MAX_K)
        if self.mode == "on":
            return min(self.fixed_k, available), float("inf")
        plain = self.t_plain.value
        if plain is None or self.plain_samples < PLAIN_SAMPLES_FIRST:
            return 0, 0.0
        alpha = self.lookup_alpha(offer)
        best_k, best_speed = 0, MIN_GAIN / plain
        for k in range(1, available + 1):
            speed = expected_tokens(alpha, k) / self.verify_time(k)
            if speed > best_speed:
                best_k, best_speed = k, speed
        return best_k, best_speed

    def _draft_speed(self, draft_usable: bool) -> float:
        """The draft's best expected tokens per second while it is known to pay, else 0."""
        if self.mode == "on" or not (
            self.has_draft and draft_usable and self.drafting and self.t_draft.value is not None
        ):
            return 0.0  # (`on` takes a lookup offer first, its draft otherwise)
        return max(self.expected_speed(k) for k in range(1, self.k_cap + 1))

    def observe_lookup_scout(self, offer: LookupOffer, token: int) -> None:
        """A plain step chose `token` where the lookup would have proposed offer.tokens[0]."""
        self._continues_at = None  # a plain step came between: no lookup to continue
        self._observe_lookup(offer, int(offer.tokens[0] == token), int(offer.tokens[0] != token))

    def observe_lookup_outcome(self, offer: LookupOffer, tokens: list[int]) -> None:
        """A draft cycle produced `tokens` (the target's own, as a plain run would have) where
        `offer` stood: how many of them the lookup would have kept, for free. While the draft's
        cycles run no plain step scouts the lookup, and a lookup left at its prior never beat
        the draft: on structured output Qwen-1.5B drafted (31-32 tok/s) where lookups alone ran
        at 36-38."""
        limit = min(len(offer.tokens), len(tokens), LOOKUP_MAX_K)
        kept = 0
        while kept < limit and offer.tokens[kept] == tokens[kept]:
            kept += 1
        self._continues_at = None
        self._observe_lookup(offer, kept, 1 if kept < limit else 0)

    def observe_lookup_cycle(self, offer: LookupOffer, *, proposed: int, accepted: int, verify_s: float) -> None:
        self._observe_lookup(offer, accepted, 1 if accepted < proposed else 0)
        self.observe_verify(proposed, verify_s)
        # kept whole: the next offer from the same place has a match this much longer
        self._continues_at = min(offer.match + accepted + 1, MAX_MATCH) if accepted == proposed else None

    def _observe_lookup(self, offer: LookupOffer, accepted: int, rejected: int) -> None:
        counts = self._counts_for(offer)
        fade = LOOKUP_DECAY ** (accepted + rejected)
        counts[0] = fade * counts[0] + accepted
        counts[1] = fade * counts[1] + rejected

    def note(self) -> str:
        return super().note() if self.has_draft else ""
