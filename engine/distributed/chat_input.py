"""`brisk chat --ranks N`: every rank reads what the user types, and Ctrl-C stops an answer
on all of them at the same token.

Every rank runs the chat (tensor parallelism: each turn's forwards need them all), so each
needs the user's lines. The launching brisk copies its stdin to mlx.launch, which copies
it to every rank's stdin (engine/distributed/quiet_launcher.py lets those writes through
for a chat). Ctrl-C there becomes a CANCEL line, and the end of input a /quit line: the
ranks then leave the chat as one. On a rank, a thread reads stdin: typed lines wait for
the prompt, CANCEL cancels the running turn's token, and AgreedCancel (serve_lockstep.py)
makes every rank see that at the same check.
"""

from __future__ import annotations

import queue
import sys
import threading

from brisk.engine.api.conversation import CancelToken

CANCEL = "\x00brisk-cancel"  # a line no terminal types (NUL); typed NULs are dropped on the way
QUIT = "/quit"


def relay_user_input(source, sink) -> None:
    """The launching side: the user's lines to the ranks, then /quit at the end of input."""
    try:
        for line in iter(source.readline, ""):
            _write(sink, line.replace("\x00", "").rstrip("\n") + "\n")
        _write(sink, QUIT + "\n")
    except (OSError, ValueError):  # the group has ended and its stdin was closed
        return


def send_cancel(sink) -> None:
    try:
        _write(sink, CANCEL + "\n")
    except (OSError, ValueError):
        pass


def _write(sink, text: str) -> None:
    sink.write(text.encode("utf-8"))
    sink.flush()


class RankInput:
    """A rank's side: `input` for the chat's prompt, `turn` for each answer's cancel token."""

    def __init__(self, rank, stream=None):
        self.rank = rank
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._running: CancelToken | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._read, args=(stream or sys.stdin,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in iter(stream.readline, ""):
            if line.rstrip("\n") == CANCEL:
                with self._lock:
                    if self._running is not None:  # between answers it stops nothing
                        self._running.cancel()
            else:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def input(self, prompt: str) -> str:
        print(prompt, end="", flush=True)
        line = self._lines.get()
        if line is None:
            raise EOFError
        return line

    def turn(self) -> CancelToken:
        """This answer's token, cancelled on every rank at one check once any rank read CANCEL."""
        from brisk.engine.distributed.serve_lockstep import AgreedCancel

        local = CancelToken()
        with self._lock:
            self._running = local
        return AgreedCancel(self.rank, local)

    def turn_ended(self) -> None:
        with self._lock:
            self._running = None
