"""Plain decoding (no draft, no lookup): the compiled step where it applies, else mlx-lm's
`generate_step`. Both run each token before yielding it (the next one is computed ahead),
so the prompt cache holds every yielded token, and `cache.tokens` says so."""

from __future__ import annotations

import logging
from typing import Generator, Iterator

import mlx.core as mx

from brisk.engine.api.settings import ChatSettings
from brisk.engine.decode.compiled import compiled_steps, why_not_compiled
from brisk.engine.decode.sampling import make_sampling, needs_log_probabilities, with_prompt_history
from brisk.engine.kv import PromptCache

log = logging.getLogger(__name__)


def plain_steps(
    tokens: list[int], cache: PromptCache, max_tokens: int, settings: ChatSettings, report: dict
) -> Generator[tuple[int, str], None, None]:
    """(token, "") pairs after the cache's layers, which hold all prompt tokens but the last.
    `report["decode_step"]` (a TurnMetrics field) says which step ran: "compiled", or
    "mlx-lm" and why not; it is set before the first token comes out."""
    sampler, processors = make_sampling(settings)
    processors = with_prompt_history(processors, tokens[:-1])
    cache.tokens = list(tokens)
    reason = why_not_compiled(cache.model, cache.layers, kv_bits=settings.kv_precision())
    if reason is None and cache.layers is not None:
        report["decode_step"] = "compiled"
        steps = compiled_steps(
            cache.model_view(),
            cache.layers,
            tokens[-1],
            max_tokens=max_tokens,
            sampler=sampler,
            processors=processors,
            normalize=needs_log_probabilities(settings),
        )
        try:
            first = next(steps, None)  # traced here: a model the trace cannot take falls back
        except Exception as failed:  # noqa: BLE001  (the layers are restored; the turn goes on)
            log.warning("the compiled decode step failed, decoding with mlx-lm's: %s", failed)
            reason = f"the compiled step failed ({type(failed).__name__}: {failed})"
        else:
            yield from _recorded(cache, _chain(first, steps))
            return
    report["decode_step"] = f"mlx-lm: {reason}"
    yield from _recorded(cache, _generate_steps(tokens, cache, max_tokens, settings, sampler, processors))


def _chain(first: int | None, steps: Generator[int, None, None]) -> Generator[int, None, None]:
    try:
        if first is not None:
            yield first
            yield from steps
    finally:
        steps.close()


def _recorded(cache: PromptCache, steps: Generator[int, None, None]) -> Iterator[tuple[int, str]]:
    try:
        for token in steps:
            cache.tokens.append(token)
            yield token, ""
    finally:
        steps.close()


def _generate_steps(
    tokens, cache: PromptCache, max_tokens, settings, sampler, processors
) -> Generator[int, None, None]:
    from mlx_lm.generate import generate_step

    steps = generate_step(
        mx.array(tokens[-1:]),
        cache.model_view(),
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=processors,
        prompt_cache=cache.layers,
        prefill_step_size=settings.prefill_step_size,
    )
    try:
        for step, _ in steps:
            yield int(step)  # mlx-lm yields the id as a Python int (its stubs say array)
    finally:
        steps.close()
