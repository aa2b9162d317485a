"""The speculative decoder's plain cycle: target steps with no proposal to verify.

Without logits processors a run is pipelined like mlx-lm's generate_step (the next step is
queued before this token is read back), and replays one compiled step
(engine/decode/compiled.py), traced once a turn. The run ends early when a lookup offer
would pay, so the loop can verify it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

import mlx.core as mx

from brisk.engine.accel.speculative.cycle import Loop, Step, weak
from brisk.engine.accel.speculative.lookup import LookupOffer
from brisk.engine.decode.compiled import CompiledRun, traced_step

log = logging.getLogger(__name__)


class PlainRun:
    """Plain target steps; owns the compiled step and why it is not used, if it is not."""

    def __init__(self, loop: Loop, base_model: Any, why_not_compiled: Callable[..., str | None]):
        """`base_model`: the target itself (the loop's `model` is its view, positions shifted),
        which `why_not_compiled` inspects."""
        self.loop, self.base_model, self.why_not_compiled = weak(loop), base_model, why_not_compiled
        self._kv_bits = loop.dist.settings.kv_precision()
        self._step: Callable | None = None  # traced on first use
        self._run: CompiledRun | None = None  # open while a pipelined run goes
        self._compiled_off: str | None = None  # why plain runs call the model instead, once known
        self._compiled_checked = False  # asked once a turn: the answer cannot change within it

    def decode_step(self) -> str:
        """How plain runs stepped, for the metrics ("" when none ran)."""
        if self._compiled_off:
            return f"model calls: {self._compiled_off}"
        return "" if self._step is None and self._compiled_off is None else "compiled"

    def run(self, sequence: list[int], k: int, offer: LookupOffer | None = None) -> Iterator[Step]:
        """Up to `k` plain target steps (`offer` unused: the run looks the offer up after each step)."""
        if k == 1 or self.loop.dist.processors:
            return self._one_at_a_time(sequence, k)
        return self._pipelined(sequence, k)

    def _one_at_a_time(self, sequence: list[int], count: int) -> Iterator[Step]:
        loop = self.loop
        for _ in range(count):
            yield loop._plain(sequence), ""
            if loop.controller.lookup_pays(loop._lookup_offer()):
                return

    def _pipelined(self, sequence: list[int], count: int) -> Iterator[Step]:
        step_before = self._step
        started = self.loop.now()
        self._start_compiled_run()
        traced = self._run is not None and self._step is not step_before  # a turn's first run traces
        grown = self._run.grown if self._run is not None else 0
        try:
            last, steps = yield from self._pipeline(sequence, count, started)
            traced = traced or (self._run is not None and self._run.grown != grown)
        finally:
            self._end_compiled_run()
        # The controller gets the run's mean, from the first step's queueing to the last
        # read (the stream was idle before it: a verify reads its result back). Single
        # intervals are no measure (reading a token back may wait for the step queued after
        # it too), nor is the mean of the intervals after the first read: on grounded text a
        # lookup ends most runs after 2-4 steps, and that read SmolLM2's 7 ms step as 4-6 ms.
        # A run that traced the step (a turn's first, or buffers grown) is not timed.
        if not traced:
            self.loop.controller.observe_plain((last - started) / steps, steps)
            self.loop._note_pace(last - started, steps)

    def _pipeline(self, sequence: list[int], count: int, started: float):
        """The run's steps, each queued before the previous token is read back; returns
        (when the last token was read, tokens read)."""
        loop = self.loop
        current: mx.array | None = loop._queue_step(mx.array(sequence[-1:], dtype=mx.uint32))  # as argmax gives
        last, read = started, 0
        while current is not None:
            queued = self._queue_ahead(current, read, count)
            token = loop.read_token(current)
            now = loop.now()
            loop._after_plain(sequence, token, now - last, timed=False)
            last, read = now, read + 1
            yield token, ""
            if read >= count:
                break
            current, count = self._next_after(current, queued, read, count)
        return last, read

    def _queue_ahead(self, current: mx.array, read: int, count: int) -> mx.array | None:
        """The step after `current`, queued before `current` is read, unless the run ends
        with it or a lookup would likely follow it."""
        if read + 1 < count and not self._lookup_likely_after(self.loop._lookup_offer()):
            return self.loop._queue_step(current)
        return None

    def _next_after(
        self, current: mx.array, queued: mx.array | None, read: int, count: int
    ) -> tuple[mx.array | None, int]:
        """(the step to read next, None to end the run; the run's length) after `read` tokens."""
        if self.loop.controller.lookup_pays(self.loop._lookup_offer()):
            return queued, read + 1  # read the step already queued, queue no more
        if queued is None:
            queued = self.loop._queue_step(current)  # the lookup did not come: on, unpipelined
        return queued, count

    def _lookup_likely_after(self, offer: LookupOffer | None) -> bool:
        """Would a lookup pay after the token in flight, if that token is the one `offer`
        proposes first? Then a plain run queues no step behind it: a queued step costs a whole
        plain step for one token, where the lookup's verify pass would have checked it for a
        row's cost (SmolLM2: ~1.6 of ~9.4 ms). Replayed over SmolLM2's answers with the real
        autopilot, code edit 1.71x -> 1.80x, the other kinds within 1%."""
        if offer is None or len(offer.tokens) < 2:
            return False
        return self.loop.controller.lookup_pays(LookupOffer(offer.tokens[1:], offer.match + 1))

    def _start_compiled_run(self) -> None:
        # once a turn, not once a run: the check walks the model's modules (~1.6 ms for
        # SmolLM2), and a grounded answer's lookups split it into ~20 runs
        if not self._compiled_checked:
            self._compiled_checked = True
            self._compiled_off = self.why_not_compiled(self.base_model, self.loop.cache, kv_bits=self._kv_bits)
        if self._compiled_off:
            return
        self._step = self._step or traced_step(self.loop.model, normalize=False)
        self._run = CompiledRun(self._step, self.loop.cache)

    def _end_compiled_run(self) -> None:
        if self._run is not None:
            self._run.release()
            self._run = None

    def step_logits(self, token: mx.array) -> mx.array:
        """The target's next-token logits (1, V) after `token`, built lazily: by the run's
        compiled step when one is open (a step it cannot trace ends it, for the turn)."""
        if self._run is not None:
            try:
                return self._run(token)
            except Exception as failed:  # noqa: BLE001  (the buffers are untouched: decode on)
                log.warning("the compiled decode step failed, decoding with the model's: %s", failed)
                self._compiled_off = f"the compiled step failed ({type(failed).__name__}: {failed})"
                self._end_compiled_run()
        return self.loop.model(token[None], cache=self.loop.cache)[0]
