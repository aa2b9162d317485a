"""The server's one engine thread: requests queue here and run one at a time.

Requests are taken fairly across clients (the one served longest ago first), so one
client's burst cannot starve the others; the queue depth is reported. Each request is a
worker `Answer` on a conversation slot: a request whose messages continue an earlier
one's (an editor or agent re-sending a growing chat) lands on that slot, and the
session's prompt cache reads only what is new.

A slot is a live worker session, nothing else: before and after each request the worker
says which sessions it holds and the bytes their caches reserve (`DescribeSessions`), slots
whose session is gone are dropped, sessions no slot knows are forgotten, and the least
recently used are forgotten until the bytes fit `cache_bytes`. So `reused_conversation`,
`cached_tokens` and /health's counts describe caches that exist.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import (
    Answer,
    ConversationEvent,
    DescribeSessions,
    EngineWorker,
    ForgetConversation,
    SessionsDescribed,
    is_server_conversation,
)
from brisk.engine.runtime.mlx_threads import MlxThread

log = logging.getLogger(__name__)
DEFAULT_CACHE_BYTES = 2 << 30  # a few long conversations of a small model, or one of a large one
# Each request looks through every kept conversation (and asks the worker for its sessions):
# 3,600 short ones cost ~100 ms a request, and 2 GiB holds ~32,000 of a small model's.
MAX_CONVERSATIONS = 256
MAX_CLIENTS = 256  # idle clients remembered beyond this are forgotten
DONE = object()  # after a job's last event


@dataclass
class Job:
    client: str
    messages: list[Message]
    settings: ChatSettings
    deliver: Callable[[object], object]  # called on the engine thread with each event, then DONE
    cancel: CancelToken = field(default_factory=CancelToken)
    slot: int = 0
    reused_slot: bool = False
    seq: int = 0  # submission order


@dataclass
class Slot:
    model: str
    history: list[tuple[str, str]]  # (role, content) of the messages its cache holds, answer included
    kv_bytes: int = 0  # what the session's caches reserve, as the worker last said


def _shared_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# Runs one worker command to its end, handing each event to the callback. By default on the
# queue's own thread; the app runs it on its engine thread (app/api_server.py).
Execute = Callable[[object, CancelToken, Callable[[object], None]], None]


class EngineQueue:
    def __init__(
        self,
        worker: EngineWorker | None = None,
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_conversations: int = MAX_CONVERSATIONS,
        execute: Execute | None = None,
        idle: Callable[[], None] | None = None,
        idle_every_s: float = 0.1,
    ):
        """`idle`: run on the engine thread whenever no request has come for `idle_every_s`
        (on ranks, rank 0's tick that lets the other ranks sleep between requests)."""
        self.max_conversations = max_conversations
        self.idle, self.idle_every_s = idle, idle_every_s
        if execute is None:
            from brisk.engine.accel.speculative.costs_file import StoredPairCosts

            own = worker or EngineWorker(pair_costs=StoredPairCosts())

            def execute(command, cancel, deliver):
                for event in own.handle(command, cancel):
                    deliver(event)

        self.execute = execute
        self.cache_bytes = cache_bytes
        self._queues: dict[str, deque[Job]] = {}  # waiting requests per client
        self._slots: OrderedDict[int, Slot] = OrderedDict()
        self._ids = itertools.count(-1, -1)  # negative: never an app chat's id
        self._ticks = itertools.count()  # orders submissions and services
        self._served_at: dict[str, int] = {}
        self._lock = threading.Condition()
        self._running: Job | None = None
        self._closed = False
        self.served = 0
        self.finished: Counter[str] = Counter()  # requests by how they ended (stop, length, cancelled, ...)
        self._thread = MlxThread(self._loop, name="brisk-serve-engine")  # never ends: see engine/runtime/mlx_threads.py
        self._thread.start()

    # --- the HTTP side ------------------------------------------------------------------

    def submit(self, job: Job) -> Job:
        with self._lock:
            if len(self._queues) > MAX_CLIENTS:  # forget idle clients
                for idle in [c for c, q in self._queues.items() if not q]:
                    del self._queues[idle]
                    self._served_at.pop(idle, None)
            job.seq = next(self._ticks)
            self._queues.setdefault(job.client, deque()).append(job)
            self._lock.notify()
        return job

    def depth(self) -> int:
        """Requests waiting, not counting the one running."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def stats(self) -> dict:
        with self._lock:
            cached = sum(s.kv_bytes for s in self._slots.values())
            return {  # the cache figures: the worker's sessions as of the last request's end
                "queued": sum(len(q) for q in self._queues.values()),
                "running": self._running is not None,
                "served": self.served,
                "cached_conversations": len(self._slots),
                "cached_bytes": cached,
                "cache_limit_bytes": self.cache_bytes,
                "finished": dict(self.finished),
            }

    def close(self, timeout: float = 30) -> None:
        with self._lock:
            self._closed = True
            for queue in self._queues.values():
                for job in queue:
                    job.cancel.cancel()
            if self._running is not None:
                self._running.cancel.cancel()
            self._lock.notify()
        self._thread.join(timeout)

    # --- the engine thread --------------------------------------------------------------

    def _next(self) -> Job | None:
        while True:
            with self._lock:
                if not self._closed and not any(self._queues.values()):
                    self._lock.wait(self.idle_every_s if self.idle else None)
                if self._closed and not any(self._queues.values()):
                    return None
                if any(self._queues.values()):
                    # Fair: the client served longest ago goes first (never served: first of
                    # all), then the earliest request; one client's burst waits behind the rest.
                    client = min(
                        (c for c, q in self._queues.items() if q),
                        key=lambda c: (self._served_at.get(c, -1), self._queues[c][0].seq),
                    )
                    job = self._queues[client].popleft()
                    self._served_at[client] = next(self._ticks)
                    self._running = job
                    return job
            if self.idle is not None:  # outside the lock: requests keep arriving meanwhile
                try:
                    self.idle()
                except Exception:  # the thread must outlive it, as it outlives a request's bug
                    log.exception("the engine's idle duty failed")

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._run(job)
            except Exception:  # the thread must outlive any bug; the worker reports its own
                log.exception("serving a request failed")
            finally:
                job.deliver(DONE)
                with self._lock:
                    self._running = None
                    self.served += 1
        self._forget(list(self._slots))  # closed: the worker (the app's outlives us) keeps none of ours
        with self._lock:
            self._slots.clear()

    def _run(self, job: Job) -> None:
        key = _history_key(job)
        self._sync()  # the worker may have dropped sessions since (the app's chats share it)
        job.slot, job.reused_slot = self._slot_for(job.settings.model, key)
        outcome: list[TurnFinished] = []

        def deliver(event) -> None:
            inner = event.event if isinstance(event, ConversationEvent) else event
            if isinstance(inner, TurnFinished):
                outcome.append(inner)
            job.deliver(inner)

        try:
            self.execute(Answer(job.slot, job.settings, job.messages), job.cancel, deliver)
        finally:
            finished = outcome[-1] if outcome else None
            with self._lock:
                self.finished[finished.metrics.finish_reason if finished else "error"] += 1
            self._remember(job, key, finished)
            self._sync()
            self._evict()

    def _slot_for(self, model: str, key: list) -> tuple[int, bool]:  # key: _history_key
        """The live slot whose history this request continues the furthest, else a new one."""
        best, shared = None, 1  # the prelude alone is no shared history: a message must match too
        for slot_id, slot in self._slots.items():
            n = _shared_prefix(slot.history, key)
            if slot.model == model and n > shared:
                best, shared = slot_id, n
        if best is not None:
            return best, True
        return next(self._ids), False

    def _remember(self, job: Job, key: list, finished: TurnFinished | None) -> None:
        if finished is None or finished.metrics.finish_reason in ("cancelled", "error"):
            return  # a reused session still holds the earlier turns (keep the old history); a new one is forgotten
        with self._lock:
            self._slots[job.slot] = Slot(job.settings.model, key + [("assistant", finished.text)])
            self._slots.move_to_end(job.slot)

    def _sync(self) -> None:
        """Slots become exactly the worker's live server sessions, with their real bytes."""
        described: list[SessionsDescribed] = []

        def keep(event: object) -> None:
            if isinstance(event, SessionsDescribed):
                described.append(event)

        self.execute(DescribeSessions(), CancelToken(), keep)
        if not described:  # the worker could not say (cancelled, broken): keep no slot that may be a fiction
            log.warning("the engine did not describe its sessions; the server's are forgotten")
            live = {}
            self._forget(list(self._slots))
        else:
            live = {cid: n for cid, n in described[-1].sessions.items() if is_server_conversation(cid)}
        with self._lock:
            for slot_id in [s for s in self._slots if s not in live]:
                del self._slots[slot_id]
            for slot_id, slot in self._slots.items():
                slot.kv_bytes = live[slot_id]
        self._forget([cid for cid in live if cid not in self._slots])  # half-made or another queue's

    def _evict(self) -> None:
        """Forget least recently used slots until their bytes fit the budget (the last one too)
        and they number at most `max_conversations`."""
        with self._lock:
            dropped = []
            total = sum(s.kv_bytes for s in self._slots.values())
            while self._slots and (total > self.cache_bytes or len(self._slots) > self.max_conversations):
                slot_id, slot = self._slots.popitem(last=False)
                dropped.append(slot_id)
                total -= slot.kv_bytes
        self._forget(dropped)

    def _forget(self, slots: list[int]) -> None:
        for slot in slots:
            self.execute(ForgetConversation(slot), CancelToken(), lambda event: None)


def _history_key(job: Job) -> list:
    """What a conversation's prompt cache holds, item by item: first what comes before every
    message (the system prompt, and whether the chat template wraps them: /v1/completions
    sends the prompt as is), then the messages. Requests that differ in the first share
    nothing, so one never takes, or overwrites, the other's cache."""
    settings = job.settings
    return [("prelude", settings.system_prompt, settings.chat_template)] + [(m.role, m.content) for m in job.messages]
