"""UniPrefill's settings for one turn: the attention mass kept per drop layer and the
drop layers, from the chat's settings or the model's defaults."""

from __future__ import annotations

from dataclasses import dataclass

from brisk.engine.accel.uniprefill.prefill import UniPrefill
from brisk.engine.accel.uniprefill.selection import MIN_TOKENS

# The released code's p for Llama-3.1-8B, and `auto`'s break-even before one was measured.
DEFAULT_P = 0.99
DEFAULT_BREAK_EVEN = 4096


@dataclass(frozen=True)
class ModelDefaults:
    """What `brisk bench uniprefill` and `uniprefill-quality` measured for an architecture:
    the fastest p that kept the quality goals, and the prompt length from which that p
    read the prompt faster than dense prefill (`auto` acts from there on)."""

    p: float = DEFAULT_P
    break_even: int = DEFAULT_BREAK_EVEN


# Per mlx-lm architecture (the model_type its module is named after), from runs on this
# machine's 2 cores (README, UniPrefill):
# - qwen2 (Qwen2.5-Coder-1.5B, 8K filler prompt): p 0.99 read it 1.45x faster than dense
#   with every quality goal kept; 0.985 1.55x, needle 3/3, counting recall 1.00 of dense
#   (6 seeds), perplexity 0.99 of dense; 0.98 1.62x but recall 0.85.
#   Qwen2.5-Coder-0.5B at 0.985: 1.20x at 1K, 1.44x at 2K.
# - llama (SmolLM2-135M, p 0.99): 1.42x at 2K, 1.80x at 8K. It lost the needle at 10%
#   depth that dense finds at 0.99 and at 0.995 alike (perplexity 1.04x / 1.00x dense).
# - gemma3_text (Gemma-3-270M): no p tested (0.95-0.99) kept the needle that dense finds at
#   half depth; at 0.99 it was 0.99-1.13x dense at 8K and 1.10x at 16K: `auto` waits for
#   long prompts.
BY_ARCHITECTURE: dict[str, ModelDefaults] = {
    "qwen2": ModelDefaults(p=0.985, break_even=2048),
    "llama": ModelDefaults(p=0.99, break_even=2048),
    "gemma3_text": ModelDefaults(p=0.99, break_even=16384),
}


def defaults_for(architecture: str) -> ModelDefaults:
    return BY_ARCHITECTURE.get(architecture, ModelDefaults())


def model_defaults(config: dict) -> ModelDefaults:
    args = config.get("text_config") or config
    return defaults_for(args.get("model_type", ""))


def default_p(config: dict) -> float:
    return model_defaults(config).p


def break_even(settings, config: dict) -> int:
    """New tokens from which `auto` runs UniPrefill: the chat's own threshold, else the model's."""
    if settings.uniprefill_threshold is not None:
        return settings.uniprefill_threshold
    return model_defaults(config).break_even


def make_uniprefill(lm, layers: list, settings) -> UniPrefill:
    p = settings.uniprefill_p if settings.uniprefill_p is not None else default_p(lm.config)
    return UniPrefill(lm.model, layers, drop_layers=settings.drop_layers, p=p, step=settings.prefill_step_size)


def worth_dropping(new_tokens: int) -> bool:
    """Prompts of MIN_TOKENS or fewer new tokens drop nothing (the sinks and the query
    window are all of them)."""
    return new_tokens - 1 > MIN_TOKENS
