"""The engine reports where the wait for the first token went: model load, cache restore,
KV check, prompt preparation, prefill and the first decode step, each timed where it happens
(an injected clock: the test decides how long each part took), and the prefill's progress
carries the time its phase has left (issue 58 item 2)."""

from __future__ import annotations

import pytest

import brisk.engine.turn.decode_phase
from brisk.engine.api.errors import ModelNotFound
from brisk.engine.api.events import PrefillProgressed, TurnFinished
from brisk.engine.api.session import CancelToken, Message
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import Answer, EngineWorker
from brisk.engine.kv.saved import SavedCaches


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def settings(**kw):
    # plain decoding (no lookup): the first step is plain_steps' first item, slowed below
    return ChatSettings(**{"model": "tiny-llama", "temperature": 0.0, "max_tokens": 4, "lookup": False, **kw})


def slow_worker(lm, clock, saved=None, *, load_s=5.0):
    def load(model_id):
        if model_id != lm.id:
            raise ModelNotFound(model_id)
        clock.advance(load_s)  # loading takes load_s on the injected clock
        return lm

    return EngineWorker(load, memory_available=lambda: 2**30, saved_caches=saved, clock=clock)


def answer(worker, clock, cid, messages, *, prefill_s=3.0, per_chunk_s=0.0):
    """Run a turn; the first progress event (the prefill starting) costs prefill_s, each
    chunk per_chunk_s. Returns (metrics, progress events)."""
    progress, finished = [], None
    for item in worker.handle(Answer(cid, settings(prefill_step_size=8), messages), CancelToken()):
        event = item.event
        if isinstance(event, PrefillProgressed) and event.phase == "prompt" and event.done < event.total:
            clock.advance(prefill_s if not progress else per_chunk_s)
            progress.append(event)
        elif isinstance(event, TurnFinished):
            finished = event
    assert finished is not None
    return finished.metrics, progress


@pytest.fixture
def slow_first_step(monkeypatch):
    """The first decode step takes 0.25 s on the clock the test installs."""
    clocks = []
    real = brisk.engine.turn.decode_phase.plain_steps

    def steps(*args, **kwargs):
        for i, step in enumerate(real(*args, **kwargs)):
            if i == 0:
                clocks[0].advance(0.25)
            yield step

    monkeypatch.setattr(brisk.engine.turn.decode_phase, "plain_steps", steps)
    return clocks


def test_each_part_of_the_wait_is_reported_where_it_happened(tiny_llama, slow_first_step):
    clock = Clock()
    slow_first_step.append(clock)
    worker = slow_worker(tiny_llama, clock)
    m, _ = answer(worker, clock, 1, [Message("user", "Hello there")])
    assert m.engine_started_at == 100.0  # stamped before the load
    assert m.model_load_s == 5.0
    assert (m.cache_restore_s, m.restored_tokens) == (0.0, 0)
    assert m.prefill_s == 3.0
    assert m.first_step_s == 0.25
    assert m.ttft_s == pytest.approx(m.prepare_s + m.prefill_s + m.first_step_s)
    assert (m.model_id, m.context_length) == ("tiny-llama", tiny_llama.context_length)
    # the same chat again: nothing to load, the prompt cache is warm
    m2, _ = answer(worker, clock, 1, [Message("user", "Hello there"), Message("assistant", "x"), Message("user", "Hi")])
    assert m2.model_load_s == 0.0 and m2.cached_tokens > 0


def test_a_restored_prompt_cache_is_its_own_part(tiny_llama, slow_first_step, tmp_path, monkeypatch):
    clock = Clock()
    slow_first_step.append(clock)
    saved = SavedCaches(tmp_path / "caches")
    first = slow_worker(tiny_llama, clock, saved)
    history = [Message("user", "A question that fills the cache a little")]
    answer(first, clock, 4, history)
    first.close()  # the app quits: chat 4's cache is written
    real_restore = SavedCaches.restore

    def slow_restore(self, cid, session):
        clock.advance(2.0)
        return real_restore(self, cid, session)

    monkeypatch.setattr(SavedCaches, "restore", slow_restore)
    relaunched = slow_worker(tiny_llama, clock, saved, load_s=7.0)
    m, _ = answer(relaunched, clock, 4, [*history, Message("assistant", "ok"), Message("user", "More")])
    assert m.model_load_s == 7.0
    assert m.cache_restore_s == 2.0
    assert m.restored_tokens > 0 and m.cached_tokens > 0


def test_prefill_progress_carries_the_time_its_phase_has_left(tiny_llama, slow_first_step):
    clock = Clock()
    slow_first_step.append(clock)
    worker = slow_worker(tiny_llama, clock)
    long_prompt = [Message("user", " ".join(["word"] * 60))]
    _, progress = answer(worker, clock, 2, long_prompt, prefill_s=0.0, per_chunk_s=1.0)
    # the clock moves while the test holds an event: chunk k's second is measured at chunk k + 1
    estimates = [e.seconds_left for e in progress if e.done > 0][1:]
    assert len(estimates) >= 20  # 8-token chunks of a 257-token prompt
    assert all(s is not None and s >= 0 for s in estimates)
    # one second per chunk: once the data outweighs the prior (which expected attention to
    # grow with depth), the estimate falls chunk by chunk to under two chunks' time
    second_half = estimates[len(estimates) // 2 :]
    assert second_half == sorted(second_half, reverse=True)
    assert estimates[-1] < 2.0 < estimates[len(estimates) // 2]
