"""The speculative decoder's lookup cycle: the context's continuation (lookup.py) is the
proposal, and the loop's verify pass keeps a prefix of it plus one token of the target's.

It owns the conversation's index and the offer looked up at the current length: the loop
asks for the offer at every step (to pick a cycle, to end a plain run, to scout the lookup's
acceptance for free), and the index answers once per length.
"""

from __future__ import annotations

from typing import Callable

from brisk.engine.accel.speculative.autopilot import LOOKUP_MAX_K
from brisk.engine.accel.speculative.cycle import Loop, Step, weak
from brisk.engine.accel.speculative.drafters import Proposal
from brisk.engine.accel.speculative.lookup import ContextIndex, LookupOffer


class LookupCycle:
    def __init__(self, loop: Loop, index: ContextIndex, draft_follows: Callable[[list[int]], None] | None):
        """`draft_follows`: tells the draft model the tokens a cycle kept (None: no draft)."""
        self.loop, self.index, self.draft_follows = weak(loop), index, draft_follows
        self._offer_at = -1  # the context length the offer below was looked up at
        self._offer: LookupOffer | None = None

    def offer(self) -> LookupOffer | None:
        """What the context proposes after the current tokens (looked up once per length)."""
        if self._offer_at != len(self.index):
            self._offer_at, self._offer = len(self.index), self.index.propose(LOOKUP_MAX_K)
        return self._offer

    def run(self, sequence: list[int], k: int, offer: LookupOffer | None) -> list[Step]:
        """Verify the first `k` tokens of `offer`."""
        if offer is None:
            raise ValueError("a lookup cycle needs an offer")
        proposal = Proposal(offer.tokens[:k], None, 0)
        n, token, verified = self.loop._verify(sequence, proposal)
        if self.draft_follows is not None:
            self.draft_follows(proposal.tokens[:n] + [token])
        stats = self.loop.stats
        stats.lookup_tokens += k
        stats.lookup_accepted += n
        self.loop.controller.observe_lookup_cycle(offer, proposed=k, accepted=n, verify_s=verified)
        self.loop._note_pace(verified, n + 1)
        return [(t, "lookup" if i < n else "") for i, t in enumerate(proposal.tokens[:n] + [token])]
