"""One conversation: messages, settings, and the prompt cache of its last turn.

A turn renders the chat template, reuses the longest cached token prefix, prefills
only the new tokens (engine/turn/prefill_phase.py: in chunks, reporting progress and honouring
cancellation; with SpecPrefill or UniPrefill only what they keep), then decodes
(engine/turn/decode_phase.py: plain, or the speculative decoder). The cache may be packed to int8/int4
(engine/kv/packed_cache.py). Editing or regenerating an earlier message trims the cache back to
the common prefix. Errors come out as `EngineErrored` events, degradations as
`EngineWarned`.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Iterator

import mlx.core as mx

from brisk.engine.accel.router import asked_kinds, is_auto
from brisk.engine.accel.speculative.controller import PairCosts
from brisk.engine.accel.speculative.lookup import ContextIndex
from brisk.engine.accel.speculative.pair import DraftPair, LookupOnly
from brisk.engine.api.conversation import CancelToken, Message  # noqa: F401  (re-exported: the Session API)
from brisk.engine.api.errors import BriskError, ContextOverflow, InvalidSettings, TurnCancelled
from brisk.engine.api.events import ContextTruncated, EngineErrored, PrefillProgressed, TurnFinished
from brisk.engine.api.metrics import TurnMetrics, kv_measurements, turn_rates
from brisk.engine.api.settings import ChatSettings
from brisk.engine.kv import PromptCache
from brisk.engine.kv.fidelity import checked_kv_settings
from brisk.engine.kv.packed_cache import check_kv_packable
from brisk.engine.models.loader import LoadedModel
from brisk.engine.runtime.crash_log import user_message
from brisk.engine.turn.decode_phase import TurnDecode
from brisk.engine.turn.prefill_phase import TurnPrefill
from brisk.engine.turn.prompt import render_prompt

log = logging.getLogger(__name__)


class Session:
    def __init__(
        self,
        lm: LoadedModel,
        settings: ChatSettings | None = None,
        messages: list[Message] | None = None,
        *,
        draft: LoadedModel | None = None,
        pair_costs: PairCosts | None = None,
        clock=time.perf_counter,
    ):
        self.lm = lm
        self._clock = clock  # every phase of a turn is timed on it (tests inject one)
        self.settings = (settings or ChatSettings(model=lm.id)).validate()
        self.messages: list[Message] = list(messages or [])
        self.cache = PromptCache(lm.model)  # the target's layers, tokens, KV mode and position map
        # draft/verify times measured per model pair, shared by the owner's sessions
        self.pair_costs = pair_costs or PairCosts()
        # every token of the conversation, for lookup decoding (trimmed with the prompt cache)
        self.context_index = ContextIndex()
        self.lookup_only = LookupOnly(lm)
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
        del self.messages[index + 1 :]
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
        k_bits, v_bits = self.settings.kv_precision()
        metrics = TurnMetrics(kv_bits=self.settings.kv_bits, k_bits=k_bits, v_bits=v_bits)
        metrics.model_id, metrics.context_length = self.lm.id, self.lm.context_length
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
        self.pair_costs.save()  # what this turn measured, for the next conversation (a file for the app's)
        answer.finish_reason = metrics.finish_reason
        answer.metrics = metrics.to_dict()
        if answer.content or answer.finish_reason in ("stop", "length", "context", "cancelled"):
            self.messages.append(answer)
        if metrics.finish_reason != "error":
            yield TurnFinished(answer.content, list(answer.token_ids), metrics)

    def _run_turn(self, cancel: CancelToken, answer: Message, metrics: TurnMetrics) -> Iterator[object]:
        settings = self.settings.validate()
        # the KV self-test (once per model) runs before TTFT's clock: it is not the prompt's
        # time, but it is waited for, so it is reported as its own part
        checking = self._clock()
        settings, metrics.kv_check = yield from checked_kv_settings(self.lm, settings, lambda: cancel.cancelled)
        start = self._clock()
        metrics.kv_check_s = start - checking
        mx.reset_peak_memory()
        rendered = render_prompt(self.lm, self.messages, settings, cancelled=lambda: cancel.cancelled)
        if rendered.dropped_messages:
            yield ContextTruncated(rendered.dropped_messages, len(rendered.tokens))
        tokens = rendered.tokens
        budget = self.lm.context_length - len(tokens)
        if budget < 1:
            raise ContextOverflow(len(tokens) + 1, self.lm.context_length, self.lm.id)
        max_tokens = min(settings.max_tokens, budget)

        k_bits, v_bits = settings.kv_precision()
        metrics.k_bits, metrics.v_bits = k_bits, v_bits
        check_kv_packable(self.lm.config, v_bits=v_bits, group_size=settings.kv_group_size)
        self.cache.ensure_mode(settings.kv_mode())
        pack = lambda: self.cache.pack(  # noqa: E731
            k_bits=k_bits, v_bits=v_bits, group_size=settings.kv_group_size, start=settings.kv_quant_start
        )
        if settings.sparse_prefill == "off" and settings.uniprefill == "off":
            self.cache.drop_sparse()  # off means every token read densely, earlier turns' too ("Read it all")
        elif is_auto(settings):
            # an earlier turn's sparse read kept that question's passages, not this one's, and
            # the doc-qa evidence is for a prompt read afresh: auto routes the whole prompt again
            self.cache.drop_sparse()
        cached = self.cache.reuse(tokens)
        metrics.prompt_tokens, metrics.cached_tokens = len(tokens), cached
        metrics.prefilled_tokens = len(tokens) - cached
        prefill_started = self._clock()
        metrics.prepare_s = prefill_started - start
        yield PrefillProgressed(0, metrics.prefilled_tokens)

        prefill = TurnPrefill(self.lm, self.cache, self.pair, clock=self._clock)
        asked: tuple[str | None, ...] = ()
        if is_auto(settings):
            count = lambda text: len(self.lm.tokenizer.encode(text))  # noqa: E731
            asked = asked_kinds(self.messages, new_tokens=len(tokens) - cached, count=count)
        route, routed = yield from prefill.route(tokens, cached, settings, asked=asked)
        metrics.update(routed)
        metrics.update((yield from prefill.read(route, tokens, cached, settings, cancel, pack)))
        prompt_read_at = self._clock()
        metrics.prefill_s = prompt_read_at - prefill_started

        if settings.seed is not None:
            mx.random.seed(settings.seed)
        decode = TurnDecode(self.lm, self.cache, *self._speculation(settings), costs=self.pair_costs, clock=self._clock)
        try:
            yield from decode.run(
                tokens,
                max_tokens,
                settings,
                answer,
                cancel,
                pack,
                started=start,
                prefilled=metrics.prefilled_tokens,
            )
        finally:
            metrics.update(decode.results())
            self._finish_metrics(metrics, start, decode.first_at, len(answer.token_ids), prompt_read_at)

    def _speculation(self, settings: ChatSettings) -> tuple[object | None, ContextIndex | None]:
        """What this turn speculates with (the draft pair, or lookup alone; None: plain
        decoding), and the conversation's index when lookup is on."""
        index = self.context_index if settings.lookup else None
        if settings.spec_decode == "off" or (self.draft is None and index is None):
            return None, index
        return (self.pair if self.draft is not None else self.lookup_only), index

    # --- helpers ------------------------------------------------------------------

    def _finish_metrics(
        self, metrics: TurnMetrics, start: float, first_at: float | None, n: int, prompt_read_at: float
    ) -> None:
        end = self._clock()
        if first_at is not None:
            metrics.first_step_s = first_at - prompt_read_at
        metrics.update(
            turn_rates(metrics, generated=n, start=start, prompt_read_at=prompt_read_at, first_at=first_at, end=end)
        )
        if self.cache.layers is not None:
            metrics.update(kv_measurements(self.cache.layers, self.lm.config))
        metrics.peak_memory_bytes = mx.get_peak_memory()
