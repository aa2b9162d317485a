"""One conversation: messages, settings, and the prompt cache of its last turn.

A turn renders the chat template, reuses the longest cached token prefix, prefills
only the new tokens (in chunks, reporting progress and honouring cancellation; with
SpecPrefill only the chunks a draft scores as important), then decodes with mlx-lm's
`generate_step`. The cache may be packed to int8/int4 (engine/kvcache.py). Editing or
regenerating an earlier message trims the cache back to the common prefix. Errors come
out as `EngineErrored` events, degradations as `EngineWarned`.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Iterator

import mlx.core as mx

from engine.accel.coverage import coverage_map
from engine.accel.router import route_prefill
from engine.accel.specprefill.scoring import sparse_prefill
from engine.accel.speculative.controller import PairCosts
from engine.accel.speculative.pair import DraftPair
from engine.accel.uniprefill.flops import flops_saved
from engine.accel.uniprefill.plan import make_uniprefill
from engine.accel.uniprefill.prefill import UniPrefillUnsupported
from engine.cache import PromptCache
from engine.conversation import CancelToken, Message  # noqa: F401  (re-exported: the Session API)
from engine.crash_log import user_message
from engine.detokenize import StreamingText
from engine.errors import BriskError, ContextOverflow, InvalidSettings, TurnCancelled
from engine.events import ContextTruncated, EngineErrored, EngineWarned, PrefillProgressed, TokenEmitted, TurnFinished
from engine.kvcache import check_kv_packable, kv_shape
from engine.metrics import TurnMetrics, kv_bytes_allocated, kv_bytes_formula, kv_bytes_measured
from engine.models.loader import LoadedModel
from engine.prefill import check_prefill_memory, prefill_chunks
from engine.prompt import render_prompt
from engine.sampling import make_sampling
from engine.settings import ChatSettings

log = logging.getLogger(__name__)


class Session:
    def __init__(self, lm: LoadedModel, settings: ChatSettings | None = None,
                 messages: list[Message] | None = None, *, draft: LoadedModel | None = None,
                 pair_costs: PairCosts | None = None):
        self.lm = lm
        self.settings = (settings or ChatSettings(model=lm.id)).validate()
        self.messages: list[Message] = list(messages or [])
        self.cache = PromptCache(lm.model)  # the target's layers, tokens, KV mode and position map
        # draft/verify times measured per model pair, shared by the owner's sessions
        self.pair_costs = pair_costs or PairCosts()
        self.use_draft(draft)

    def use_draft(self, draft: LoadedModel | None) -> None:
        """Set (or clear) the draft model. Only the draft's own state starts over: the
        target's prompt cache is kept, so the next turn still prefills only new tokens."""
        self.pair = DraftPair.make(self.lm, draft) if draft is not None else None

    @property
    def draft(self) -> LoadedModel | None:
        return self.pair.draft if self.pair is not None else None

    # --- public turn entry points -------------------------------------------------

    def answer(self, messages: list[Message] | None = None, *, cancel: CancelToken | None = None) -> Iterator[object]:
        """Answer the conversation `messages` (default: the session's own), whose last
        message is the user's. The prompt cache reuses whatever prefix it already holds, so
        a new turn, a regenerate and an edit all read only what changed."""
        if messages is not None:
            self.messages = list(messages)
        if not self.messages or self.messages[-1].role != "user":
            raise InvalidSettings("Nothing to answer: the conversation does not end with a user message")
        return self._turn(cancel or CancelToken())

    def send(self, text: str, *, cancel: CancelToken | None = None) -> Iterator[object]:
        self.messages.append(Message("user", text))
        return self._turn(cancel or CancelToken())

    def regenerate(self, *, cancel: CancelToken | None = None) -> Iterator[object]:
        while self.messages and self.messages[-1].role == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1].role != "user":
            raise InvalidSettings("Nothing to regenerate: the conversation has no user message")
        return self._turn(cancel or CancelToken())

    def edit(self, index: int, text: str, *, cancel: CancelToken | None = None) -> Iterator[object]:
        """Replace user message `index`, drop everything after it, answer again."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user":
            raise InvalidSettings(f"Message {index} is not a user message")
        del self.messages[index + 1:]
        self.messages[index] = Message("user", text)
        return self._turn(cancel or CancelToken())

    @property
    def cached_tokens(self) -> int:
        return len(self.cache)

    def save_cache(self, path) -> None:
        """Write the prompt cache (any KV mode, sparse or not) so a reopened chat skips its prefill."""
        if self.cache.layers is None:
            raise BriskError("Nothing to save: this conversation has no prompt cache yet")
        self.cache.save(path, self._identity())

    def load_cache(self, path) -> None:
        """Adopt a cache written by `save_cache` for the same model; refuse anything else."""
        self.cache.load(path, self._identity())

    def _identity(self) -> dict:
        return {"model": self.lm.id, "tokenizer": self.lm.info.tokenizer_fingerprint}

    # --- the turn -----------------------------------------------------------------

    def _turn(self, cancel: CancelToken) -> Iterator[object]:
        answer = Message("assistant", "")
        metrics = TurnMetrics(kv_bits=self.settings.kv_bits)
        try:
            yield from self._run_turn(cancel, answer, metrics)
        except TurnCancelled:
            metrics.finish_reason = "cancelled"
        except BriskError as exc:
            metrics.finish_reason = "error"
            yield EngineErrored(str(exc), exc.kind)
        except Exception as exc:  # never let a turn crash the engine thread
            log.exception("turn failed")
            self.cache.reset()  # the cache may hold a half-applied step
            metrics.finish_reason = "error"
            yield EngineErrored(user_message(exc, context="Generation"), "internal", traceback.format_exc())
        answer.finish_reason = metrics.finish_reason
        answer.metrics = metrics.to_dict()
        if answer.content or answer.finish_reason in ("stop", "length", "context", "cancelled"):
            self.messages.append(answer)
        if metrics.finish_reason != "error":
            yield TurnFinished(answer.content, list(answer.token_ids), metrics)

    def _run_turn(self, cancel: CancelToken, answer: Message, metrics: TurnMetrics) -> Iterator[object]:
        settings = self.settings.validate()
        start = time.perf_counter()
        mx.reset_peak_memory()
        rendered = render_prompt(self.lm, self.messages, settings, cancelled=lambda: cancel.cancelled)
        if rendered.dropped_messages:
            yield ContextTruncated(rendered.dropped_messages, len(rendered.tokens))
        tokens = rendered.tokens
        budget = self.lm.context_length - len(tokens)
        if budget < 1:
            raise ContextOverflow(len(tokens) + 1, self.lm.context_length, self.lm.id)
        max_tokens = min(settings.max_tokens, budget)

        if settings.kv_bits < 16:
            check_kv_packable(self.lm.config, settings.kv_group_size)
        self.cache.ensure_mode((settings.kv_bits, settings.kv_group_size))
        pack = lambda: self.cache.pack(  # noqa: E731
            bits=settings.kv_bits, group_size=settings.kv_group_size, start=settings.kv_quant_start)
        cached = self.cache.reuse(tokens)
        metrics.prompt_tokens, metrics.cached_tokens = len(tokens), cached
        metrics.prefilled_tokens = len(tokens) - cached
        yield PrefillProgressed(0, metrics.prefilled_tokens)

        yield from self._prefill(tokens, cached, settings, metrics, cancel, pack)
        prompt_read_at = time.perf_counter()

        if settings.seed is not None:
            mx.random.seed(settings.seed)
        # Both decoders keep `self.cache.tokens` true as they go (plain: every yielded
        # token is in the cache; speculative: all but the last, set when it stops).
        steps, decoder = self._decoding(tokens, max_tokens, settings)
        text = StreamingText(self.lm.tokenizer, seed=tokens)
        eos = set(self.lm.tokenizer.eos_token_ids)
        first_at = None
        metrics.finish_reason = "context" if max_tokens < settings.max_tokens else "length"
        try:
            for token, from_draft in steps:
                yield from _drain_warnings(decoder)
                pack()
                if first_at is None:
                    first_at = time.perf_counter()
                    metrics.ttft_s = first_at - start
                    yield PrefillProgressed(metrics.prefilled_tokens, metrics.prefilled_tokens)
                if token in eos:
                    metrics.finish_reason = "stop"
                    break
                answer.token_ids.append(token)
                delta = text.add(token)
                answer.content += delta
                yield TokenEmitted(delta, token, from_draft)
                cancel.check()
        finally:
            steps.close()
            if decoder is not None:
                for name, value in decoder.stats.to_metrics().items():
                    setattr(metrics, name, value)
                metrics.from_draft = decoder.stats.from_draft[:len(answer.token_ids)]
            tail = text.flush()
            answer.content += tail
            self._finish_metrics(metrics, start, first_at, len(answer.token_ids), prompt_read_at)
        yield from _drain_warnings(decoder)
        if tail:
            yield TokenEmitted(tail, -1)

    def _prefill(self, tokens, cached, settings, metrics, cancel, pack) -> Iterator[object]:
        """All prompt tokens but the last into the cache (generate_step runs the last one):
        dense chunks, SpecPrefill's kept runs or UniPrefill's layer-by-layer drops, as the
        router picks (engine/accel/router.py)."""
        suffix = tokens[cached:]
        import engine.info

        step = min(settings.prefill_step_size, max(len(suffix) - 1, 1))
        check_prefill_memory(self.lm, step, len(tokens), engine.info.memory_available())
        route = route_prefill(self.pair, self.lm, self.cache.layers, tokens, cached, settings)
        plan = route.spec
        metrics.sparse_prefill, metrics.sparse_outcome, metrics.scoring_s = plan.note, plan.outcome, plan.scoring_s
        metrics.prefill_method, metrics.prefill_route = route.method, route.reason
        if plan.warning:
            yield EngineWarned(plan.warning, "sparse_prefill")
        if route.method == "uniprefill":
            done = yield from self._uniprefill(tokens, cached, settings, metrics, cancel, pack)
            if done:
                return
            cached = metrics.cached_tokens  # it fell back: a dense prefill of what is left
            suffix = tokens[cached:]
        if route.method != "specprefill":
            for done in prefill_chunks(self.cache.model_view(), self.cache.layers, suffix[:-1],
                                       settings.prefill_step_size):
                self.cache.tokens = tokens[: cached + done]
                pack()
                yield PrefillProgressed(done, metrics.prefilled_tokens)
                cancel.check()
            return
        selection = plan.selection
        started = time.perf_counter()
        runs = [(s, min(e, len(suffix) - 1)) for s, e in selection.runs if s < len(suffix) - 1]
        try:
            for done in sparse_prefill(self.lm.model, self.cache.layers, suffix, runs, base=cached,
                                       step=settings.prefill_step_size):
                pack()
                yield PrefillProgressed(done, selection.kept)
                cancel.check()
        except BaseException:
            self.cache.reset()  # a half-built sparse cache has no consistent prefix to keep
            raise
        self.cache.mark_sparse(tokens[:-1])
        metrics.sparse_prefill_s = time.perf_counter() - started
        metrics.prefilled_tokens = selection.kept
        metrics.kept_tokens = selection.kept
        metrics.coverage = coverage_map(self.lm.tokenizer, suffix[:-1], [(-1, runs)])

    def _uniprefill(self, tokens, cached, settings, metrics, cancel, pack) -> Iterator[object]:
        """UniPrefill of tokens[cached:-1]; returns False when it cannot run on this model:
        the turn is warned and the caller prefills densely from what the cache still holds
        (all of it when the model was declined before any layer ran, as it usually is)."""
        new = len(tokens) - 1 - cached
        runner = make_uniprefill(self.lm, self.cache.layers, settings)
        started = time.perf_counter()
        layers = len(self.lm.model.layers)
        try:
            for done in runner.run(tokens[cached:-1], base=cached):
                yield PrefillProgressed(new * done // layers, metrics.prefilled_tokens)
                cancel.check()
        except UniPrefillUnsupported as exc:
            if runner.layer_tokens:  # some layers ran: their caches hold tokens the others lack
                self._restart_cache(tokens, metrics)
            metrics.prefill_method, metrics.prefill_route = "dense", f"dense: UniPrefill unsupported ({exc})"
            yield EngineWarned(f"UniPrefill cannot run on this model, reading the prompt densely: {exc}", "uniprefill")
            return False
        except BaseException:
            self.cache.reset()  # layers hold different numbers of tokens: no consistent prefix to keep
            raise
        self.cache.mark_sparse(tokens[:-1])
        pack()
        metrics.uniprefill_s = time.perf_counter() - started
        metrics.drops = [[r.layer, r.before, r.kept] for r in runner.reports]
        metrics.coverage = coverage_map(self.lm.tokenizer, tokens[cached:-1],
                                        [(r.layer, r.kept_runs) for r in runner.reports])
        metrics.kept_tokens = runner.reports[-1].kept if runner.reports else new
        metrics.flops_saved = flops_saved(self.lm.config, runner.layer_tokens, cached)
        return True

    def _restart_cache(self, tokens, metrics) -> None:
        """Start the cache over after a sparse prefill half-filled it."""
        self.cache.reset()
        self.cache.ensure_mode((self.settings.kv_bits, self.settings.kv_group_size))
        metrics.cached_tokens = self.cache.reuse(tokens)
        metrics.prefilled_tokens = len(tokens) - metrics.cached_tokens

    def _decoding(self, tokens, max_tokens, settings):
        """The token steps of this turn, (token, from_draft) pairs: mlx-lm's generate_step,
        or the speculative decoder when a draft is set (returned too, for its stats)."""
        if settings.spec_decode == "off" or self.draft is None:
            return _plain_steps(tokens, self.cache, max_tokens, settings), None
        decoder = self.pair.make_decoder(self.cache, settings, max_tokens=max_tokens, costs=self.pair_costs)
        return decoder.steps(tokens), decoder

    # --- helpers ------------------------------------------------------------------

    def _finish_metrics(self, metrics: TurnMetrics, start: float, first_at: float | None, n: int,
                        prompt_read_at: float) -> None:
        end = time.perf_counter()
        metrics.total_s = end - start
        metrics.generation_s = end - prompt_read_at
        metrics.generated_tokens = n
        if first_at is not None:
            # The prompt tokens this turn served (read or, under sparse prefill, skipped) per
            # second of TTFT: a sparse turn is compared with a dense one on the same footing.
            served = metrics.prompt_tokens - metrics.cached_tokens
            metrics.prefill_tps = served / max(metrics.ttft_s, 1e-9)
            if metrics.draft_tokens:
                # A draft cycle yields its tokens together: first-to-last intervals can be ~0
                # (8,685 tok/s was reported), so drafting turns divide by the whole generation.
                metrics.decode_tps = n / max(metrics.generation_s, 1e-9)
            elif n > 1:
                metrics.decode_tps = (n - 1) / max(end - first_at, 1e-9)
        layers = self.cache.layers
        if layers is not None:
            metrics.kv_bytes = kv_bytes_measured(layers)
            metrics.kv_bytes_allocated = kv_bytes_allocated(layers)
            shape = kv_shape(self.lm.config)
            if shape:
                metrics.kv_bytes_formula = kv_bytes_formula(layers, **shape, itemsize=_cache_itemsize(layers))
        metrics.peak_memory_bytes = mx.get_peak_memory()


def _cache_itemsize(cache) -> int:
    """Bytes per element of the unpacked layers (packed layers' formula does not use it)."""
    for layer in cache:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, mx.array):
            return keys.dtype.size
    return 4


def _drain_warnings(decoder) -> Iterator[EngineWarned]:
    """The speculative decoder's degradations, reported as events between tokens."""
    while decoder is not None and decoder.warnings:
        yield decoder.warnings.pop(0)


def _plain_steps(tokens, cache: PromptCache, max_tokens, settings) -> Iterator[tuple[int, bool]]:
    """mlx-lm's generate_step over the cache's layers (which hold all prompt tokens but
    the last). It runs each token it yields before yielding it (it computes the next one
    ahead), so the cache holds every yielded token, and `cache.tokens` says so."""
    from mlx_lm.generate import generate_step

    sampler, processors = make_sampling(settings)
    steps = generate_step(mx.array(tokens[-1:]), cache.model_view(), max_tokens=max_tokens, sampler=sampler,
                          logits_processors=processors, prompt_cache=cache.layers,
                          prefill_step_size=settings.prefill_step_size)
    cache.tokens = list(tokens)
    try:
        for token, _ in steps:
            cache.tokens.append(token)
            yield token, False
    finally:
        steps.close()
