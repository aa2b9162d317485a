"""Sampling: mlx-lm's sampler for plain decoding, and the same transforms as explicit
probability distributions for speculative decoding's rejection test.

mlx-lm's sampler applies logits processors (repetition penalty), then top-p, min-p and
top-k on the log-probabilities, then samples softmax(logprobs / temperature). The
distributions here follow the same order with mlx-lm's own filter functions, so a token
accepted or resampled from them has exactly the law plain sampling would give it. At a bare
temperature (no top-p, min-p or top-k) both draw with the native kernel of
kernels/sampling.py instead: the same softmax(logits / t), without MLX's slow exp and log
over the whole vocabulary.
"""

from __future__ import annotations

import mlx.core as mx

from brisk.engine.api.settings import ChatSettings
from brisk.engine.runtime.mx_values import item_float


def make_sampling(settings: ChatSettings):
    """The sampler and logits processors for these settings (plain decoding): mlx-lm's,
    except temperature alone on the CPU, which the native kernel draws from the same law
    (kernels/sampling.py: mlx-lm's Gumbel draw cost ~4.9 ms a token over 152K tokens)."""
    from mlx_lm.sample_utils import make_sampler

    native = _native_temperature_sampler(settings)
    sampler = native or make_sampler(
        settings.temperature, top_p=settings.top_p, min_p=settings.min_p, top_k=settings.top_k
    )
    return sampler, _processors(settings)


def _native_temperature_sampler(settings: ChatSettings):
    """kernels/sampling.py's sampler where the settings are a bare temperature (no top-p,
    min-p or top-k) and it runs here, else None."""
    from brisk.kernels.sampling import temperature_sampler

    filtered = 0 < settings.top_p < 1 or settings.min_p > 0 or settings.top_k > 0
    return temperature_sampler(settings.temperature) if settings.temperature > 0 and not filtered else None


def needs_log_probabilities(settings: ChatSettings) -> bool:
    """Whether mlx-lm's sampler for these settings must see log-probabilities rather than
    logits. Argmax, categorical sampling (softmax(x / t)), min-p (relative to the top token)
    and top-k pick the same tokens from logits shifted by a constant; top-p takes exp() of
    its input, which unnormalized logits could overflow."""
    return settings.temperature > 0 and 0 < settings.top_p < 1


# Tokens a repetition penalty looks back over (mlx-lm's default): the history processors see.
REPETITION_CONTEXT = 20


def _processors(settings: ChatSettings) -> list:
    from mlx_lm.sample_utils import make_logits_processors

    return make_logits_processors(
        repetition_penalty=settings.repetition_penalty if settings.repetition_penalty != 1.0 else None,
        repetition_context_size=REPETITION_CONTEXT,
    )


def with_prompt_history(processors: list, before: list[int]) -> list:
    """Processors for a generate_step given only the prompt's last token (the rest is
    already in the cache): they see the prompt's tail before it, as a penalty should, and as
    the speculative decoder's processors do. Without it a repeated prompt word went unpenalized."""
    if not processors or not before:
        return processors
    tail = mx.array(before[-REPETITION_CONTEXT:], dtype=mx.uint32)
    return [lambda tokens, logits, p=p: p(mx.concatenate([tail, tokens.astype(mx.uint32)]), logits) for p in processors]


class TokenDistribution:
    """Logits rows -> the sampling distribution (float32) under the chat's settings."""

    def __init__(self, settings: ChatSettings):
        self.settings = settings
        self.processors = _processors(settings)
        self._native = _native_temperature_sampler(settings)

    @property
    def greedy(self) -> bool:
        return self.settings.temperature == 0

    def process(self, logits: mx.array, history: list[int], extra: list[int]) -> mx.array:
        """Apply logits processors row by row: row i has seen history + extra[:i]. (m, V)"""
        logits = logits.astype(mx.float32)
        if not self.processors:
            return logits
        rows = []
        recent = history[-REPETITION_CONTEXT:]  # all a processor reads: no copy of a long chat per row
        for i in range(logits.shape[0]):
            seen = mx.array((recent + extra[:i])[-REPETITION_CONTEXT:], dtype=mx.uint32)
            row = logits[i : i + 1]
            for processor in self.processors:
                row = processor(seen, row)
            rows.append(row)
        return mx.concatenate(rows, axis=0)

    def probs(self, logits: mx.array, history: list[int], extra: list[int]) -> mx.array:
        """Sampling probabilities per row (m, V); one-hot on the argmax when greedy."""
        logits = self.process(logits, history, extra)
        if self.greedy:
            return (mx.arange(logits.shape[-1]) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
        return mx.softmax(self._filtered(logits) / self.settings.temperature, axis=-1, precise=True)

    def draw(self, logits: mx.array, history: list[int], extra: list[int]) -> mx.array:
        """One token per row from the sampling distribution (not greedy), as
        `sample(self.probs(...))` draws it. At a bare temperature the native kernel draws from
        the same softmax(logits / t) without MLX's four passes of exp and log over the
        vocabulary (a default chat on Qwen-0.5B: 56 -> 43 ms a token)."""
        if self._native is not None:
            return self._native(self.process(logits, history, extra))
        return sample(self.probs(logits, history, extra))

    def confidence(self, logits: mx.array, probs: mx.array, history: list[int], token: int) -> float:
        """The probability the model gives its own pick `token` from one row: its sampling
        probability, or when greedy the softmax of the processed logits (one-hot says nothing)."""
        if not self.greedy:
            return item_float(probs[0, token])
        row = mx.softmax(self.process(logits, history, [])[0], precise=True)
        return item_float(row[token])

    def _filtered(self, logits: mx.array) -> mx.array:
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        s = self.settings
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < s.top_p < 1.0:
            logprobs = apply_top_p(logprobs, s.top_p)
        if s.min_p != 0.0:
            logprobs = apply_min_p(logprobs, s.min_p)
        if s.top_k > 0:
            logprobs = apply_top_k(logprobs, s.top_k)
        return logprobs


def sample(probs: mx.array) -> mx.array:
    """One token per row of a probability matrix (m, V) -> (m,)."""
    return mx.random.categorical(mx.log(mx.maximum(probs, 0.0)))
