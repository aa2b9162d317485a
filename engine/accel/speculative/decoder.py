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

p and q come after the same sampling transforms (engine/sampling.py). At temperature 0
both rules reduce to greedy: the output is token for token the target's greedy output.
The target's cache is rolled back after each cycle (engine/accel/speculative/rewind.py); which
source proposes, and how many tokens, comes from engine/accel/speculative/autopilot.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterable, Iterator

import mlx.core as mx

from engine.accel.speculative.autopilot import LOOKUP_MAX_K, SpeculationAutopilot
from engine.accel.speculative.drafters import DraftUnavailable, Proposal
from engine.accel.speculative.lookup import ContextIndex, LookupOffer
from engine.accel.speculative.rewind import CacheCheckpoint, CannotRewind
from engine.compiled_decode import CompiledRun, traced_step, why_not_compiled
from engine.dispatch_ahead import dispatching_ahead
from engine.events import EngineWarned
from engine.mx_values import float_list, int_list, item_float, item_int
from engine.sampling import TokenDistribution, sample

log = logging.getLogger(__name__)

ACCEPTANCE_RULES = ("rejection", "match")
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
        drafter,
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
        self.model, self.prompt_cache, self.cache, self.drafter = model, cache, cache.layers, drafter
        self.controller, self.dist, self.rule, self.max_tokens = controller, dist, rule, max_tokens
        self.index = index
        how = {(True, False): "lookup", (False, True): rule, (True, True): f"lookup + draft, {rule}"}
        self.stats = SpecStats(status=f"{controller.mode} ({how[index is not None, drafter is not None]})")
        self.consistent = True  # False: the cache could not be brought back; drop it
        self._draft_ready = False
        self._draft_failed = drafter is None
        self._catch_up_s: float | None = None  # the draft's reading of missed tokens, per token
        # seconds and tokens of the turn's recent decoding without the draft (plain, lookups)
        self._pace = [0.0, 0.0]
        self._alpha_this_turn = False  # a scout or a draft cycle has measured α in this turn
        self._offer_at = -1  # the context length the offer below was looked up at
        self._offer: LookupOffer | None = None
        self.warnings: list[EngineWarned] = []  # degradations, in order, for the caller to report
        # plain runs replay one compiled step (engine/compiled_decode.py), traced on first use
        self._step: Callable | None = None
        self._run: CompiledRun | None = None
        self._kv_bits = dist.settings.kv_precision()
        self._compiled_off: str | None = None  # why plain runs call the model instead, once known
        self._compiled_checked = False  # asked once a turn: the answer cannot change within it

    def metrics(self) -> dict:
        """The turn's speculation metrics, with the draft step's cost in target steps when
        both were measured (the app ranks drafts by it; 0.0 when not measured)."""
        draft, plain = self.controller.t_draft.value, self.controller.t_plain.value
        step = "" if self._step is None and self._compiled_off is None else "compiled"
        if self._compiled_off:
            step = f"model calls: {self._compiled_off}"
        return {
            **self.stats.to_metrics(),
            "draft_cost_ratio": draft / plain if draft and plain else 0.0,
            "decode_step": step,  # how plain runs stepped (none ran: "")
        }

    def steps(self, prompt: list[int]) -> Generator[tuple[int, str], None, None]:
        sequence = list(prompt)
        self._held = len(prompt) - 1  # tokens of `sequence` in the target's cache
        if self.index is not None:
            self.index.sync(prompt)  # the conversation so far; an edit or a regenerate trims it
        yielded = 0
        try:
            try:
                CacheCheckpoint.check(self.cache)
            except CannotRewind as exc:
                self._draft_failed, self.index = True, None
                self.stats.status = f"off: {exc}"
                if self.drafter is not None or self.controller.mode == "on":  # asked for explicitly
                    self.warnings.append(
                        EngineWarned(f"Speculative decoding needs a cache it can rewind: {exc}", "spec_decode")
                    )
            # The draft reads the prompt before the first token (like the target's prefill,
            # it counts in TTFT), unless `auto` already knows this draft cannot pay.
            if not self._draft_failed and (self.controller.mode == "on" or self._auto_worth_starting(prompt)):
                warning = self._start_draft(prompt, sequence)
                if warning:
                    self.warnings.append(warning)
            while (left := self.max_tokens - (len(sequence) - len(prompt))) > 0:
                # A translating draft's scout counts hits in its own tokens over the target's
                # text, which overstated acceptance (0.62-0.84 scouted, ~0.45 kept in cycles,
                # code, SmolLM2 -> Qwen): it probes with real cycles instead.
                usable = not self._draft_failed and self._catch_up_pays(left)
                if usable and self._draft_ready and self.drafter.same_tokenizer and self.controller.scout_due():
                    self._scout()
                offer = self._lookup_offer()
                source, k = self.controller.pick(offer, draft_usable=usable)
                k = min(k, left - 1)
                if source == "draft" and k > 0 and not self._draft_ready:
                    warning = self._start_draft(prompt, sequence)
                    if warning:
                        self.warnings.append(warning)
                        k = 0
                steps: Iterable[tuple[int, str]]
                if source == "lookup" and k > 0 and offer is not None:
                    steps = self._lookup_cycle(sequence, offer, k)
                elif source == "draft" and k > 0:
                    steps = self._draft_cycle(sequence, k, offer)
                else:
                    steps = self._plain_run(
                        sequence,
                        min(
                            self.controller.plain_run(draft_usable=usable, lookup=self.index is not None),
                            left,
                        ),
                    )
                for token, drafted in steps:
                    self.stats.sources.append(drafted)
                    yielded += 1
                    yield token, drafted
        finally:
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

    def _lookup_offer(self) -> LookupOffer | None:
        """What the context proposes after the current tokens (looked up once per length)."""
        if self.index is None:
            return None
        if self._offer_at != len(self.index):
            self._offer_at, self._offer = len(self.index), self.index.propose(LOOKUP_MAX_K)
        return self._offer

    def _auto_worth_starting(self, prompt) -> bool:
        """`auto` skips a draft that cannot pay, or that would first have to read far more
        new prompt than the answer can be long (a long pasted document, a short answer)."""
        if not self.controller.could_pay():
            return False
        catch_up = self.drafter.catch_up(prompt)
        if catch_up > AUTO_MAX_CATCH_UP * self.max_tokens:
            self._draft_failed = True
            self.stats.status = (
                f"off: the draft would first read {catch_up} new prompt tokens "
                f"for at most {self.max_tokens} answer tokens"
            )
            return False
        return True

    def _start_draft(self, prompt, sequence) -> EngineWarned | None:
        started, read = time.perf_counter(), 0
        try:
            read = self.drafter.start(prompt)
            if len(sequence) > len(prompt):
                self.drafter.observe_tokens(sequence[len(prompt) :])
            self._draft_ready = True
            return None
        except Exception as exc:
            return self._drop_draft(exc)
        finally:
            elapsed = time.perf_counter() - started
            self.stats.draft_prefill_s += elapsed
            self._time_catch_up(elapsed, read)

    def _time_catch_up(self, seconds: float, tokens: int) -> None:
        if tokens >= CATCH_UP_FROM:
            self._catch_up_s = seconds / tokens

    def _catch_up_pays(self, left: int) -> bool:
        """May `auto` use the draft now? After a plain stretch the draft must first read
        every token it missed (one batched pass, before its scout or its first proposal):
        on code, a 0.5B draft's catch-ups after 64- and 105-token plain runs cost Qwen-1.5B
        12% of a turn it never drafted in. Worth it only while drafting the rest of the
        answer at the acceptance measured so far would win back more than the reading costs.
        Until this turn has measured α (a scout or a cycle; the conversation's α may be
        another content's), a catch-up may explore if it reads at most EXPLORE_SHARE of the
        tokens left: 66 tokens into a follow-up, all looked up, a 0.5B draft's first scout read
        them for 0.31 s (the 1.5B target's step: ~40 ms), and no draft then beat a lookup."""
        if self.controller.mode != "auto":
            return True
        missed = self.drafter.unseen()
        if missed < CATCH_UP_FROM:
            return True
        if not self._alpha_this_turn:
            return missed <= EXPLORE_SHARE * left
        if self._catch_up_s is None:
            return True
        # against what decoding without the draft has been costing: where lookups carry the
        # answer the draft must beat them, not plain steps (a follow-up's second scout read
        # looked-up tokens for 0.35 s, for a draft that then never beat a lookup)
        pace = self._pace[0] / self._pace[1] if self._pace[1] else None
        return missed * self._catch_up_s < left * self.controller.saving_per_token(pace)

    def _note_pace(self, seconds: float, tokens: int) -> None:
        """Decoding without the draft took `seconds` for `tokens` (recent events weigh more)."""
        self._pace = [PACE_DECAY * self._pace[0] + seconds, PACE_DECAY * self._pace[1] + tokens]

    def _drop_draft(self, exc: Exception) -> EngineWarned:
        """The draft costs speed, never the answer: decode the rest of the turn plainly."""
        if isinstance(exc, (DraftUnavailable, CannotRewind)):
            reason = str(exc)
        else:
            log.exception("draft model failed")
            reason = f"the draft failed: {exc}"
        self._draft_failed, self._draft_ready = True, False
        self.drafter.tc.reset()  # it may hold half a proposal
        self.stats.status = f"off: {reason}" if self.index is None else f"lookup only: {reason}"
        return EngineWarned(f"The draft model is off for this turn: {reason}", "spec_decode")

    def _scout(self) -> None:
        """The draft reads the target's plain tokens it has not seen and says how many it
        would have proposed: α for the controller, without a target pass."""
        started = time.perf_counter()
        scored = self._to_draft(self.drafter.scout)
        elapsed = time.perf_counter() - started
        self.stats.draft_s += elapsed
        if scored:
            self._time_catch_up(elapsed, scored[1])
            self._alpha_this_turn = True
            self.stats.scouted += scored[1]
            self.controller.observe_scout(*scored)

    def _read_unseen(self) -> None:
        """The draft reads the tokens it missed (plain steps, lookups) before it proposes,
        timed as a catch-up. Read in the proposal's first step, their cost counted as
        drafting: after a follow-up's lookups a 0.5B draft's step measured 4.9x its 1.5B
        target's, which `auto` kept (and stored) as "drafting cannot pay"."""
        started = time.perf_counter()
        read = self._to_draft(self.drafter.read_unseen)
        elapsed = time.perf_counter() - started
        self.stats.draft_s += elapsed
        if read:
            self._time_catch_up(elapsed, read)

    def _plain_run(self, sequence: list[int], count: int) -> Iterator[tuple[int, str]]:
        """Up to `count` plain target steps. Without logits processors they are pipelined like
        mlx-lm's generate_step: the next step is queued before this token is read back. The
        run ends early (after the step already queued) when a lookup offer would pay."""
        if count == 1 or self.dist.processors:
            for _ in range(count):
                yield self._plain(sequence), ""
                if self.controller.lookup_pays(self._lookup_offer()):
                    return
            return
        step_before = self._step
        started = time.perf_counter()
        self._start_compiled_run()
        traced = self._run is not None and self._step is not step_before  # a turn's first run traces
        grown = self._run.grown if self._run is not None else 0
        try:
            current = self._queue_step(mx.array(sequence[-1:], dtype=mx.uint32))  # as argmax gives: one trace
            last = started
            i = 0
            while True:
                queued = None
                if i + 1 < count and not self._lookup_likely_after(self._lookup_offer()):
                    queued = self._queue_step(current)
                token = item_int(current)
                now = time.perf_counter()
                self._after_plain(sequence, token, now - last, timed=False)
                last = now
                i += 1
                yield token, ""
                if i >= count:
                    break
                if self.controller.lookup_pays(self._lookup_offer()):
                    if queued is None:
                        break
                    count = i + 1  # read the step already queued, queue no more
                elif queued is None:
                    queued = self._queue_step(current)  # the lookup did not come: on, unpipelined
                current = queued
            traced = traced or (self._run is not None and self._run.grown != grown)
        finally:
            self._end_compiled_run()
        # The controller gets the run's mean, from the first step's queueing to the last
        # read (the stream was idle before it: a verify reads its result back). Single
        # intervals are no measure (reading a token back may wait for the step queued after
        # it too), nor is the mean of the intervals after the first read: on grounded text a
        # lookup ends most runs after 2-4 steps, and that read SmolLM2's 7 ms step as 4-6 ms.
        # A run that traced the step (a turn's first, or buffers grown) is not timed.
        if not traced:
            self.controller.observe_plain((last - started) / i, i)
            self._note_pace(last - started, i)

    def _lookup_likely_after(self, offer: LookupOffer | None) -> bool:
        """Would a lookup pay after the token in flight, if that token is the one `offer`
        proposes first? Then a plain run queues no step behind it: a queued step costs a whole
        plain step for one token, where the lookup's verify pass would have checked it for a
        row's cost (SmolLM2: ~1.6 of ~9.4 ms). Replayed over SmolLM2's answers with the real
        autopilot, code edit 1.71x -> 1.80x, the other kinds within 1%."""
        if offer is None or len(offer.tokens) < 2:
            return False
        return self.controller.lookup_pays(LookupOffer(offer.tokens[1:], offer.match + 1))

    def _start_compiled_run(self) -> None:
        # once a turn, not once a run: the check walks the model's modules (~1.6 ms for
        # SmolLM2), and a grounded answer's lookups split it into ~20 runs
        if not self._compiled_checked:
            self._compiled_checked = True
            self._compiled_off = why_not_compiled(self.prompt_cache.model, self.cache, kv_bits=self._kv_bits)
        if self._compiled_off:
            return
        self._step = self._step or traced_step(self.model, normalize=False)
        self._run = CompiledRun(self._step, self.cache)

    def _end_compiled_run(self) -> None:
        if self._run is not None:
            self._run.release()
            self._run = None

    def _step_logits(self, token: mx.array) -> mx.array:
        """The target's next-token logits (1, V) after `token`, built lazily: by the run's
        compiled step when one is open (a step it cannot trace ends it, for the turn)."""
        if self._run is not None:
            try:
                return self._run(token)
            except Exception as failed:  # noqa: BLE001  (the buffers are untouched: decode on)
                log.warning("the compiled decode step failed, decoding with the model's: %s", failed)
                self._compiled_off = f"the compiled step failed ({type(failed).__name__}: {failed})"
                self._end_compiled_run()
        return self.model(token[None], cache=self.cache)[0]

    def _queue_step(self, token: mx.array) -> mx.array:
        logits = self._step_logits(token)
        self._held += 1
        nxt = mx.argmax(logits, axis=-1) if self.dist.greedy else self.dist.draw(logits, [], [])
        mx.async_eval(nxt)
        return nxt

    def _plain(self, sequence: list[int], *, tell_draft: bool = True) -> int:
        started = time.perf_counter()
        with dispatching_ahead(self.cache):
            logits = self.model(mx.array(sequence[-1:])[None], cache=self.cache)[0]  # (1, V)
        self._held += 1
        token = self._sample_one(logits, sequence)
        self._after_plain(sequence, token, time.perf_counter() - started, tell_draft=tell_draft)
        return token

    def _after_plain(
        self, sequence, token: int, elapsed: float, *, tell_draft: bool = True, timed: bool = True
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
        if tell_draft and self._draft_ready:
            self._to_draft(self.drafter.observe_tokens, [token])

    def _extend(self, sequence: list[int], tokens: list[int]) -> None:
        sequence += tokens
        if self.index is not None:
            self.index.extend(tokens)

    def _to_draft(self, call, *args):
        try:
            return call(*args)
        except Exception as exc:
            self.warnings.append(self._drop_draft(exc))
            return None

    def _sample_one(self, logits, sequence) -> int:
        if self.dist.greedy:
            return item_int(mx.argmax(self.dist.process(logits, sequence, []), axis=-1))
        return item_int(self.dist.draw(logits, sequence, []))

    def _draft_cycle(self, sequence: list[int], k: int, offer: LookupOffer | None = None) -> list[tuple[int, str]]:
        if self.drafter.unseen() >= CATCH_UP_FROM:
            self._read_unseen()
            if self._draft_failed:
                return [(self._plain(sequence), "")]
        started = time.perf_counter()
        proposal: Proposal | None = self._to_draft(self.drafter.propose, k, self.controller.stop_below())
        if proposal is None:
            return [(self._plain(sequence), "")]
        drafted_at = time.perf_counter()
        self.stats.draft_s += drafted_at - started
        if not proposal.tokens:  # absorbed by context or an immediate EOS: a plain step, no stall
            self._to_draft(self.drafter.commit, proposal, 0, self._plain(sequence, tell_draft=False))
            return [(sequence[-1], "")]
        n, token, verified = self._verify(sequence, proposal)
        committed_at = time.perf_counter()
        self._to_draft(self.drafter.commit, proposal, n, token)
        # following the target (a trim, or re-tokenizing across tokenizers) is the draft's cost
        draft_s = drafted_at - started + time.perf_counter() - committed_at
        s = self.stats
        s.draft_s += time.perf_counter() - committed_at
        s.draft_cycles += 1
        self._alpha_this_turn = True
        s.draft_tokens += len(proposal.tokens)
        s.accepted_tokens += n
        s.k_total += k
        self.controller.observe_cycle(
            drafted=proposal.drafted, proposed=len(proposal.tokens), accepted=n, draft_s=draft_s, verify_s=verified
        )
        produced = proposal.tokens[:n] + [token]
        if offer is not None:  # what the lookup would have kept of them (no plain step scouts it now)
            self.controller.observe_lookup_outcome(offer, produced)
        return [(t, "draft" if i < n else "") for i, t in enumerate(produced)]

    def _lookup_cycle(self, sequence: list[int], offer: LookupOffer, k: int) -> list[tuple[int, str]]:
        proposal = Proposal(offer.tokens[:k], None, 0)
        n, token, verified = self._verify(sequence, proposal)
        if self._draft_ready:
            followed_at = time.perf_counter()
            self._to_draft(self.drafter.observe_tokens, proposal.tokens[:n] + [token])
            self.stats.draft_s += time.perf_counter() - followed_at
        self.stats.lookup_tokens += k
        self.stats.lookup_accepted += n
        self.controller.observe_lookup_cycle(offer, proposed=k, accepted=n, verify_s=verified)
        self._note_pace(verified, n + 1)
        return [(t, "lookup" if i < n else "") for i, t in enumerate(proposal.tokens[:n] + [token])]

    def _verify(self, sequence: list[int], proposal: Proposal) -> tuple[int, int, float]:
        """One target pass over the proposal: (tokens kept, the target's next token, seconds).
        `sequence` and the cache then hold the kept tokens and that token."""
        started = time.perf_counter()
        candidates = proposal.tokens
        feed = sequence[-1:] + candidates
        checkpoint = CacheCheckpoint(self.cache, len(feed))
        with dispatching_ahead(self.cache):  # the first layers run while Python builds the rest
            logits = self.model(mx.array(feed)[None], cache=self.cache)[0]  # (m+1, V)
        n, token = self._accept(logits, sequence, proposal)
        checkpoint.rewind(self.model, feed, 1 + n)
        self._held += 1 + n
        self._extend(sequence, candidates[:n] + [token])
        verified = time.perf_counter() - started
        self.stats.cycles += 1
        self.stats.verify_s += verified
        return n, token, verified

    def _accept(self, logits, sequence, proposal) -> tuple[int, int]:
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
