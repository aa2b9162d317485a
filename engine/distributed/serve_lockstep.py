"""`brisk serve` on ranks: rank 0 serves HTTP and leads, the other ranks follow each command.

Rank 0 runs the ordinary server (engine/host/serve/): its queue decides which conversation a
request continues and which prompt caches to forget. Every worker command that changes a
session (an answer, a forgotten conversation) is first handed to the other ranks through
MLX's own collectives (a length, then the bytes, each an all_sum to which only rank 0
adds), then every rank runs it on its own worker: the same tokens go into the same sharded
forward, as in `brisk run --ranks` (engine/distributed/lockstep.py).

Three things could part the ranks, and are agreed here:

- sampling without a seed: rank 0 draws one per request and sends it with the command;
- a request's Stop (the client left, a stop string matched): the engine checks its cancel
  token between prefill chunks and tokens, and each check is one tiny all_sum of rank 0's
  flag, so every rank stops at the same token;
- the measured costs the speculative decoder chooses by: rank 0's clock (lockstep.py).

Commands travel as JSON, never pickle: the ring's sockets carry nothing that runs code.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from typing import Callable

import mlx.core as mx
import numpy as np

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.events import EngineErrored, TurnFinished
from brisk.engine.api.settings import ChatSettings
from brisk.engine.distributed.group import Rank
from brisk.engine.distributed.lockstep import gather_rank_metrics
from brisk.engine.host.worker import Answer, ConversationEvent, EngineWorker, ForgetConversation
from brisk.engine.runtime.mx_values import int_list

KV_AUTO_REFUSED = "brisk.kv_bits 'auto' is not available on ranks yet: give 16, 8 or 4"
STOP = {"stop": True}  # rank 0's server is closing: the followers return


def _sum(rank: Rank, values: mx.array) -> mx.array:
    return mx.distributed.all_sum(values, group=rank.group, stream=mx.cpu)


def share_bytes(rank: Rank, payload: bytes = b"") -> bytes:
    """Rank 0's `payload` on every rank (the others pass nothing). A follower waits here
    between requests: the launcher's heartbeat watch bounds a wait on a rank that is gone."""
    size = int_list(_sum(rank, mx.array([len(payload) if rank.rank == 0 else 0], dtype=mx.int64)))[0]
    if size == 0:
        return b""
    mine = np.frombuffer(payload, dtype=np.uint8) if rank.rank == 0 else np.zeros(size, dtype=np.uint8)
    return bytes(np.asarray(_sum(rank, mx.array(mine))))


def encode(command) -> bytes:
    if isinstance(command, Answer):
        data: dict = {
            "answer": {
                "conversation_id": command.conversation_id,
                "settings": command.settings.to_dict(),
                "messages": [m.to_dict() if isinstance(m, Message) else dict(m) for m in command.messages],
            }
        }
    elif isinstance(command, ForgetConversation):
        data = {"forget": command.conversation_id}
    else:
        data = command  # STOP
    return json.dumps(data).encode()


def decode(payload: bytes):
    data = json.loads(payload)
    if "answer" in data:
        a = data["answer"]
        return Answer(
            a["conversation_id"], ChatSettings.from_dict(a["settings"]), [Message(**m) for m in a["messages"]]
        )
    if "forget" in data:
        return ForgetConversation(int(data["forget"]))
    return None  # STOP


def with_shared_seed(command: Answer) -> Answer:
    """The request's seed, or one drawn here: every rank must sample the same tokens."""
    if command.settings.seed is not None:
        return command
    seed = random.SystemRandom().randrange(2**31)
    return dataclasses.replace(command, settings=dataclasses.replace(command.settings, seed=seed))


class AgreedCancel(CancelToken):
    """Cancelled on every rank at the same check once rank 0's token is: `check()` (between
    prefill chunks and tokens) sums rank 0's flag across ranks; `cancelled` reads the value
    last agreed, so it costs nothing and says the same on every rank."""

    def __init__(self, rank: Rank, local: CancelToken | None):
        super().__init__()
        self.rank, self.local = rank, local
        self._agree()

    def _agree(self) -> None:
        mine = 1 if self.local is not None and self.local.cancelled else 0
        if int_list(_sum(self.rank, mx.array([mine], dtype=mx.int32)))[0] > 0:
            self._event.set()

    def check(self) -> None:
        if not self._event.is_set():
            self._agree()
        super().check()


def hosts_missing_models(rank: Rank, command: Answer) -> list[str]:
    """The hosts that lack the answer's model or draft (one all_gather, on every rank). A rank
    that failed alone would wait for the next command while the others wait in the forward's
    collectives: no one would ever finish."""
    from brisk.engine.models.bundled import BUNDLED
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    wanted = [m for m in (command.settings.model, command.settings.draft) if m]
    has_all = all(store.has(m) or (m in BUNDLED and BUNDLED[m].default) for m in wanted)
    mine = mx.array([[0 if has_all else 1]], dtype=mx.int32)
    flags = int_list(mx.distributed.all_gather(mine, group=rank.group, stream=mx.cpu).reshape(-1))
    return [rank.hosts[i] if i < len(rank.hosts) else f"rank {i}" for i, missing in enumerate(flags) if missing]


def run_command(rank: Rank, worker: EngineWorker, command, cancel: CancelToken, deliver: Callable) -> None:
    """One command on this rank's worker. A finished answer gets every rank's share of the
    weights and of the KV cache (one all_gather, at the same event on every rank)."""
    if isinstance(command, Answer) and (missing := hosts_missing_models(rank, command)):
        names = " or ".join(m for m in (command.settings.model, command.settings.draft) if m)
        message = f"{names} is not installed on {', '.join(dict.fromkeys(missing))}: install it there under the same id"
        deliver(EngineErrored(message, "model_not_found"))
        return
    for event in worker.handle(command, cancel):
        inner = event.event if isinstance(event, ConversationEvent) else event
        if isinstance(inner, TurnFinished):
            inner.metrics.extra["parallel"] = "tensor"
            inner.metrics.extra["ranks"] = gather_rank_metrics(rank, inner.metrics.kv_bytes)
        deliver(event)


def leader_execute(rank: Rank, worker: EngineWorker):
    """Rank 0's way of running the server queue's commands (EngineQueue's `execute`)."""

    def execute(command, cancel: CancelToken, deliver: Callable) -> None:
        if isinstance(command, Answer):
            if command.settings.kv_auto:  # each machine keeps its own self-test result: ranks could differ
                deliver(EngineErrored(KV_AUTO_REFUSED, "invalid_settings"))
                return
            command = with_shared_seed(command)
        if isinstance(command, (Answer, ForgetConversation)):
            try:
                share_bytes(rank, encode(command))
                run_command(rank, worker, command, AgreedCancel(rank, cancel), deliver)
            except RuntimeError as exc:  # MLX's ring lost a peer (one that died idle, say): said, not
                # swallowed by the queue, whose client got a bare 499 or an empty stream
                deliver(EngineErrored(f"The ranks could not run this request: {exc}", "internal"))
        else:  # DescribeSessions: rank 0's own bookkeeping, nothing changes
            run_command(rank, worker, command, cancel, deliver)

    return execute


# Between requests the followers wait in share_bytes, and MLX's ring waits by polling: an
# idle follower kept a core busy. Rank 0 sends an empty payload every IDLE_TICK_S while no
# request comes, and a follower sleeps for most of that after each one, so it only polls
# for the rest; a request waits at most one tick for the followers to come back.
IDLE_TICK_S = 0.1
FOLLOWER_SLEEP_S = 0.9 * IDLE_TICK_S


def leader_idle(rank: Rank) -> Callable[[], None]:
    """Rank 0's idle tick (EngineQueue's `idle`, every IDLE_TICK_S without a request). A ring
    that lost a peer stops the ticks; the next request meets the same error and says so."""
    broken = False

    def tick() -> None:
        nonlocal broken
        if broken:
            return
        try:
            share_bytes(rank, b"")
        except RuntimeError:
            broken = True

    return tick


def stop_followers(rank: Rank) -> None:
    """Rank 0's server closed: the followers return (a group already broken is left as is)."""
    try:
        share_bytes(rank, encode(STOP))
    except RuntimeError:  # the ring lost a peer: the launcher ends the group anyway
        pass


def rank_worker() -> EngineWorker:
    from brisk.engine.accel.speculative.controller import PairCosts

    return EngineWorker(pair_costs=PairCosts())  # ranks start from no stored costs (lockstep.py)


def follow(rank: Rank, worker: EngineWorker) -> int:
    """A follower rank's life: run each command rank 0 sends, until it says stop."""
    while True:
        payload = share_bytes(rank)
        if not payload:  # rank 0's idle tick
            time.sleep(FOLLOWER_SLEEP_S)
            continue
        command = decode(payload)
        if command is None:
            return 0
        run_command(rank, worker, command, AgreedCancel(rank, None), lambda event: None)
