"""UniPrefill's settings for one turn: the attention mass kept per drop layer and the
drop layers, from the chat's settings or the model's defaults."""

from __future__ import annotations

from engine.accel.uniprefill.prefill import UniPrefill
from engine.accel.uniprefill.selection import MIN_TOKENS

# The released code's p for Llama-3.1-8B; per model type where measurements chose another
# (bench uniprefill: the quality goals at the highest speed).
DEFAULT_P = 0.99
P_BY_MODEL_TYPE: dict[str, float] = {}


def default_p(config: dict) -> float:
    args = config.get("text_config") or config
    return P_BY_MODEL_TYPE.get(args.get("model_type", ""), DEFAULT_P)


def make_uniprefill(lm, layers: list, settings) -> UniPrefill:
    p = settings.uniprefill_p if settings.uniprefill_p is not None else default_p(lm.config)
    return UniPrefill(lm.model, layers, drop_layers=settings.drop_layers, p=p, step=settings.prefill_step_size)


def worth_dropping(new_tokens: int) -> bool:
    """Prompts of MIN_TOKENS or fewer new tokens drop nothing (the sinks and the query
    window are all of them)."""
    return new_tokens - 1 > MIN_TOKENS
