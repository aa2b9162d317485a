"""Threads that run MLX, made safe to have when the process exits.

MLX keeps a compile cache per thread: the traces of `mx.compile` (Brisk's decode step,
mlx-lm's compiled sampling and activations). When a thread ends, C++ destroys that cache,
which releases Python objects and so takes the GIL. `Thread.join()` returns *before* those
destructors run, so an orderly shutdown (join the engine thread, then exit) races them: if
the interpreter is already finalizing, the thread cannot take the GIL, Python unwinds it from
inside a destructor, and the process aborts ("terminate called without an active exception";
4 exits in 10 with a one-line compiled function, measured on mlx 0.30).

So an MLX thread, once its work is done, does not end: it says it finished, then sleeps
until the process ends. It is a daemon thread, so nothing waits for it, and its destructors
never run. A thread that never called `mx.compile` has no such cache; this costs it nothing
but a parked stack.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class MlxThread:
    """A daemon thread running `target`; `join` waits for `target` to return."""

    def __init__(self, target: Callable[[], object], *, name: str):
        self._target = target
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the work to end; False if it is still running after `timeout`."""
        return self._finished.wait(timeout)

    def is_alive(self) -> bool:
        """Whether the work is still running (the parked thread itself never ends)."""
        return self._thread.is_alive() and not self._finished.is_set()

    def _main(self) -> None:
        try:
            self._target()
        except Exception:  # a thread that never ends cannot hand its exception on: log it
            log.exception("%s failed", self._thread.name)
        finally:
            self._finished.set()
            threading.Event().wait()  # park: never end (see the module docstring)
