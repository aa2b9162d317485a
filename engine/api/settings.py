"""Per-conversation settings, saved with the conversation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.literal_types import (
    ACCEL_MODES,
    OVERFLOW_POLICIES,
    SPEC_RULES,
    AccelMode,
    OverflowPolicy,
    SpecRule,
)

# The app's embedded default: Apache-2.0 and small enough for any machine.
DEFAULT_MODEL_ID = "smollm2-135m-instruct"
# 512-token prefill chunks run ~1.6x faster than mlx-lm's 2048 on our CPUs
# (shared/CPU.md: 88 vs 53 tok/s at 2048 tokens) and make cancellation snappier.
DEFAULT_PREFILL_STEP = 512
DEFAULT_MAX_TOKENS = 512

SPARSE_MODES = SPEC_MODES = ACCEL_MODES
# Beyond this a prefill chunk's attention scores alone reach gigabytes (and MKL has
# crashed on 28K-token chunks); longer prompts are prefilled in several chunks anyway.
MAX_PREFILL_STEP = 8192
# k = 3 is where fixed-k drafting usually peaked in the MLX studies; `auto` picks its own.
DEFAULT_NUM_DRAFT = 3


@dataclass
class ChatSettings:
    model: str = DEFAULT_MODEL_ID
    system_prompt: str | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int | None = None
    # What to do when the conversation no longer fits the context window.
    context_overflow: OverflowPolicy = "refuse"
    prefill_step_size: int = DEFAULT_PREFILL_STEP
    # KV cache: 16 stores it unpacked in float16 (engine/kv/half.py); 8/4 packs
    # (engine/kv/packed_cache.py). kv_bits is the shorthand for both; k_bits / v_bits, when set,
    # choose keys and values separately.
    kv_bits: int = 16
    k_bits: int | None = None
    v_bits: int | None = None
    # auto: the smallest precision that passed this model's fidelity self-test (engine/kv/fidelity.py)
    kv_auto: bool = False
    kv_group_size: int = 32
    kv_quant_start: int = 0  # tokens held before a layer is packed
    # SpecPrefill (engine/accel/specprefill/scoring.py): the draft scores, the target prefills the kept part.
    draft: str | None = None
    sparse_prefill: AccelMode = "off"  # off | on (fixed keep) | auto (adaptive keep, long prompts only)
    sparse_keep: float = 0.2  # the paper's default share of 32-token chunks
    sparse_threshold: int = 8192  # `auto` acts on at least this many new tokens
    # UniPrefill (engine/accel/uniprefill/): no draft; the target drops unimportant 64-token
    # blocks at some of its own layers. `auto` acts on long prompts only; when a draft is set
    # and SpecPrefill is on, SpecPrefill goes first (engine/accel/router.py).
    uniprefill: AccelMode = "off"
    uniprefill_p: float | None = None  # attention mass kept at each drop layer (None: the model's default)
    drop_layers: list | None = None  # layer indices (None: chosen from the model's depth)
    # `auto` acts on at least this many new tokens (None: the break-even measured for the
    # model's architecture, engine/accel/uniprefill/plan.py)
    uniprefill_threshold: int | None = None
    # Speculative decoding (engine/accel/speculative/decoder.py) with the same draft; `auto` picks k
    # per cycle and decodes plainly when drafting would not pay.
    spec_decode: AccelMode = "auto"
    num_draft: int = DEFAULT_NUM_DRAFT  # draft tokens per cycle in `on` mode
    # Lookup decoding (engine/accel/speculative/lookup.py): continuations found in the
    # conversation itself are proposed for free; no draft model needed.
    lookup: bool = True
    spec_rule: SpecRule = "rejection"  # same tokenizer: rejection sampling, or `match` (mlx-lm's rule)
    translation_prefix: int = 4  # cross tokenizer: tokens of context re-encoded with a draft
    # False: the messages' text goes to the model as is (the server's /v1/completions), not
    # through the model's chat template.
    chat_template: bool = True

    def validate(self) -> "ChatSettings":
        problems = self._type_problems()
        if problems:  # comparing a string or NaN below would raise or pass silently
            raise InvalidSettings("Invalid chat settings: " + "; ".join(problems))
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0 (got {self.top_k})")
        if not 0 <= self.min_p < 1:
            problems.append(f"min_p must be in [0, 1) (got {self.min_p})")
        if self.repetition_penalty <= 0:
            problems.append(f"repetition_penalty must be > 0 (got {self.repetition_penalty})")
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1 (got {self.max_tokens})")
        if self.context_overflow not in OVERFLOW_POLICIES:
            problems.append(f"context_overflow must be one of {OVERFLOW_POLICIES}")
        if self.prefill_step_size < 1:
            problems.append("prefill_step_size must be >= 1")
        for name in ("kv_bits", "k_bits", "v_bits"):
            if getattr(self, name) not in (16, 8, 4) and not (name != "kv_bits" and getattr(self, name) is None):
                problems.append(f"{name} must be 16, 8 or 4 (got {getattr(self, name)})")
        if self.kv_group_size not in (32, 64):
            problems.append(f"kv_group_size must be 32 or 64 (got {self.kv_group_size})")
        if self.kv_quant_start < 0:
            problems.append("kv_quant_start must be >= 0")
        if self.sparse_prefill not in SPARSE_MODES:
            problems.append(f"sparse_prefill must be one of {SPARSE_MODES}")
        if not 0 < self.sparse_keep <= 1:
            problems.append(f"sparse_keep must be in (0, 1] (got {self.sparse_keep})")
        if self.sparse_threshold < 0:
            problems.append("sparse_threshold must be >= 0")
        if self.uniprefill not in ACCEL_MODES:
            problems.append(f"uniprefill must be one of {ACCEL_MODES}")
        if self.uniprefill_p is not None and not 0 < self.uniprefill_p <= 1:
            problems.append(f"uniprefill_p must be in (0, 1] (got {self.uniprefill_p})")
        if self.drop_layers is not None and not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 4096 for i in self.drop_layers
        ):
            problems.append(f"drop_layers must be layer indices (got {self.drop_layers!r})")
        if self.uniprefill_threshold is not None and self.uniprefill_threshold < 0:
            problems.append("uniprefill_threshold must be >= 0")
        if self.spec_decode not in SPEC_MODES:
            problems.append(f"spec_decode must be one of {SPEC_MODES}")
        if not 1 <= self.num_draft <= 16:
            problems.append(f"num_draft must be in [1, 16] (got {self.num_draft})")
        if self.spec_rule not in SPEC_RULES:
            problems.append(f"spec_rule must be one of {SPEC_RULES}")
        if not 1 <= self.translation_prefix <= 64:
            problems.append(f"translation_prefix must be in [1, 64] (got {self.translation_prefix})")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            problems.append(f"seed must be in [0, 2**63) (got {self.seed})")
        if self.prefill_step_size > MAX_PREFILL_STEP:
            problems.append(f"prefill_step_size must be at most {MAX_PREFILL_STEP} (got {self.prefill_step_size})")
        if problems:
            raise InvalidSettings("Invalid chat settings: " + "; ".join(problems))
        return self

    def kv_precision(self) -> tuple[int, int]:
        """(key bits, value bits): each its own setting when given, else kv_bits."""
        return (
            self.kv_bits if self.k_bits is None else self.k_bits,
            self.kv_bits if self.v_bits is None else self.v_bits,
        )

    def kv_mode(self) -> tuple[int, int, int]:
        """What a prompt cache was built with: another mode cannot reuse it."""
        return (*self.kv_precision(), self.kv_group_size)

    def _type_problems(self) -> list[str]:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            kind = FIELD_TYPES[f.name]
            if value is None and f.name in OPTIONAL_FIELDS:
                continue
            if kind is bool:
                if not isinstance(value, bool):
                    problems.append(f"{f.name} must be true or false, not {value!r}")
            elif isinstance(value, bool) or not isinstance(value, kind):
                problems.append(
                    f"{f.name} must be {kind.__name__ if isinstance(kind, type) else 'a number'}, not {value!r}"
                )
            elif isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{f.name} must be a finite number (got {value})")
        return problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ChatSettings":
        """Build from saved data, ignoring keys written by newer versions."""
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in known}
        if kept.get("uniprefill_threshold") == LEGACY_UNIPREFILL_THRESHOLD:
            kept["uniprefill_threshold"] = None
        return cls(**kept).validate()


def layer_list(text: str) -> list[int]:
    """ "7,11,15" -> [7, 11, 15] (an argparse type: it raises what argparse reports)."""
    import argparse

    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer indices such as 7,11,15 (got {text!r})") from None


_NUMBER = (int, float)
# What each setting holds (saved settings and JSON imports are untrusted input).
FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": str,
    "system_prompt": str,
    "temperature": _NUMBER,
    "top_p": _NUMBER,
    "top_k": int,
    "min_p": _NUMBER,
    "repetition_penalty": _NUMBER,
    "max_tokens": int,
    "seed": int,
    "context_overflow": str,
    "prefill_step_size": int,
    "kv_bits": int,
    "k_bits": int,
    "v_bits": int,
    "kv_auto": bool,
    "kv_group_size": int,
    "kv_quant_start": int,
    "draft": str,
    "sparse_prefill": str,
    "sparse_keep": _NUMBER,
    "sparse_threshold": int,
    "spec_decode": str,
    "num_draft": int,
    "spec_rule": str,
    "translation_prefix": int,
    "uniprefill": str,
    "uniprefill_p": _NUMBER,
    "drop_layers": list,
    "uniprefill_threshold": int,
    "lookup": bool,
    "chat_template": bool,
}
OPTIONAL_FIELDS = {
    "system_prompt",
    "seed",
    "draft",
    "uniprefill_p",
    "drop_layers",
    "uniprefill_threshold",
    "k_bits",
    "v_bits",
}
# The one UniPrefill threshold every chat saved before per-model break-evens carries; no
# control set it, so it reads as "the model's" (None).
LEGACY_UNIPREFILL_THRESHOLD = 4096
