"""This process as one rank of a distributed run: its group, its host, and the lines it
tells the launching `brisk` (markers on stderr: joined, alive, exit).

The group is MLX's (`mx.distributed.init(backend="ring")`, its peers from the hostfile
that `mlx.launch` hands over); nothing here opens a socket of its own. A process that is not
a rank has no group, and every hook elsewhere (the loader, the session) does nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

import mlx.core as mx

from brisk.engine.distributed.shard import ShardReport

# Lines that start with this go to the launching brisk, not to the user.
MARKER = "@brisk-rank"
HEARTBEAT_S = 1.0
HOSTS_ENV = "BRISK_RANK_HOSTS"  # comma-separated host names, by rank (set by the launcher)


@dataclass
class Rank:
    group: mx.distributed.Group
    hosts: list[str]
    # where each rank's shard report lands (engine/distributed/shard.py), for metrics
    report: ShardReport | None = None

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    @property
    def host(self) -> str:
        return self.hosts[self.rank] if self.rank < len(self.hosts) else "?"


_current: Rank | None = None


def current() -> Rank | None:
    """This process's rank, or None when it is not part of a distributed run."""
    return _current


def tell(*words: object) -> None:
    """One marker line to the launching brisk (written whole: several threads tell)."""
    rank = _current.rank if _current is not None else os.environ.get("MLX_RANK", "?")
    stream = sys.__stderr__
    if stream is not None:
        stream.write(" ".join([MARKER, str(rank), *map(str, words)]) + "\n")
        stream.flush()


def join() -> Rank:
    """Join the ring `mlx.launch` described (blocks until every rank has connected: the
    launcher's join timeout bounds it), then say so and start the heartbeat."""
    global _current
    tell("started")
    group = mx.distributed.init(strict=True, backend="ring")
    hosts = [h for h in os.environ.get(HOSTS_ENV, "").split(",") if h]
    _current = Rank(group, hosts)
    # One small collective: every rank is really connected before any weight is read.
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
    tell("joined")
    threading.Thread(target=_heartbeat, name="brisk-rank-heartbeat", daemon=True).start()
    return _current


def _heartbeat() -> None:
    """A line every second while this process runs: a rank that stops (killed, stopped,
    its host gone) goes silent, and the launcher names it instead of waiting forever on a
    collective that will never complete."""
    stop = threading.Event()
    while not stop.wait(HEARTBEAT_S):
        try:
            tell("alive")
        except (OSError, ValueError):  # stderr closed: the launcher is gone, and no one
            os._exit(1)  # would ever stop this rank (a server's rank 0 would go on serving)
