"""The speculative decoder's draft cycle: a draft model (drafters.py) proposes up to k
tokens, the loop's verify pass keeps a prefix of them plus one token of the target's own.

Besides the cycle it keeps what only the draft needs: whether the draft is started, or
dropped for the turn; what reading the tokens it missed costs (its catch-up), and whether
that can pay back before the answer ends.
"""

from __future__ import annotations

import logging

from brisk.engine.accel.speculative.cycle import Loop, Step, weak
from brisk.engine.accel.speculative.drafters import (
    DraftUnavailable,
    Proposal,
    SameTokenizerDrafter,
    TranslatingDrafter,
)
from brisk.engine.accel.speculative.lookup import LookupOffer
from brisk.engine.accel.speculative.rewind import CannotRewind
from brisk.engine.api.events import EngineWarned

log = logging.getLogger(__name__)

# `auto` starts a draft only if its prompt catch-up is at most this many times the answer
# budget: catching up costs ~c/20 of a target step per token (batched), a speedup of 1.2x
# saves ~0.17 step per answer token, so it breaks even near 10x.
AUTO_MAX_CATCH_UP = 8
# A draft's catch-up (reading the tokens it missed) is timed, and weighed, from this many
# tokens: a batched pass worth pricing per token (fewer, the next proposal feeds anyway).
CATCH_UP_FROM = 8
# Before a turn has measured the draft's acceptance, a catch-up to scout it may read at most
# this share of the tokens left to answer (exploring; later ones must pay back). Counted in
# tokens, not timed: a small draft's per-token catch-up timing carries its call overheads.
EXPLORE_SHARE = 0.25
PACE_DECAY = 0.8  # per plain run or lookup cycle, in the pace a catch-up is weighed against

Drafter = SameTokenizerDrafter | TranslatingDrafter


class DraftCycle:
    """The draft model's cycles for one turn, and whether the draft can still serve it."""

    def __init__(self, loop: Loop, drafter: Drafter):
        self.loop, self.drafter = weak(loop), drafter
        self.ready = False  # started: the draft holds the prompt
        self.failed = False  # dropped for the turn (or never worth starting)
        self.catch_up_s: float | None = None  # the draft's reading of missed tokens, per token
        self.alpha_this_turn = False  # a scout or a draft cycle has measured α in this turn
        # seconds and tokens of the turn's recent decoding without the draft (plain, lookups)
        self._pace = [0.0, 0.0]

    def run(self, sequence: list[int], k: int, offer: LookupOffer | None = None) -> list[Step]:
        """One draft cycle of up to `k` tokens; `offer` is what the lookup proposed here (told
        to the autopilot: no plain step scouts the lookup while the draft's cycles run)."""
        if self.drafter.unseen() >= CATCH_UP_FROM:
            self._read_unseen()
            if self.failed:
                return [(self.loop._plain(sequence), "")]
        started = self.loop.now()
        proposal: Proposal | None = self.call(self.drafter.propose, k, self.loop.controller.stop_below())
        if proposal is None:
            return [(self.loop._plain(sequence), "")]
        drafted_at = self.loop.now()
        self.loop.stats.draft_s += drafted_at - started
        if not proposal.tokens:  # absorbed by context or an immediate EOS: a plain step, no stall
            self.call(self.drafter.commit, proposal, 0, self.loop._plain(sequence, tell_draft=False))
            return [(sequence[-1], "")]
        n, token, verified = self.loop._verify(sequence, proposal)
        committed_at = self.loop.now()
        self.call(self.drafter.commit, proposal, n, token)
        # following the target (a trim, or re-tokenizing across tokenizers) is the draft's cost
        draft_s = drafted_at - started + self.loop.now() - committed_at
        self.loop.stats.draft_s += self.loop.now() - committed_at
        self._record(proposal, k, n, draft_s, verified)
        produced = proposal.tokens[:n] + [token]
        if offer is not None:  # what the lookup would have kept of them (no plain step scouts it now)
            self.loop.controller.observe_lookup_outcome(offer, produced)
        return [(t, "draft" if i < n else "") for i, t in enumerate(produced)]

    def _record(self, proposal: Proposal, k: int, n: int, draft_s: float, verify_s: float) -> None:
        """A verified cycle's counts for the metrics and its costs for the autopilot."""
        s = self.loop.stats
        s.draft_cycles += 1
        self.alpha_this_turn = True
        s.draft_tokens += len(proposal.tokens)
        s.accepted_tokens += n
        s.k_total += k
        self.loop.controller.observe_cycle(
            drafted=proposal.drafted, proposed=len(proposal.tokens), accepted=n, draft_s=draft_s, verify_s=verify_s
        )

    def usable(self, left: int) -> bool:
        return not self.failed and self.catch_up_pays(left)

    def worth_starting(self, prompt: list[int], max_tokens: int) -> bool:
        """`auto` skips a draft that cannot pay, or that would first have to read far more
        new prompt than the answer can be long (a long pasted document, a short answer)."""
        if not self.loop.controller.could_pay():
            return False
        catch_up = self.drafter.catch_up(prompt)
        if catch_up > AUTO_MAX_CATCH_UP * max_tokens:
            self.failed = True
            self.loop.stats.status = (
                f"off: the draft would first read {catch_up} new prompt tokens for at most {max_tokens} answer tokens"
            )
            return False
        return True

    def start(self, prompt: list[int], sequence: list[int]) -> EngineWarned | None:
        """The draft reads the prompt and the answer so far; a warning if it cannot."""
        started, read = self.loop.now(), 0
        try:
            read = self.drafter.start(prompt)
            if len(sequence) > len(prompt):
                self.drafter.observe_tokens(sequence[len(prompt) :])
            self.ready = True
            return None
        except Exception as exc:
            return self.drop(exc)
        finally:
            elapsed = self.loop.now() - started
            self.loop.stats.draft_prefill_s += elapsed
            self._time_catch_up(elapsed, read)

    def maybe_scout(self) -> None:
        """Score the draft on the target's recent tokens when a probe is due. A translating
        draft's scout counts hits in its own tokens over the target's text, which overstated
        acceptance (0.62-0.84 scouted, ~0.45 kept in cycles, code, SmolLM2 -> Qwen): it
        probes with real cycles instead."""
        if self.ready and self.drafter.same_tokenizer and self.loop.controller.scout_due():
            self._scout()

    def _scout(self) -> None:
        """The draft reads the target's plain tokens it has not seen and says how many it
        would have proposed: α for the controller, without a target pass."""
        started = self.loop.now()
        scored = self.call(self.drafter.scout)
        elapsed = self.loop.now() - started
        self.loop.stats.draft_s += elapsed
        if scored:
            self._time_catch_up(elapsed, scored[1])
            self.alpha_this_turn = True
            self.loop.stats.scouted += scored[1]
            self.loop.controller.observe_scout(*scored)

    def _read_unseen(self) -> None:
        """The draft reads the tokens it missed (plain steps, lookups) before it proposes,
        timed as a catch-up. Read in the proposal's first step, their cost counted as
        drafting: after a follow-up's lookups a 0.5B draft's step measured 4.9x its 1.5B
        target's, which `auto` kept (and stored) as "drafting cannot pay"."""
        started = self.loop.now()
        read = self.call(self.drafter.read_unseen)
        elapsed = self.loop.now() - started
        self.loop.stats.draft_s += elapsed
        if read:
            self._time_catch_up(elapsed, read)

    def observe(self, tokens: list[int]) -> None:
        """The target took `tokens` without the draft (a plain step): the draft follows."""
        if self.ready:
            self.call(self.drafter.observe_tokens, tokens)

    def observe_timed(self, tokens: list[int]) -> None:
        """As `observe`, its cost counted as drafting (a lookup's kept tokens)."""
        if self.ready:
            followed_at = self.loop.now()
            self.call(self.drafter.observe_tokens, tokens)
            self.loop.stats.draft_s += self.loop.now() - followed_at

    def _time_catch_up(self, seconds: float, tokens: int) -> None:
        if tokens >= CATCH_UP_FROM:
            self.catch_up_s = seconds / tokens

    def catch_up_pays(self, left: int) -> bool:
        """May `auto` use the draft now? After a plain stretch the draft must first read
        every token it missed (one batched pass, before its scout or its first proposal):
        on code, a 0.5B draft's catch-ups after 64- and 105-token plain runs cost Qwen-1.5B
        12% of a turn it never drafted in. Worth it only while drafting the rest of the
        answer at the acceptance measured so far would win back more than the reading costs.
        Until this turn has measured α (a scout or a cycle; the conversation's α may be
        another content's), a catch-up may explore if it reads at most EXPLORE_SHARE of the
        tokens left: 66 tokens into a follow-up, all looked up, a 0.5B draft's first scout read
        them for 0.31 s (the 1.5B target's step: ~40 ms), and no draft then beat a lookup."""
        if self.loop.controller.mode != "auto":
            return True
        missed = self.drafter.unseen()
        if missed < CATCH_UP_FROM:
            return True
        if not self.alpha_this_turn:
            return missed <= EXPLORE_SHARE * left
        if self.catch_up_s is None:
            return True
        # against what decoding without the draft has been costing: where lookups carry the
        # answer the draft must beat them, not plain steps (a follow-up's second scout read
        # looked-up tokens for 0.35 s, for a draft that then never beat a lookup)
        pace = self._pace[0] / self._pace[1] if self._pace[1] else None
        return missed * self.catch_up_s < left * self.loop.controller.saving_per_token(pace)

    def note_pace(self, seconds: float, tokens: int) -> None:
        """Decoding without the draft took `seconds` for `tokens` (recent events weigh more)."""
        self._pace = [PACE_DECAY * self._pace[0] + seconds, PACE_DECAY * self._pace[1] + tokens]

    def call(self, method, *args):
        """`method(*args)` on the drafter; a failure drops the draft (and says so), returning None."""
        try:
            return method(*args)
        except Exception as exc:
            self.loop.warnings.append(self.drop(exc))
            return None

    def drop(self, exc: Exception) -> EngineWarned:
        """The draft costs speed, never the answer: decode the rest of the turn without it."""
        if isinstance(exc, (DraftUnavailable, CannotRewind)):
            reason = str(exc)
        else:
            log.exception("draft model failed")
            reason = f"the draft failed: {exc}"
        self.failed, self.ready = True, False
        self.drafter.tc.reset()  # it may hold half a proposal
        self.loop.stats.status = f"lookup only: {reason}" if self.loop.looks_up else f"off: {reason}"
        return EngineWarned(f"The draft model is off for this turn: {reason}", "spec_decode")
