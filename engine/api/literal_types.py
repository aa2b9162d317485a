"""The engine's words for what happened, as types the app and the CLI read directly
(no parsing of human-readable text such as "used: kept 12 of 40")."""

from __future__ import annotations

from typing import Literal, get_args

# Why an answer ended. `interrupted`: the app was killed mid-answer (set by the store).
FinishReason = Literal["stop", "length", "context", "cancelled", "error", "interrupted"]
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)

# What sparse prefill did this turn: not asked for or not applicable (`off`), declined by
# its own rules (`declined`), failed and fell back to a full prefill (`fallback`), `used`.
SparseOutcome = Literal["off", "declined", "fallback", "used"]
SPARSE_OUTCOMES: tuple[str, ...] = get_args(SparseOutcome)

AccelMode = Literal["off", "on", "auto"]  # sparse prefill and speculative decoding alike
ACCEL_MODES: tuple[str, ...] = get_args(AccelMode)

SpecRule = Literal["rejection", "match"]
SPEC_RULES: tuple[str, ...] = get_args(SpecRule)

OverflowPolicy = Literal["refuse", "truncate_oldest"]
OVERFLOW_POLICIES: tuple[str, ...] = get_args(OverflowPolicy)

# What a turn is doing before its first token: the KV self-test (once per model), a
# draft reading the prompt for SpecPrefill, the draft choosing what to keep, the model
# reading the kept part, or the model reading the prompt (dense or UniPrefill).
PrefillPhase = Literal["kv_check", "draft", "select", "kept", "prompt"]
PREFILL_PHASES: tuple[str, ...] = get_args(PrefillPhase)
