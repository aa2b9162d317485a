"""How uvicorn holds connections for `brisk serve`: deadlines for reading a request, a cap
on connections below the open-file limit, and logs that a flood cannot fill a disk.

Without these, about 2,050 half-sent requests held every file descriptor (mlx-lm sets the
limit to 2048) and no client was served, while asyncio logged each failed accept: 1.18 GB
of log in 5 minutes. uvicorn has a keep-alive timeout but no deadline for a request's head
or body (slowloris), and its `limit_concurrency` answers 503 only once a request's head
has arrived, so the protocol below adds both; it is uvicorn's h11 protocol otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any, Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEAD_TIMEOUT_S = 10.0  # a request line and headers are one packet for any real client
DEFAULT_BODY_TIMEOUT_S = 60.0  # the largest body (8 MB) at ~140 KB/s
DEFAULT_MAX_CONNECTIONS = 1024  # far beyond what one engine thread can answer at once
RESERVED_FDS = 128  # left to the process: model files, pipes, the engine's own
BACKLOG = 128  # asyncio accepts up to this many sockets per wake-up before any can be closed
LOG_EVERY_S = 60.0  # one message of a kind per minute; the rest are counted
MAX_LOG_KINDS = 1000
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def connection_cap(soft_fd_limit: int | None = None) -> int:
    """Connections kept below the open-file limit, with room for what asyncio may accept
    before the cap closes them (BACKLOG per wake-up, a few wake-ups) and for the process."""
    if soft_fd_limit is None:
        soft_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_fd_limit == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    room = soft_fd_limit - RESERVED_FDS - 3 * BACKLOG
    return max(8, min(DEFAULT_MAX_CONNECTIONS, room))


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout_s: float = DEFAULT_HEAD_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request, and a connection cap.

    At the cap, a new connection closes the one that has been reading its request the
    longest (a half-sent request, or an idle keep-alive); if every connection is being
    answered, the new one is closed instead."""

    limits = ConnectionLimits()
    closed_for_time = 0  # counters for the tests and the logs, per class
    closed_for_cap = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading: str | None = None  # "head" or "body" while a request is being read
        self.reading_since = 0.0
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()
        if len(self.connections) > self.limits.max_connections:
            victim = min(
                (c for c in self.connections if isinstance(c, GuardedH11Protocol) and c.reading),
                key=lambda c: c.reading_since,
                default=self,
            )
            type(self).closed_for_cap += 1
            _log.warning(
                "%d connections (the most is %d): closing one", len(self.connections), self.limits.max_connections
            )
            victim.close_now()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        self.reading = None
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._watch()

    def _watch(self) -> None:
        """Starts a deadline when the request's head or body starts being read; ends it after."""
        if self.transport is None or self.transport.is_closing():
            return
        state = self.conn.their_state
        reading = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if reading == self.reading:
            return
        self._cancel_deadline()
        self.reading, self.reading_since = reading, time.monotonic()
        if reading is not None:
            timeout = self.limits.head_timeout_s if reading == "head" else self.limits.body_timeout_s
            self.deadline = self.loop.call_later(timeout, self._too_slow, reading)

    def _too_slow(self, reading: str) -> None:
        self.deadline = None
        if self.reading != reading or self.transport.is_closing():
            return
        type(self).closed_for_time += 1
        _log.warning("a request's %s took too long to arrive: closing its connection", reading)
        if reading == "head":  # no response has begun: say why before closing
            self.transport.write(TIMED_OUT)
        self.close_now()

    def close_now(self) -> None:
        self._cancel_deadline()
        self.reading = None
        if not self.transport.is_closing():
            self.transport.close()  # a body being read: the app's receive() then sees a disconnect

    def _cancel_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None


def protocol_with(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class bound to these limits (uvicorn makes one instance per connection)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class RateLimitedLog(logging.Filter):
    """Lets one record of each kind (logger and message's first line) through per `every_s`
    seconds; the next one let through says how many were dropped in between."""

    def __init__(self, every_s: float = LOG_EVERY_S, *, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self.last: dict[tuple[str, str], float] = {}
        self.dropped: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # The first line names the kind: asyncio writes its context (the socket...) below it.
        key = (record.name, str(record.msg).split("\n", 1)[0])
        now = self.clock()
        if len(self.last) > MAX_LOG_KINDS:  # kinds are few; a message with data in its first line is not
            self.last.clear()
        if key in self.last and now - self.last[key] < self.every_s:
            self.dropped[key] = self.dropped.get(key, 0) + 1
            return False
        self.last[key] = now
        if dropped := self.dropped.pop(key, 0):
            record.msg = f"{record.getMessage()} ({dropped} more like this were not logged)"
            record.args = None
        return True


# asyncio logs each failed accept (EMFILE); uvicorn each bad request and our own closes.
FLOODABLE_LOGGERS = ("asyncio", "uvicorn.error", __name__)
_log = logging.getLogger(__name__)


def limit_log_floods(every_s: float = LOG_EVERY_S) -> None:
    """Puts a RateLimitedLog on the loggers a connection flood writes to (once)."""
    for name in FLOODABLE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitedLog) for f in logger.filters):
            logger.addFilter(RateLimitedLog(every_s))


def make_config(app, *, limits: ConnectionLimits | None = None, **options: Any) -> uvicorn.Config:
    """uvicorn's Config for Brisk's API: the guarded protocol, a cap below the open-file
    limit (read now: importing mlx-lm lowers it to 2048) and rate-limited logs."""
    limits = limits or ConnectionLimits(max_connections=connection_cap())
    limit_log_floods()
    options.setdefault("log_level", "warning")
    return uvicorn.Config(app, http=protocol_with(limits), backlog=BACKLOG, **options)
