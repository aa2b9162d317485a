"""The ranks behind `brisk serve --ranks N` / `--hostfile`, kept up by the front process.

The front (serve_front.py) is the process the user started: it holds the public port, and
launches the ranks through `mlx.launch` (launch.py, with its join and heartbeat watch).
Rank 0 serves Brisk's API on a loopback port of this machine; the front forwards to it.

An MLX ring is fixed once joined: a lost rank cannot rejoin it, and a survivor's group is
broken for good. So when any rank fails, the whole group ends (mlx.launch and the watch
stop the others) and the front launches a fresh one: that is the regroup. Meanwhile the
front stays up, says `regrouping` on /health, and refuses turns with 503. The first group
must come up, though: a rank that never joins, or a host that is not there, ends
`brisk serve` with the error instead of retrying in the background.
"""

from __future__ import annotations

import http.client
import io
import logging
import math
import os
import threading
import time
from typing import Callable

from brisk.engine.api.errors import BriskError
from brisk.engine.distributed.launch import RankFailed, free_port_run, run_on_ranks

log = logging.getLogger(__name__)
REGROUP_DELAY_S = (1.0, 5.0, 30.0)  # waits before each relaunch after a failure (the last repeats)
READY_POLL_S = 0.2
DELAY_ENV = "BRISK_REGROUP_DELAY_S"  # the first wait instead (tests hold the regrouping state open)


def regroup_delays() -> tuple[float, ...]:
    try:
        first = float(os.environ.get(DELAY_ENV, ""))
    except ValueError:
        return REGROUP_DELAY_S
    return (first, *REGROUP_DELAY_S[1:]) if math.isfinite(first) and first >= 0 else REGROUP_DELAY_S


class _Discard(io.RawIOBase):
    """Rank 0's stdout ('Brisk serves ... at' its private port): not the user's to see."""

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return len(data)


class RankGroup:
    """Launches the ranks, says whether rank 0 answers, and launches them again after a
    failure. `state`: starting, ready, regrouping, failed (the first group never came
    up) or stopped."""

    def __init__(
        self,
        argv_for: Callable[[int], list[str]],
        *,
        ranks: int | None,
        hostfile: str | None,
        hosts: list[str],
        join_timeout: float,
        rank_timeout: float,
        launch: Callable[..., int] = run_on_ranks,
    ):
        self.argv_for, self.ranks, self.hostfile, self.hosts = argv_for, ranks, hostfile, hosts
        self.port = 0  # rank 0's loopback port, new at each launch (a rank of a lost group may linger)
        self.join_timeout, self.rank_timeout = join_timeout, rank_timeout
        self._launch = launch
        self.state = "starting"
        self.generation = 0  # launches so far; a request remembers the one it was sent to
        self.error: str | None = None  # the last failure, naming the rank and host
        self.failures = 0
        self._ended: dict[int, str] = {}  # generation -> why it ended
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="brisk-rank-group", daemon=True)

    # --- what the front asks -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_first(self) -> None:
        """Until the first group answers; BriskError naming the rank if it never does."""
        with self._changed:
            self._changed.wait_for(lambda: self.state != "starting")
            if self.state != "ready":
                raise BriskError(self.error or "the ranks did not start")

    def ready(self) -> bool:
        return self.state == "ready"

    def why_ended(self, generation: int, timeout: float) -> str | None:
        """Why launch `generation` ended, waiting up to `timeout` seconds for it to end (a
        request that lost rank 0 asks: the launcher names the rank that failed first)."""
        with self._changed:
            self._changed.wait_for(lambda: generation in self._ended or self._stop.is_set(), timeout)
            return self._ended.get(generation)

    def describe(self) -> dict:
        with self._changed:
            return {
                "state": self.state,
                "size": len(self.hosts),
                "hosts": list(self.hosts),
                "launches": self.generation,
                "failures": self.failures,
                "last_error": self.error,
            }

    def close(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(15)

    # --- the supervisor thread -----------------------------------------------------------

    def _set(self, **values) -> None:
        with self._changed:
            for name, value in values.items():
                setattr(self, name, value)
            self._changed.notify_all()

    def _supervise(self) -> None:
        failures_in_a_row = 0
        while not self._stop.is_set():
            try:
                port = free_port_run(1)
            except BriskError as exc:
                port, why = 0, str(exc)
            with self._changed:
                self.generation += 1
                generation, self.port = self.generation, port
            became_ready = threading.Event()
            watcher = threading.Thread(target=self._watch_ready, args=(generation, port, became_ready), daemon=True)
            watcher.start()
            why = self._run_group(port) if port else why
            if became_ready.is_set():
                failures_in_a_row = 0
            failures_in_a_row += 1
            with self._changed:  # one step: a request told the group ended finds it regrouping
                self._ended[generation] = why
                for old in [g for g in self._ended if g < generation - 8]:  # a few kept for late readers
                    del self._ended[old]
                if not self._stop.is_set():
                    self.error, self.failures = why, self.failures + 1
                    # the first group must come up: `brisk serve` ends with its error instead
                    self.state = "failed" if generation == 1 and not became_ready.is_set() else "regrouping"
                self._changed.notify_all()
            if self._stop.is_set() or self.state == "failed":
                break
            log.warning("the ranks' group ended: %s", why)
            delay = regroup_delays()[min(failures_in_a_row, len(REGROUP_DELAY_S)) - 1]
            self._stop.wait(delay)
        if self.state != "failed":
            self._set(state="stopped")

    def _run_group(self, port: int) -> str:
        """Run one group to its end; why it ended, in one line."""
        try:
            self._launch(
                self.argv_for(port),
                ranks=self.ranks,
                hostfile=self.hostfile,
                join_timeout=self.join_timeout,
                rank_timeout=self.rank_timeout,
                stdout=_Discard(),
                stop=self._stop,
                hold_errors=False,  # a server's log is read while it runs
            )
        except RankFailed as exc:
            return str(exc)
        except BriskError as exc:  # a host that is not there, no free ports: said the same way
            return str(exc)
        except Exception as exc:  # the supervisor outlives a bug; the log has it
            log.exception("launching the ranks failed")
            return f"launching the ranks failed: {exc}"
        return "the ranks' group ended (rank 0's server stopped)"

    def _watch_ready(self, generation: int, port: int, became_ready: threading.Event) -> None:
        """Rank 0 answers its /health once every rank joined the ring (it joins first)."""
        while not self._stop.is_set():
            with self._changed:
                if generation in self._ended or self.generation != generation:
                    return
            if port and _answers(port):
                with self._changed:
                    if generation not in self._ended and not self._stop.is_set():
                        became_ready.set()
                        self.state = "ready"
                        self._changed.notify_all()
                return
            time.sleep(READY_POLL_S)


def _answers(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()
