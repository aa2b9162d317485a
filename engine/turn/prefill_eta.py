"""How long a prefill phase has left, from that phase's own chunks so far. No Qt: the turn's
prefill (engine/turn/prefill_phase.py) attaches the estimate to each PrefillProgressed, and
tests/engine/test_eta_replay.py replays recorded prefills through it.

A chunk of n new tokens costs a·(n + r·K): `a` per token for the weights (linear layers and
the LM head), and r·a per key each query reads, K = the keys the chunk's queries read (every
earlier token: Σ positions). Late chunks cost several times early ones (8K tokens on SmolLM2:
2.9 s for the first 512, 15 s for the 15th), so a rate measured early and held, or a linear fit
of a few noisy early chunks, promised 2 minutes where 399 s were left.

`r` starts from the model's shape (attention FLOPs per key against weight FLOPs per token,
times CPU_ATTENTION_COST) and is fitted to the chunks as they come, the prior fading as they
grow; `a` is always measured. UniPrefill (LayerEta) runs layer by layer over fewer tokens after
each drop layer, so its cost follows the tokens each layer keeps, not the layer count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Measured, not derived: MLX's CPU attention (scores materialized in float32, a softmax pass)
# costs about this many times its FLOPs' share against the linear layers. 8K-token prefills
# of SmolLM2-135M gave 2.2 (AMD EPYC, 2 cores, 2026-11-27); the fit below corrects it per turn.
# On tests/engine/eta_recordings/ any value from 2.2 to 4.4 holds ±30%, 1.5 does not.
CPU_ATTENTION_COST = 2.2
# How far (in log units) the data may move r from its prior before the prior weighs in as much
# as one chunk's noise: ln 2, a factor of two either way.
RATIO_PRIOR_SPREAD = math.log(2)
CHUNK_NOISE = 0.15  # relative scatter of one chunk's time on a shared CPU
# UniPrefill's share of tokens a drop layer keeps, before a drop of this prompt was seen, and
# how many drops' worth that guess weighs against the observed ones (SmolLM2 at p=0.99 kept
# 49-89% per drop on an 8K prompt; 0.6-0.65 with weight 1-4 all held there, 0.8 did not).
KEEP_PRIOR = 0.65
KEEP_PRIOR_WEIGHT = 2
# r for a model of unknown shape: SmolLM2-135M's (a small model's; the fit corrects it)
UNKNOWN_SHAPE_RATIO = 2.5e-4
# Phases whose progress counts tokens read in chunks (the others say what they do, not how far).
TOKEN_PHASES = ("prompt", "draft", "kept")


def attention_ratio(config: dict) -> float:
    """The prior r: one key's attention cost against one token's weight cost, per the
    model's shape (FLOPs), times CPU_ATTENTION_COST."""
    args = config.get("text_config") or config
    hidden = int(args.get("hidden_size") or 0)
    layers = int(args.get("num_hidden_layers") or 0)
    if not hidden or not layers:
        return UNKNOWN_SHAPE_RATIO
    heads = int(args.get("num_attention_heads") or 1)
    head_dim = int(args.get("head_dim") or hidden // heads)
    kv_heads = int(args.get("num_key_value_heads") or heads)
    inter = int(args.get("intermediate_size") or 4 * hidden)
    vocab = int(args.get("vocab_size") or 0)
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    per_layer = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * inter
    weights = 2 * (layers * per_layer + vocab * hidden)  # FLOPs per token (logits for every chunk token)
    attention = layers * 4 * q_dim  # FLOPs per (query, key): scores and the weighted sum
    return CPU_ATTENTION_COST * attention / weights


def keys_read(start: int, end: int) -> float:
    """Keys read by queries at positions start..end-1 (causal: position p reads p + 1)."""
    return (end * (end + 1) - start * (start + 1)) / 2


@dataclass
class _Work:
    tokens: float  # token-units of weight work
    keys: float  # keys read
    seconds: float


def _fit(work: list[_Work], prior: float) -> tuple[float, float]:
    """(a, r) for seconds ≈ a·(tokens + r·keys): r by least squares on log times with a
    log-normal prior around `prior`, a as the ratio of the sums given r."""
    if not work:
        return 0.0, prior
    best: tuple[float, float, float] | None = None
    for step in range(-40, 41):  # r from prior/16 to prior·16
        r = prior * 2 ** (step / 10)
        a = sum(w.seconds for w in work) / max(sum(w.tokens + r * w.keys for w in work), 1e-12)
        misfit = sum(
            (math.log(max(w.seconds, 1e-6)) - math.log(max(a * (w.tokens + r * w.keys), 1e-9))) ** 2 for w in work
        )
        cost = misfit / CHUNK_NOISE**2 + (math.log(r / prior) / RATIO_PRIOR_SPREAD) ** 2
        if best is None or cost < best[0]:
            best = (cost, a, r)
    assert best is not None
    return best[1], best[2]


class PrefillEta:
    """Seconds left in the current phase of a turn's prefill. Feed it every progress event
    (`update`); a new phase (or total) starts its own fit."""

    def __init__(self, ratios: dict[str, float] | float = UNKNOWN_SHAPE_RATIO, *, base: int = 0):
        # r per phase (the draft phase runs another model), and the tokens already cached
        # before the new ones: their keys are read too
        self._ratios = ratios if isinstance(ratios, dict) else {}
        self._default_ratio = ratios if isinstance(ratios, float) else UNKNOWN_SHAPE_RATIO
        self.base = base
        self.phase, self.total = "", 0
        self._last: tuple[float, int] | None = None
        self._work: list[_Work] = []

    def update(self, at: float, done: int, total: int, phase: str = "prompt") -> float | None:
        """The estimate after `done` of `total` at time `at` (None: not yet measurable, or a
        phase without a count)."""
        if phase not in TOKEN_PHASES or total <= 0:
            self.phase, self._last = phase, None
            return None
        if phase != self.phase or total != self.total or self._last is None or done < self._last[1]:
            self.phase, self.total, self._last, self._work = phase, total, (at, done), []
            return None
        last_at, last_done = self._last
        if done > last_done and at > last_at:
            self._work.append(_Work(done - last_done, keys_read(self.base + last_done, self.base + done), at - last_at))
            self._last = (at, done)
        return self.seconds_left()

    def seconds_left(self) -> float | None:
        if not self._work or self._last is None:
            return None
        a, r = _fit(self._work, self._ratios.get(self.phase, self._default_ratio))
        done = self._last[1]
        left = self.total - done
        return a * (left + r * keys_read(self.base + done, self.base + self.total))


class LayerEta:
    """Seconds left in a UniPrefill run: layer i runs over rows_i tokens (fewer after each
    drop layer), costing a·(rows + r·keys), its keys those of the cached prefix and of the
    rows themselves. Future drops are expected to keep what this prompt's drops kept so far,
    shrunk toward KEEP_PRIOR (its later drops kept more than its first: 49-89%). A drop layer
    also scores and selects (~0.3-0.5 s more on SmolLM2): that extra is measured at each drop."""

    def __init__(self, ratio: float, *, layers: int, drop_layers: list[int], base: int = 0):
        self.ratio, self.layers, self.drop_layers, self.base = ratio, layers, sorted(drop_layers), base
        self._last_at: float | None = None
        self._work: list[_Work] = []  # steady layers
        self._drop_work: list[_Work] = []  # drop layers (they also score and select)
        self._keeps: list[float] = []
        self._rows = 0  # tokens the next layer runs over

    def _layer_work(self, rows: float) -> tuple[float, float]:
        return rows, rows * self.base + rows * (rows + 1) / 2

    def start(self, at: float, rows: int) -> None:
        self._last_at, self._rows = at, rows

    def update(self, at: float, layers_done: int, rows: int, kept: int | None = None) -> float | None:
        """Layer `layers_done - 1` ran over `rows` tokens (and, a drop layer, kept `kept`)."""
        if self._last_at is not None and at > self._last_at:
            work = _Work(*self._layer_work(rows), at - self._last_at)
            (self._work if kept is None else self._drop_work).append(work)
        self._last_at, self._rows = at, rows
        if kept is not None and rows:
            self._keeps.append(kept / rows)
            self._rows = kept
        return self.seconds_left(layers_done)

    def seconds_left(self, layers_done: int) -> float | None:
        if not self._work:
            return None
        a, r = _fit(self._work, self.ratio)
        extra = [w.seconds - a * (w.tokens + r * w.keys) for w in self._drop_work]
        overhead = max(0.0, sum(extra) / len(extra)) if extra else 0.0
        keep = math.exp(
            (KEEP_PRIOR_WEIGHT * math.log(KEEP_PRIOR) + sum(map(math.log, self._keeps)))
            / (len(self._keeps) + KEEP_PRIOR_WEIGHT)
        )
        rows, left = float(self._rows), 0.0
        for layer in range(layers_done, self.layers):
            tokens, keys = self._layer_work(rows)
            left += a * (tokens + r * keys)
            if layer in self.drop_layers:
                left += overhead
                rows *= keep
        return left
