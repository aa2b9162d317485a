"""Tells whoever shows progress that the kernels are being compiled: the one slow first step.

A fresh data folder (a new install, a new Brisk version) compiles the native kernels for this
machine: about 40 s for the two libraries on two cores, during which a model load would
otherwise sit silent. kernels/ctypes_library.py announces each compile here; the innermost listener
hears it: the model loader's progress callback (the CLI's stderr lines, the app's loading
line through the engine's ModelLoadProgressed), else whatever the CLI listens with for every
command. No listener: the log alone.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

log = logging.getLogger(__name__)

STARTED, BUILT, FAILED = "started", "built", "failed"


@dataclass(frozen=True)
class KernelCompile:
    what: str  # "the native kernels", "the MLX primitives"
    phase: str  # STARTED, BUILT or FAILED
    seconds: float = 0.0  # how long it took (BUILT, FAILED)
    first: bool = False  # the first library this process compiles

    @property
    def message(self) -> str:
        if self.phase == STARTED:
            head = "Compiling Brisk's CPU kernels once for this machine (about a minute)" if self.first else "Compiling"
            return f"{head}: {self.what}…"
        if self.phase == BUILT:
            return f"Compiled {self.what} in {self.seconds:.0f} s"
        return f"Compiling {self.what} failed after {self.seconds:.0f} s; Brisk goes on without them"


Listener = Callable[[KernelCompile], None]
_lock = threading.Lock()
_listeners: list[Listener] = []
_compiled = {"count": 0}


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """`listener` hears the compiles that start inside this block (it replaces outer listeners)."""
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


def listen_always(listener: Listener) -> None:
    """A listener for the whole process (the CLI's), heard when no inner one listens."""
    with _lock:
        _listeners.insert(0, listener)


def _announce(event: KernelCompile) -> None:
    log.info("%s", event.message)
    with _lock:
        listener = _listeners[-1] if _listeners else None
    if listener is not None:
        try:
            listener(event)
        except Exception:  # a progress display must never fail the build it reports
            log.exception("a kernel compile listener failed")


@contextmanager
def compiling(what: str) -> Iterator[None]:
    """Announces the compile of `what` around the block: started, then built or failed."""
    with _lock:
        first = _compiled["count"] == 0
        _compiled["count"] += 1
    _announce(KernelCompile(what, STARTED, first=first))
    started = time.monotonic()
    try:
        yield
    except BaseException:
        _announce(KernelCompile(what, FAILED, time.monotonic() - started))
        raise
    _announce(KernelCompile(what, BUILT, time.monotonic() - started))
