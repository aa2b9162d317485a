"""`brisk chat --ranks N`: every rank reads what the user types, and Ctrl-C stops an answer
on all of them at the same token.

Every rank runs the chat (tensor parallelism: each turn's forwards need them all), so each
needs the user's lines. The launching brisk copies its stdin to mlx.launch, which copies
it to every rank's stdin (engine/distributed/quiet_launcher.py lets those writes through
for a chat). The end of input becomes an END line: the ranks leave the chat as one. Ctrl-C
there does what it does in one process: during an answer (rank 0 says when it answers) it
becomes a CANCEL line, elsewhere it ends the chat. On a rank, a thread reads stdin: typed
lines wait for the prompt, CANCEL cancels the running turn's token, and AgreedCancel
(serve_lockstep.py) makes every rank see that at the same check.
"""

from __future__ import annotations

import queue
import sys
import threading

from brisk.engine.api.conversation import CancelToken

CANCEL = "\x00brisk-cancel"  # lines no terminal types (NUL); typed NULs are dropped on the way
END = "\x00brisk-end-of-input"
# Rank 0 marks where its answers start and end in its own output, so the launching brisk
# knows it in order with what the user sees (its markers on stderr could come later):
# launch.py's relay takes them out.
ANSWERING, IDLE = b"\x00brisk:answering\x01", b"\x00brisk:idle\x01"


def relay_user_input(source, sink) -> None:
    """The launching side: the user's lines to the ranks (as UTF-8: bytes that are not
    become U+FFFD, as one process reads them), then END at the end of input."""
    try:
        for raw in iter(getattr(source, "buffer", source).readline, b""):
            line = raw.replace(b"\x00", b"").rstrip(b"\r\n").decode("utf-8", errors="replace")
            _write(sink, line + "\n")
        _write(sink, END + "\n")
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
            elif line.rstrip("\n") == END:
                break
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
        _mark(ANSWERING)  # the launching brisk's Ctrl-C then stops the answer, not the chat
        return AgreedCancel(self.rank, local)

    def turn_ended(self) -> None:
        with self._lock:
            self._running = None
        _mark(IDLE)


def _mark(marker: bytes) -> None:
    sys.stdout.flush()  # after what was printed before it
    sys.stdout.buffer.write(marker)
    sys.stdout.buffer.flush()


def take_markers(data: bytes, on_mark) -> tuple[bytes, bytes]:
    """`data` without rank 0's markers (each passed to `on_mark` in order), and a tail to
    hold back: the start of a marker cut off at the end of `data`."""
    shown, rest = bytearray(), data
    while (at := rest.find(b"\x00")) >= 0:
        shown += rest[:at]
        rest = rest[at:]
        marker = next((m for m in (ANSWERING, IDLE) if rest.startswith(m)), None)
        if marker is not None:
            on_mark(marker)
            rest = rest[len(marker) :]
        elif any(m.startswith(rest) for m in (ANSWERING, IDLE)):
            return bytes(shown), rest  # a marker's start: the next chunk has the rest
        else:
            shown += rest[:1]  # a NUL of the answer's own
            rest = rest[1:]
    return bytes(shown + rest), b""
