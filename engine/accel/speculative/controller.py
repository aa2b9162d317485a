"""How many tokens to draft next: fixed (`on`) or chosen online (`auto`).

The Polish MLX study ("Speculative decoding on unified memory", 2026) found that with the
draft costing k passes per cycle, k = 4 was usually slower than plain decoding; its
break-even acceptance is α_be = r + β·k. Rather than a fixed k, `auto` measures per
conversation the acceptance α, the draft step time and the verify time for each k, and
each cycle picks the k with the highest expected tokens per second,

    E[τ] = (1 − α^(k+1)) / (1 − α)  tokens per cycle,   cost(k) = k·t_draft + t_verify(k),

against 1 / t_plain for plain decoding. When no k beats plain decoding it decodes plainly
and probes a short draft now and then (backing off while probes keep losing, lengthening
them while they are fully accepted).

Before each probe the decoder scouts (same-tokenizer drafts only: a translating draft's
scout overstated acceptance): the draft reads the target's recent plain tokens in
one pass (it must read them before drafting anyway) and reports how often it would have
proposed them. That measures α on many tokens without a target pass, so a probe that
could only lose (prose, most code on a CPU where a verify costs 1.4 plain steps) is
skipped, and only the draft's catch-up is spent on it.

Within a cycle the draft stops early after a token it gave less than CONFIDENCE_STOP
probability, so a burst of acceptance (a story's stock opening) that lifted α does not
buy a long draft into free text.
"""

from __future__ import annotations

from dataclasses import dataclass

from brisk.engine.accel.speculative.device_costs import PRIORS

# k above this buys little: acceptance compounds (α^k) while the draft cost grows linearly.
DEFAULT_MAX_K = 8
# Recent cycles matter more: acceptance changes with the content (code, prose, lists).
DECAY = 0.9
OUTLIER_CLIP = 1.5
# Drafting must promise this much over plain decoding to be chosen (noise in the timings).
MIN_GAIN = 1.03
# Each extra position of a verify pass is assumed to add this share of a plain step until
# measured, where no device's figure is given (device_costs.py decides those; pair.py passes it).
EXTRA_POSITION_COST = PRIORS["gpu"].extra_position
# `auto` drafts stop after a token the draft gives less than this probability (Hugging
# Face's assistant_confidence_threshold default): a long draft into free text otherwise
# costs several plain steps for one token.
CONFIDENCE_STOP = 0.4
PLAIN_SAMPLES_FIRST = 3  # plain steps timed before the first draft
FIRST_PROBE_AFTER = 16  # plain steps before the first probe when drafting is off
FIRST_SCOUT_AFTER = 8  # plain tokens the draft scores before its first cycle of a turn
MAX_PROBE_GAP = 256
PROBE_BACKOFF = 4  # a losing probe waits this many times longer for the next


@dataclass
class Ema:
    value: float | None = None

    def add(self, x: float, decay: float = 0.7) -> None:
        self.value = x if self.value is None else decay * self.value + (1 - decay) * x

    @property
    def measured(self) -> float:
        """The value, where the caller's state says it was measured (1.0 if not: only ratios matter there)."""
        return self.value if self.value is not None else 1.0


def _clip(seconds: float, expected: float | None) -> float:
    """A timing far above what was expected (a page fault, another process) counts as
    OUTLIER_CLIP times it: one outlier must not switch drafting off."""
    return seconds if expected is None else min(seconds, OUTLIER_CLIP * expected)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one cycle yields (accepted drafts + the target's own) at per-token acceptance α."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


# Acceptance assumed when judging, before any measurement, whether a draft could pay at all:
# the best case (every draft kept), so that only a draft that never pays is never tried.
OPTIMISTIC_ALPHA = 1.0


# A pair's stored costs are means over the cycles that measured them, counted up to this many:
# one turn's few cycles on a loaded machine move them a little, never replace them (one
# cycle timed at 0.75 of a target step, against 0.39 over 46 cycles a turn before, once
# told every later chat that the 0.5B draft could not pay, and it was never tried again).
MAX_STORED_SAMPLES = 32


def empty_costs() -> dict:
    """A pair's entry in PairCosts: costs in target steps, and how many cycles measured each."""
    return {"draft_steps": None, "verify_steps": {}, "draft_samples": 0, "verify_samples": {}}


def _weight(stored: float | None, count: int) -> int:
    """Cycles a stored cost stands for (one where a file from before the counts holds it)."""
    return 0 if stored is None else max(count, 1)


def _pooled(stored: tuple[float | None, int], measured: float | None, samples: int) -> float | None:
    """The mean of a stored (cost, count) and this turn's cost measured over `samples` cycles."""
    cost, weight = stored[0], _weight(*stored)
    if measured is None or samples <= 0:
        return cost
    if cost is None:
        return measured
    return (weight * cost + samples * measured) / (weight + samples)


def _pooled_count(stored: tuple[float | None, int], samples: int) -> int:
    return min(MAX_STORED_SAMPLES, _weight(*stored) + samples)


class PairCosts:
    """Draft step and verify costs of each (target, draft, verify path) measured on this
    machine, in the target's plain steps. They belong to the machine and the models, not to
    one conversation's text, so the owner (the engine worker) passes one to every session,
    and a new conversation starts from them instead of from the weight-bytes guess.
    StoredPairCosts (costs_file.py) also keeps them across restarts: a pair measured once
    never has to scout and probe again to learn that it cannot pay."""

    def __init__(self, by_pair: dict[tuple, dict] | None = None):
        self._by_pair: dict[tuple, dict] = by_pair or {}

    def for_pair(self, pair: tuple) -> dict:
        return self._by_pair.setdefault(tuple(pair), empty_costs())

    def pairs(self) -> dict[tuple, dict]:
        return self._by_pair

    def save(self) -> None:
        """Kept in memory only (StoredPairCosts writes a file)."""


class DraftLengthController:
    def __init__(
        self,
        mode: str,
        k: int,
        *,
        max_k: int = DEFAULT_MAX_K,
        cost_ratio: float | None = None,
        pair: tuple | None = None,
        costs: PairCosts | None = None,
        position_cost: float = EXTRA_POSITION_COST,
    ):
        """`cost_ratio`: the draft step's expected cost relative to the target's (decode
        streams the weights, so their byte ratio), used until the draft is measured.
        `pair`: (target id, draft id, verify path), to start from the costs `costs` holds
        from earlier conversations (and to add this one's). `position_cost`: a verify
        pass's cost per extra position, in plain steps, until measured."""
        self.mode, self.fixed_k, self.max_k = mode, k, max(k, max_k) if mode == "on" else max_k
        self.cost_ratio, self.position_cost = cost_ratio, position_cost
        self.known = (costs or PairCosts()).for_pair(pair) if pair else None
        # what earlier turns had stored when this one began: this turn's measurements are
        # pooled with it, not written over it
        known = self.known or empty_costs()
        self._stored_draft = (known["draft_steps"], known["draft_samples"])
        counts = known["verify_samples"]
        self._stored_verify = {m: (steps, counts.get(m, 0)) for m, steps in known["verify_steps"].items()}
        self.draft_samples = 0
        self.verify_samples: dict[int, int] = {}
        # acceptance as decayed counts, from a uniform prior (Laplace: one of each), so that
        # a scout that saw every token proposed can say so (8 of 8 reads as α ≈ 0.95)
        self.accepted, self.rejected = 1.0, 1.0
        self.t_plain, self.t_draft = Ema(), Ema()
        self.t_verify: dict[int, Ema] = {}
        self.tokens_per_draft = Ema(1.0)  # target tokens per draft token (≠ 1 across tokenizers)
        self.plain_since_probe = 0
        self.probe_gap = FIRST_SCOUT_AFTER  # the first probe of a conversation comes sooner
        self.drafting = True
        self.plain_samples = 0
        self.probing, self.probe_k = False, 1
        # Slow start: a cycle may draft at most 2n + 1 tokens after one that kept n. Acceptance
        # is bursty (a boilerplate opening, then free prose): after a rejection a long draft
        # would mostly be thrown away before α, a slow average, has caught up.
        self.k_cap = self.max_k
        self.scouted = False  # a scout has measured α since the last probe decision

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def choose(self) -> int:
        if self.mode == "on":
            return self.fixed_k
        if self.plain_samples < PLAIN_SAMPLES_FIRST:
            return 0  # measure plain steps first (the very first one runs cold)
        if self.t_draft.value is None:
            if not self.could_pay() or self.plain_since_probe < self.probe_gap:
                return 0
            if self.scouted and not self._scout_says_it_pays():
                return self._back_off()
            self.probing = True
            return self.probe_k  # then the cheapest draft cycle, to measure its cost
        best_k, best_speed = 0, 1.0 / self.t_plain.measured
        for k in range(1, self.k_cap + 1):
            speed = self.expected_speed(k)
            if speed > best_speed * (MIN_GAIN if best_k == 0 else 1.0):
                best_k, best_speed = k, speed
        if best_k:
            self.drafting, self.probe_gap = True, FIRST_PROBE_AFTER
            return best_k
        if self.drafting:  # it just stopped paying: start counting towards a probe
            self.drafting, self.plain_since_probe = False, 0
        if self.plain_since_probe >= self.probe_gap:
            # α was just measured with the draft's cost known and no k pays; or the measured
            # costs say no k could pay even if every draft were kept: a probe can only lose
            if self.scouted or not self.could_pay():
                return self._back_off()
            self.plain_since_probe = 0
            self.probing = True
            return self.probe_k
        return 0

    def stop_below(self) -> float:
        """Draft confidence below which a cycle's drafting stops early (`on` drafts its k)."""
        return CONFIDENCE_STOP if self.mode == "auto" else 0.0

    def scout_due(self) -> bool:
        """Should the draft score the target's recent tokens now (a probe is due)?"""
        if self.mode != "auto" or self.plain_samples < PLAIN_SAMPLES_FIRST or self.scouted:
            return False
        if self.t_draft.value is not None and self.drafting:
            return False
        if not self.could_pay():  # α cannot change the answer: the scout's pass would be wasted
            return False
        return self.plain_since_probe >= self.probe_gap

    def observe_scout(self, hits: float, positions: int) -> None:
        """The draft would have proposed `hits` of the last `positions` target tokens."""
        if positions:  # as many observations as positions: older evidence decays per token
            fade = DECAY**positions
            self.accepted = fade * self.accepted + hits
            self.rejected = fade * self.rejected + (positions - hits)
            self.scouted = True

    def _scout_says_it_pays(self) -> bool:
        """With the scouted α, does some k beat plain decoding (draft cost from the prior)?"""
        ratio = self.draft_ratio()
        if ratio is None:
            return True
        t = self.t_plain.measured
        return any(
            expected_tokens(self.alpha, k) / (k * ratio * t + self.verify_time(k)) > MIN_GAIN / t
            for k in range(1, self.max_k + 1)
        )

    def _back_off(self) -> int:
        self.scouted, self.plain_since_probe = False, 0
        self.probe_gap = min(PROBE_BACKOFF * max(self.probe_gap, FIRST_PROBE_AFTER), MAX_PROBE_GAP)
        return 0

    def could_pay(self) -> bool:
        """Before measuring the draft: would it beat plain decoding even at high acceptance?"""
        ratio = self.draft_ratio()
        if ratio is None:
            return True
        t = self.t_plain.value or 1.0  # the answer only depends on ratios
        return any(
            expected_tokens(OPTIMISTIC_ALPHA, k) / (k * ratio * t + self.verify_time(k)) > MIN_GAIN / t
            for k in range(1, self.max_k + 1)
        )

    def saving_per_token(self, against: float | None = None) -> float:
        """Seconds a token drafting would save over plain decoding (or over `against`
        seconds a token, what decoding without the draft has been costing when faster: lookups)
        at the acceptance measured so far and the best k (0 where it would lose): what
        reading the tokens a draft missed has to be paid back from."""
        ratio, t = self.draft_ratio(), self.t_plain.value
        if ratio is None or t is None:
            return float("inf")  # nothing measured to weigh it by
        ks = range(1, self.max_k + 1)
        speed = max(expected_tokens(self.alpha, k) / (k * ratio * t + self.verify_time(k)) for k in ks)
        return max(0.0, min(t, against or t) - 1.0 / speed)

    def plain_run(self) -> int:
        """How many plain steps to take before asking again (they can then be pipelined)."""
        if self.mode == "on":
            return 1
        if self.plain_samples < PLAIN_SAMPLES_FIRST:
            return PLAIN_SAMPLES_FIRST - self.plain_samples
        if self.t_draft.value is None:
            if not self.could_pay():
                return 1 << 30
            return max(1, self.probe_gap - self.plain_since_probe)
        if not self.drafting:
            return max(1, self.probe_gap - self.plain_since_probe)
        return 1

    def expected_speed(self, k: int) -> float:
        """Expected target tokens per second when drafting k tokens per cycle."""
        m = max(1, round(k * self.tokens_per_draft.measured))
        return expected_tokens(self.alpha, m) / (k * self.t_draft.measured + self.verify_time(m))

    def verify_time(self, m: int) -> float:
        """Time to verify m drafted tokens (m + 1 positions), measured or extrapolated.

        A verify pass costs a fixed part (streaming the weights once, syncing, sampling)
        plus a little per position, so a line is fitted through the measured lengths only,
        not through the plain step."""
        if m in self.t_verify and self.t_verify[m].value is not None:
            return self.t_verify[m].measured
        base = self.t_plain.value or 1.0
        measured = sorted((n, e.value) for n, e in self.t_verify.items() if e.value is not None)
        if measured:  # a pass costs at least a plain step: one measured faster says the plain
            # estimate is stale (timed across a trace or a stall, then never retimed while lookups
            # won), and extrapolating from it floored every longer verify at it
            base = min(base, min(t for _, t in measured))
        if not measured and self.known:  # nothing this conversation: what earlier ones measured
            measured = sorted((n, steps * base) for n, steps in self.known["verify_steps"].items())
        if not measured:
            return base * (1 + self.position_cost * m)
        if len(measured) == 1:
            n, t = measured[0]
            return max(base, t + self.position_cost * base * (m - n))
        mean_n = sum(n for n, _ in measured) / len(measured)
        mean_t = sum(t for _, t in measured) / len(measured)
        slope = sum((n - mean_n) * (t - mean_t) for n, t in measured) / sum((n - mean_n) ** 2 for n, _ in measured)
        return max(base, mean_t + max(0.0, slope) * (m - mean_n))

    def observe_plain(self, seconds: float, count: int = 1) -> None:
        """`count` plain steps that took `seconds` each (a pipelined run reports its mean:
        its single intervals alternate between two steps' and almost none)."""
        self.scouted = False  # a scout informs the decision right after it only
        self.plain_samples += count
        for _ in range(count):
            self.t_plain.add(seconds)
        self.plain_since_probe += count

    def observe_cycle(self, *, drafted: int, proposed: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """One cycle: `drafted` draft steps proposed `proposed` target tokens, `accepted` kept."""
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (1 if accepted < proposed else 0)
        self.k_cap = min(2 * accepted + 1, self.max_k)
        self.scouted = False
        if self.probing:
            # Probes start at one token (cheapest). One that keeps everything doubles the
            # next probe's length and comes again soon: a run of accepted drafts measures
            # high acceptance and long-draft verify cost much faster than single tokens do.
            self.probing = False
            if proposed and accepted == proposed:
                self.probe_k = min(2 * self.probe_k, self.max_k)
                self.probe_gap = FIRST_PROBE_AFTER
            else:
                self.probe_k = 1
                self.probe_gap = min(PROBE_BACKOFF * self.probe_gap, MAX_PROBE_GAP)
        if drafted:
            self.t_draft.add(_clip(draft_s / drafted, self.t_draft.value))
            self.draft_samples += 1
            self.tokens_per_draft.add(proposed / drafted)
        self.observe_verify(proposed, verify_s)

    def observe_verify(self, proposed: int, verify_s: float) -> None:
        """A target pass over `proposed` speculated tokens took `verify_s` (any source)."""
        if proposed:
            self.t_verify.setdefault(proposed, Ema()).add(_clip(verify_s, self.verify_time(proposed)))
            self.verify_samples[proposed] = self.verify_samples.get(proposed, 0) + 1
        self._remember_costs()

    def _remember_costs(self) -> None:
        """Keep this conversation's costs for the next, in plain steps (a later one may run at
        another context length or machine load: the ratios carry over, the seconds do not)."""
        plain = self.t_plain.value
        if self.known is None or not plain:
            return
        if self.t_draft.value is not None:
            self.known["draft_steps"] = self.draft_ratio()
            self.known["draft_samples"] = _pooled_count(self._stored_draft, self.draft_samples)
        for m, e in self.t_verify.items():
            if e.value is not None:
                stored, samples = self._stored_verify.get(m, (None, 0)), self.verify_samples[m]
                self.known["verify_steps"][m] = _pooled(stored, e.value / plain, samples)
                self.known["verify_samples"][m] = _pooled_count(stored, samples)

    def draft_ratio(self) -> float | None:
        """The draft step's cost in target steps: what this conversation measured pooled with
        what earlier ones with this pair stored, else the weight-bytes guess."""
        plain = self.t_plain.value
        measured = self.t_draft.value / plain if plain and self.t_draft.value is not None else None
        pooled = _pooled(self._stored_draft, measured, self.draft_samples)
        return pooled if pooled is not None else self.cost_ratio

    def note(self) -> str:
        """Why `auto` drafts no more: decided without trying, or from what it measured."""
        if self.mode != "auto" or self.t_plain.value is None or self.could_pay():
            return ""
        ratio = f"a draft step costs ~{self.draft_ratio():.2f}x a target step"
        if self.t_draft.value is None:
            return f"drafting cannot pay: {ratio}"
        verify = self.verify_time(1) / self.t_plain.value
        return f"drafting stopped: measured, {ratio} and verifying one token ~{verify:.1f}x"
