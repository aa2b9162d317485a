"""The bridge between the GUI thread and the one engine thread.

Commands go in on a queue; the engine thread runs them through an `EngineWorker` (or
anything with its `handle(command, cancel)`) and every event comes back through one Qt
signal, which Qt delivers on the GUI thread. Stop is not queued: it sets the running
command's cancel flag, which the engine checks between prefill chunks and tokens.
"""

from __future__ import annotations

import logging
import queue
import threading

from PySide6.QtCore import QObject, Signal

from engine.events import EngineErrored
from engine.session import CancelToken

log = logging.getLogger(__name__)
_SHUTDOWN = object()


class EngineThread(QObject):
    event = Signal(object)
    busy_changed = Signal(bool)

    def __init__(self, worker, parent=None):
        super().__init__(parent)
        self._worker = worker
        self._queue: queue.Queue = queue.Queue()
        self._cancel = CancelToken()
        self._thread = threading.Thread(target=self._run, name="brisk-engine", daemon=True)
        self._thread.start()

    def submit(self, command) -> None:
        self._queue.put(command)

    def stop(self) -> None:
        """Cancel the command now running (its partial answer is kept)."""
        self._cancel.cancel()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._cancel.cancel()
        self._queue.put(_SHUTDOWN)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            command = self._queue.get()
            if command is _SHUTDOWN:
                return
            self._cancel = CancelToken()
            self.busy_changed.emit(True)
            try:
                for event in self._worker.handle(command, self._cancel):
                    self.event.emit(event)
            except Exception as exc:  # a worker that breaks its promise still must not kill the thread
                log.exception("engine worker raised")
                self.event.emit(EngineErrored(f"Engine failure: {exc}", "internal"))
            finally:
                self.busy_changed.emit(False)
