"""The server's engine queue and stop sequences, without HTTP: fairness across clients,
prompt-cache slots for growing conversations, the byte bound, and held-back stop text."""

import threading

import pytest

from brisk.engine.api.conversation import Message
from brisk.engine.api.events import TokenEmitted, TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.serve.scheduler import DONE, EngineQueue, Job
from brisk.engine.host.serve.stops import StopScanner
from brisk.engine.host.worker import ConversationEvent, DescribeSessions, ForgetConversation, SessionsDescribed

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent


class FakeWorker:
    """Answers "ok" at once, except that the first answer waits for `release`."""

    def __init__(self, kv_bytes=100):
        self.release, self.entered = threading.Event(), threading.Event()
        self.order, self.forgotten, self.kv_bytes = [], [], kv_bytes
        self.sessions = {}  # conversation id -> bytes, as a real worker keeps them

    def handle(self, command, cancel):
        if isinstance(command, ForgetConversation):
            self.forgotten.append(command.conversation_id)
            self.sessions.pop(command.conversation_id, None)
            return
        if isinstance(command, DescribeSessions):
            yield SessionsDescribed(dict(self.sessions))
            return
        self.sessions[command.conversation_id] = self.kv_bytes
        if not self.order:
            self.entered.set()
            self.release.wait(10)
        self.order.append(command.messages[-1].content)
        yield ConversationEvent(command.conversation_id, TokenEmitted(1, "ok"))
        yield ConversationEvent(
            command.conversation_id, TurnFinished("ok", [1], TurnMetrics(finish_reason="stop", kv_bytes=self.kv_bytes))
        )


def job(client, *texts, done=None):
    messages = [Message("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)]
    return Job(client, messages, ChatSettings(model="m"), lambda e: done and e is DONE and done.release())


def test_clients_take_turns_so_one_burst_cannot_starve_another():
    worker = FakeWorker()
    queue = EngineQueue(worker)
    finished = threading.Semaphore(0)
    queue.submit(job("a", "a1", done=finished))
    assert worker.entered.wait(10)  # a1 runs; the rest queue behind it
    for text in ("a2", "a3", "a4"):
        queue.submit(job("a", text, done=finished))
    queue.submit(job("b", "b1", done=finished))
    queue.submit(job("c", "c1", done=finished))
    assert queue.depth() >= 4
    worker.release.set()
    for _ in range(6):
        assert finished.acquire(timeout=10)
    queue.close()
    assert worker.order == ["a1", "b1", "c1", "a2", "a3", "a4"]


def test_a_conversation_that_grows_returns_to_its_slot_and_others_get_new_ones():
    worker = FakeWorker()
    worker.release.set()
    queue = EngineQueue(worker)
    jobs = [job("x", "hello"), job("x", "hello", "ok", "more"), job("x", "unrelated")]
    for j in jobs:
        done = threading.Event()
        j.deliver = lambda e, done=done: e is DONE and done.set()
        queue.submit(j)
        assert done.wait(10)
    queue.close()
    assert jobs[1].slot == jobs[0].slot and jobs[1].reused_slot
    assert jobs[2].slot != jobs[0].slot and not jobs[2].reused_slot


def test_slots_beyond_the_byte_bound_are_forgotten_oldest_first():
    worker = FakeWorker(kv_bytes=100)
    worker.release.set()
    queue = EngineQueue(worker, cache_bytes=250)
    for text in ("one", "two", "three", "four"):
        done = threading.Event()
        queue.submit(
            Job("x", [Message("user", text)], ChatSettings(model="m"), lambda e, done=done: e is DONE and done.set())
        )
        assert done.wait(10)
    assert len(worker.forgotten) == 2 and queue.stats()["cached_bytes"] == 200
    queue.close()
    assert worker.sessions == {}  # a closed queue leaves no session behind in a worker it shares


def test_stop_text_is_held_back_until_it_is_decided():
    scanner = StopScanner(["END"])
    assert scanner.feed("abc E") == "abc "  # "E" may begin END
    assert scanner.feed("N") == ""
    assert scanner.feed("Dxyz") == "" and scanner.stopped
    other = StopScanner(["END"])
    assert other.feed("abc E") == "abc " and other.feed("ast") == "East" and other.flush() == ""
    assert StopScanner(["\n\n"]).feed("one\n") == "one"


def test_kept_conversations_are_bounded_in_number_too():
    """Small caches fit the bytes by the thousand, and every request looked through them all."""
    worker = FakeWorker(kv_bytes=1)
    worker.release.set()
    queue = EngineQueue(worker, max_conversations=3)
    for text in ("one", "two", "three", "four", "five"):
        done = threading.Event()
        queue.submit(
            Job("x", [Message("user", text)], ChatSettings(model="m"), lambda e, done=done: e is DONE and done.set())
        )
        assert done.wait(10)
    assert queue.stats()["cached_conversations"] == 3 and len(worker.sessions) == 3
    queue.close()


def test_the_idle_duty_runs_while_no_request_comes_never_during_one_and_survives_a_failure():
    """Rank 0's idle tick (serve_lockstep.leader_idle) runs on the engine thread between
    requests: never beside a request's commands (both use the ranks' collectives), and a
    tick that raises does not end the thread."""
    log, running = [], threading.Event()
    ticked_after_request = threading.Event()

    def idle():
        assert not running.is_set()  # never inside a request
        log.append("tick")
        if "request" in log:
            ticked_after_request.set()
        if log.count("tick") == 1:
            raise RuntimeError("a broken tick")

    def execute(command, cancel, deliver):
        running.set()
        log.append("request" if not isinstance(command, DescribeSessions) else "describe")
        running.clear()

    queue = EngineQueue(execute=execute, idle=idle, idle_every_s=0.001)
    try:
        for _ in range(1000):  # a hang guard, not a time bound: ticks come at least once
            if log.count("tick") >= 3:
                break
            threading.Event().wait(0.01)
        done = threading.Event()
        queue.submit(Job("c", [Message("user", "hi")], ChatSettings(model="m"), lambda e: e is DONE and done.set()))
        assert done.wait(60) and ticked_after_request.wait(60)
    finally:
        queue.close()
    assert log.count("tick") >= 4 and "request" in log  # the failed first tick ended nothing


def test_without_an_idle_duty_the_engine_thread_just_waits():
    calls = []
    queue = EngineQueue(execute=lambda command, cancel, deliver: calls.append(command))
    assert queue.idle is None
    done = threading.Event()
    queue.submit(Job("c", [Message("user", "hi")], ChatSettings(model="m"), lambda e: e is DONE and done.set()))
    assert done.wait(60)
    queue.close()
    assert calls  # served
