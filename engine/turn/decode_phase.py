"""A turn's answer: the decoder the settings call for (plain, engine/decode/plain.py, or the
speculative decoder with a draft and/or lookup), its tokens streamed as text into the answer
message, cancellation checked between tokens. What it did comes back as TurnMetrics fields
(`results()`), readable however the decode ended: stopped, cancelled or failed."""

from __future__ import annotations

import time
from typing import Callable, Generator, Iterator

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.events import EngineWarned, PrefillProgressed, TokenEmitted
from brisk.engine.api.settings import ChatSettings
from brisk.engine.decode.plain import plain_steps
from brisk.engine.turn.detokenize import StreamingText


class TurnDecode:
    def __init__(self, lm, cache, speculation, index, *, costs, clock=time.perf_counter):
        # target, its PromptCache, the DraftPair or LookupOnly to speculate with (None: plain
        # decoding), the conversation's ContextIndex when lookup is on, the pair's costs
        self.lm, self.cache, self.speculation, self.index = lm, cache, speculation, index
        self.costs = costs
        self._clock = clock
        self.first_at: float | None = None  # when the first token came out
        self._said: dict = {"finish_reason": "length"}
        self._decoder = None
        self._answer: Message | None = None

    def run(
        self,
        tokens: list[int],
        max_tokens: int,
        settings: ChatSettings,
        answer: Message,
        cancel: CancelToken,
        pack: Callable[[], None],
        *,
        started: float,
        prefilled: int,
    ) -> Iterator[object]:
        """Decode after the prompt `tokens` (the cache holds all but the last) into `answer`:
        TokenEmitted per token, the decoder's warnings between them. Both decoders keep
        `cache.tokens` true as they go."""
        self._answer = answer
        steps = self._steps(tokens, max_tokens, settings)
        text = StreamingText(self.lm.tokenizer, seed=tokens)
        eos = set(self.lm.tokenizer.eos_token_ids)
        self._said["finish_reason"] = "context" if max_tokens < settings.max_tokens else "length"
        try:
            for token, source in steps:
                yield from self._warnings()
                pack()
                if self.first_at is None:
                    self.first_at = self._clock()
                    self._said["ttft_s"] = self.first_at - started
                    yield PrefillProgressed(prefilled, prefilled)
                if token in eos:
                    self._said["finish_reason"] = "stop"
                    break
                answer.token_ids.append(token)
                delta = text.add(token)
                answer.content += delta
                yield TokenEmitted(delta, token, source)
                cancel.check()
        finally:
            steps.close()
            tail = text.flush()
            answer.content += tail
        yield from self._warnings()
        if tail:
            yield TokenEmitted(tail, -1)

    def results(self) -> dict:
        """What the decode did, as TurnMetrics fields: finish reason, TTFT, which step ran,
        and the speculative decoder's counts and per-token sources."""
        said = dict(self._said)
        if self._decoder is not None:
            said.update(self._decoder.metrics())
            generated = len(self._answer.token_ids) if self._answer is not None else 0
            said["sources"] = self._decoder.stats.sources[:generated]
        return said

    def _steps(self, tokens, max_tokens, settings) -> Generator[tuple[int, str], None, None]:
        """(token, source) pairs: plain decoding, or the speculative decoder's."""
        if self.speculation is None:
            return plain_steps(tokens, self.cache, max_tokens, settings, self._said)
        self._decoder = self.speculation.make_decoder(
            self.cache, settings, max_tokens=max_tokens, costs=self.costs, index=self.index
        )
        return self._decoder.steps(tokens)

    def _warnings(self) -> Iterator[EngineWarned]:
        """The speculative decoder's degradations, reported as events between tokens."""
        while self._decoder is not None and self._decoder.warnings:
            yield self._decoder.warnings.pop(0)
