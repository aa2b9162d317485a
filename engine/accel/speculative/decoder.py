"""Speculative decoding with exact sampling (Leviathan et al. 2023; Chen et al. 2023).

Each cycle a draft model (drafters.py) or the context itself (lookup.py) proposes tokens,
the target scores all of them in one forward pass, and an acceptance rule keeps a prefix
of them plus one token of the target's own, so the output has exactly the target's
distribution:

- `rejection` (same tokenizer): accept draft token x with probability min(1, p(x)/q(x));
  on the first rejection sample from normalize(max(p − q, 0)); when all are accepted take
  a bonus token from p. Acceptance per token is Σ min(p, q).
- `match` (cross tokenizer, or by choice): sample the target's own token t ~ p at each
  position and accept the draft token while it equals t. Exact too, but acceptance is
  Σ p·q, lower than rejection's (mlx-lm's rule). Translated drafts have no q over the
  target's vocabulary, so this is the rule that stays exact for them. For a lookup
  proposal (q one-hot) it is rejection sampling itself: x is kept with probability p(x),
  and a rejected position's token is p with x removed, renormalized.

p and q come after the same sampling transforms (engine/decode/sampling.py). At temperature 0
both rules reduce to greedy: the output is token for token the target's greedy output.

This module is the loop: it owns the target's side (cache, position, sampler, metrics),
asks the autopilot (autopilot.py) which cycle comes next, and runs it: a plain run
(plain_run.py), a draft cycle (draft_cycle.py) or a lookup cycle (lookup_cycle.py). The
target's cache is rolled back after each verify pass (rewind.py).
"""

from __future__ import annotations

import logging
import time
from typing import Generator, Iterable

import mlx.core as mx

from brisk.engine.accel.speculative.autopilot import SpeculationAutopilot
from brisk.engine.accel.speculative.cycle import SpecStats, Step
from brisk.engine.accel.speculative.draft_cycle import DraftCycle, Drafter
from brisk.engine.accel.speculative.drafters import Proposal
from brisk.engine.accel.speculative.lookup import ContextIndex, LookupOffer
from brisk.engine.accel.speculative.lookup_cycle import LookupCycle
from brisk.engine.accel.speculative.plain_run import PlainRun
from brisk.engine.accel.speculative.rewind import CacheCheckpoint, CannotRewind
from brisk.engine.api.events import EngineWarned
from brisk.engine.decode.compiled import why_not_compiled
from brisk.engine.decode.dispatch_ahead import dispatching_ahead
from brisk.engine.decode.sampling import TokenDistribution, sample
from brisk.engine.runtime.mx_values import float_list, int_list, item_float, item_int

__all__ = ["ACCEPTANCE_RULES", "SpecStats", "SpeculativeDecoder", "accept_match", "accept_rejection"]

log = logging.getLogger(__name__)

ACCEPTANCE_RULES = ("rejection", "match")


def accept_rejection(p: mx.array, q: mx.array, tokens: list[int]) -> tuple[int, int]:
    """Rejection sampling. p: (m+1, V) target, q: (m, V) draft. Returns (accepted, next token)."""
    m = len(tokens)
    idx = mx.array(tokens)
    rows = mx.arange(m)
    p_x, q_x, u = p[rows, idx], q[rows, idx], mx.random.uniform(shape=(m,))
    mx.eval(p_x, q_x, u)
    p_list, q_list, u_list = float_list(p_x), float_list(q_x), float_list(u)
    n = 0
    # u < p/q without dividing: a q that underflowed to 0 accepts whenever p > 0
    while n < m and u_list[n] * q_list[n] < p_list[n]:
        n += 1
    if n == m:
        return n, item_int(sample(p[m : m + 1]))
    residual = mx.maximum(p[n] - q[n], 0.0)
    mass = item_float(residual.sum())
    if mass <= 1e-12:  # p == q at this position (cannot reject then, but guard rounding)
        return n, item_int(sample(p[n : n + 1]))
    return n, item_int(sample((residual / mass)[None]))


def accept_match(p: mx.array, tokens: list[int], greedy: bool) -> tuple[int, int]:
    """Sample the target's own token at each position; keep drafts while they agree."""
    own = int_list(mx.argmax(p, axis=-1) if greedy else sample(p))
    n = 0
    while n < len(tokens) and own[n] == tokens[n]:
        n += 1
    return n, own[n]


class SpeculativeDecoder:
    """Yields (token, source) like mlx-lm's generate_step, source being "draft", "lookup" or
    "" (the target's own token), and nothing else: when the draft drops out, an
    EngineWarned goes to `warnings`, a side channel the session drains. When the consumer
    stops, the target's cache holds the yielded tokens (the last one only if a pipelined
    step already read it), and the decoder says so in `cache.tokens` itself (the next
    turn's prompt cache picks up from there); a cache it cannot bring back is reset.
    `drafter` may be None (lookup only); `index` None turns lookup off."""

    def __init__(
        self,
        model,
        cache,
        drafter: Drafter | None,
        controller: SpeculationAutopilot,
        dist: TokenDistribution,
        *,
        rule: str = "rejection",
        max_tokens: int,
        index: ContextIndex | None = None,
    ):
        if rule not in ACCEPTANCE_RULES:
            raise ValueError(f"acceptance rule must be one of {ACCEPTANCE_RULES}")
        if rule == "rejection" and drafter is not None and not drafter.same_tokenizer:
            rule = "match"  # no q over the target's vocabulary: the exact rule across tokenizers
        # `cache` is the target's PromptCache; the decoder runs on its layers and leaves its
        # token list true when it stops. `model` is the cache's view (shifted positions).
        self.model, self.prompt_cache, self.cache = model, cache, cache.layers
        self.controller, self.dist, self.rule, self.max_tokens = controller, dist, rule, max_tokens
        how = {(True, False): "lookup", (False, True): rule, (True, True): f"lookup + draft, {rule}"}
        self.stats = SpecStats(status=f"{controller.mode} ({how[index is not None, drafter is not None]})")
        self.consistent = True  # False: the cache could not be brought back; drop it
        self.warnings: list[EngineWarned] = []  # degradations, in order, for the caller to report
        self._held = 0  # tokens of the answer's sequence in the target's cache (set per turn)
        # the cycles, each with the state only it needs
        self.plain = PlainRun(self, cache.model, why_not_compiled)
        self.draft = DraftCycle(self, drafter) if drafter is not None else None
        follows = self.draft.observe_timed if self.draft is not None else None
        self.lookup = LookupCycle(self, index, follows) if index is not None else None

    def metrics(self) -> dict:
        """The turn's speculation metrics, with the draft step's cost in target steps when
        both were measured (the app ranks drafts by it; 0.0 when not measured)."""
        draft, plain = self.controller.t_draft.value, self.controller.t_plain.value
        return {
            **self.stats.to_metrics(),
            "draft_cost_ratio": draft / plain if draft and plain else 0.0,
            "decode_step": self.plain.decode_step(),  # how plain runs stepped (none ran: "")
        }

    # --- the loop ---------------------------------------------------------------------

    def steps(self, prompt: list[int]) -> Generator[Step, None, None]:
        sequence = list(prompt)
        self._held = len(prompt) - 1
        if self.lookup is not None:
            self.lookup.index.sync(prompt)  # the conversation so far; an edit or a regenerate trims it
        yielded = 0
        try:
            self._begin(prompt, sequence)
            while (left := self.max_tokens - (len(sequence) - len(prompt))) > 0:
                for token, source in self._next_cycle(prompt, sequence, left):
                    self.stats.sources.append(source)
                    yielded += 1
                    yield token, source
        finally:
            self._finish(prompt, sequence, yielded)

    def _begin(self, prompt: list[int], sequence: list[int]) -> None:
        """Speculate only on a cache that can be rewound. The draft reads the prompt before
        the first token (like the target's prefill, it counts in TTFT), unless `auto`
        already knows this draft cannot pay."""
        try:
            CacheCheckpoint.check(self.cache)
        except CannotRewind as exc:
            self._cannot_rewind(exc)
            return
        draft = self.draft
        if draft is None or draft.failed:
            return
        if self.controller.mode == "on" or draft.worth_starting(prompt, self.max_tokens):
            self._start_draft_or_warn(prompt, sequence)

    def _cannot_rewind(self, exc: CannotRewind) -> None:
        """Decode plainly: every proposal would need its rejected tokens taken back out."""
        if self.draft is not None:
            self.draft.failed = True
        self.lookup = None
        self.stats.status = f"off: {exc}"
        if self.draft is not None or self.controller.mode == "on":  # asked for explicitly
            self.warnings.append(
                EngineWarned(f"Speculative decoding needs a cache it can rewind: {exc}", "spec_decode")
            )

    def _next_cycle(self, prompt: list[int], sequence: list[int], left: int) -> Iterable[Step]:
        """The autopilot picks the next cycle (here only); the loop runs it."""
        usable = self._draft_usable(left)
        offer = self._lookup_offer()
        source, k = self.controller.pick(offer, draft_usable=usable)
        k = min(k, left - 1)
        if source == "draft" and k > 0 and not self._draft_ready:
            k = k if self._start_draft_or_warn(prompt, sequence) else 0
        if source == "lookup" and k > 0 and offer is not None:
            return self._lookup_cycle(sequence, offer, k)
        if source == "draft" and k > 0:
            return self._draft_cycle(sequence, k, offer)
        run = self.controller.plain_run(draft_usable=usable, lookup=self.looks_up)
        return self._plain_run(sequence, min(run, left))

    def _draft_usable(self, left: int) -> bool:
        """May the draft serve the next cycle? When it may and a probe is due, it scouts first."""
        if self.draft is None or not self.draft.usable(left):
            return False
        self.draft.maybe_scout()
        return True

    def _start_draft_or_warn(self, prompt: list[int], sequence: list[int]) -> bool:
        warning = self._start_draft(prompt, sequence)
        if warning:
            self.warnings.append(warning)
        return warning is None

    def _finish(self, prompt: list[int], sequence: list[int], yielded: int) -> None:
        # Every yielded token but the last is in the cache, and the last too when a
        # pipelined step already read it (as in mlx-lm's generate_step): keep those.
        keep = min(self._held, len(prompt) + yielded)
        self._keep_yielded(keep, self._held)
        if self.consistent:
            self.prompt_cache.tokens = sequence[:keep]
        else:
            self.prompt_cache.reset()
        if self.controller.note():
            self.stats.status += f": {self.controller.note()}"

    def _keep_yielded(self, keep: int, held: int) -> None:
        """Trim the target cache to the yielded tokens but the last, when the consumer stopped early."""
        drop = held - keep
        if drop <= 0:
            return
        if all(layer.is_trimmable() for layer in self.cache):
            for layer in self.cache:
                layer.trim(drop)
        else:
            self.consistent = False

    # --- the target's side, as the cycles use it (cycle.Loop) -------------------------

    @property
    def looks_up(self) -> bool:
        return self.lookup is not None

    def now(self) -> float:
        # this module's `time`: distributed ranks pin it to rank 0's clock (lockstep.py)
        return time.perf_counter()

    def read_token(self, token: mx.array) -> int:
        return item_int(token)

    def _lookup_offer(self) -> LookupOffer | None:
        """What the context proposes after the current tokens (None: lookup is off)."""
        return self.lookup.offer() if self.lookup is not None else None

    def _queue_step(self, token: mx.array) -> mx.array:
        """The target reads `token` (by the plain run's compiled step when one is open);
        its next token is queued, not read back."""
        logits = self.plain.step_logits(token)
        self._held += 1
        nxt = mx.argmax(logits, axis=-1) if self.dist.greedy else self.dist.draw(logits, [], [])
        mx.async_eval(nxt)
        return nxt

    def _plain(self, sequence: list[int], *, tell_draft: bool = True) -> int:
        """One target step, read back at once."""
        started = self.now()
        with dispatching_ahead(self.cache):
            logits = self.model(mx.array(sequence[-1:])[None], cache=self.cache)[0]  # (1, V)
        self._held += 1
        token = self._sample_one(logits, sequence)
        self._after_plain(sequence, token, self.now() - started, tell_draft=tell_draft)
        return token

    def _after_plain(
        self, sequence: list[int], token: int, elapsed: float, *, tell_draft: bool = True, timed: bool = True
    ) -> None:
        offer = self._lookup_offer()
        if offer is not None:  # would the lookup have proposed it? (α for free)
            self.controller.observe_lookup_scout(offer, token)
        self._extend(sequence, [token])
        self.stats.plain_steps += 1
        self.stats.plain_s += elapsed
        if timed:
            self.controller.observe_plain(elapsed)
            self._note_pace(elapsed, 1)
        if tell_draft and self.draft is not None:
            self.draft.observe([token])

    def _extend(self, sequence: list[int], tokens: list[int]) -> None:
        sequence += tokens
        if self.lookup is not None:
            self.lookup.index.extend(tokens)

    def _note_pace(self, seconds: float, tokens: int) -> None:
        """Decoding without the draft took `seconds` for `tokens`: what a draft must beat."""
        if self.draft is not None:
            self.draft.note_pace(seconds, tokens)

    def _sample_one(self, logits: mx.array, sequence: list[int]) -> int:
        if self.dist.greedy:
            return item_int(mx.argmax(self.dist.process(logits, sequence, []), axis=-1))
        return item_int(self.dist.draw(logits, sequence, []))

    def _verify(self, sequence: list[int], proposal: Proposal) -> tuple[int, int, float]:
        """One target pass over the proposal: (tokens kept, the target's next token, seconds).
        `sequence` and the cache then hold the kept tokens and that token."""
        started = self.now()
        candidates = proposal.tokens
        feed = sequence[-1:] + candidates
        checkpoint = CacheCheckpoint(self.cache, len(feed))
        with dispatching_ahead(self.cache):  # the first layers run while Python builds the rest
            logits = self.model(mx.array(feed)[None], cache=self.cache)[0]  # (m+1, V)
        n, token = self._accept(logits, sequence, proposal)
        checkpoint.rewind(self.model, feed, 1 + n)
        self._held += 1 + n
        self._extend(sequence, candidates[:n] + [token])
        verified = self.now() - started
        self.stats.cycles += 1
        self.stats.verify_s += verified
        return n, token, verified

    def _accept(self, logits: mx.array, sequence: list[int], proposal: Proposal) -> tuple[int, int]:
        candidates = proposal.tokens
        if self.dist.greedy:
            own = int_list(mx.argmax(self.dist.process(logits, sequence, candidates), axis=-1))
            n = 0
            while n < len(candidates) and own[n] == candidates[n]:
                n += 1
            return n, own[n]
        p = self.dist.probs(logits, sequence, candidates)
        if self.rule == "match" or proposal.q is None:  # a lookup's q is one-hot: match is exact
            return accept_match(p, candidates, greedy=False)
        q = proposal.q
        if q.shape[-1] != p.shape[-1]:  # padded embedding tables differ in width
            width = p.shape[-1]
            q = q[:, :width] if q.shape[-1] > width else mx.pad(q, [(0, 0), (0, width - q.shape[-1])])
        return accept_rejection(p, q, candidates)

    # --- the cycles, under the names the loop and tests/engine call them by ------------

    def _plain_run(self, sequence: list[int], count: int) -> Iterable[Step]:
        return self.plain.run(sequence, count, None)

    def _draft_cycle(self, sequence: list[int], k: int, offer: LookupOffer | None = None) -> list[Step]:
        return self._drafting().run(sequence, k, offer)

    def _lookup_cycle(self, sequence: list[int], offer: LookupOffer, k: int) -> list[Step]:
        if self.lookup is None:
            raise RuntimeError("this decoder has no context index: lookup is off")
        return self.lookup.run(sequence, k, offer)

    def _start_draft(self, prompt: list[int], sequence: list[int]) -> EngineWarned | None:
        return self._drafting().start(prompt, sequence)

    def _catch_up_pays(self, left: int) -> bool:
        return self._drafting().catch_up_pays(left)

    def _drafting(self) -> DraftCycle:
        if self.draft is None:
            raise RuntimeError("this decoder has no draft model")
        return self.draft

    @property
    def drafter(self) -> Drafter | None:
        return self.draft.drafter if self.draft is not None else None

    @property
    def _draft_ready(self) -> bool:
        return self.draft is not None and self.draft.ready

    @_draft_ready.setter
    def _draft_ready(self, ready: bool) -> None:
        self._drafting().ready = ready

    @property
    def _catch_up_s(self) -> float | None:
        return self._drafting().catch_up_s

    @_catch_up_s.setter
    def _catch_up_s(self, seconds: float | None) -> None:
        self._drafting().catch_up_s = seconds

    @property
    def _alpha_this_turn(self) -> bool:
        return self._drafting().alpha_this_turn

    @_alpha_this_turn.setter
    def _alpha_this_turn(self, measured: bool) -> None:
        self._drafting().alpha_this_turn = measured
