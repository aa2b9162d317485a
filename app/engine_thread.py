"""The bridge between the GUI thread and the one engine thread.

Commands go in on a queue; the engine thread runs them through an `EngineWorker` (or
anything with its `handle(command, cancel)`) and every event comes back through one Qt
signal, which Qt delivers on the GUI thread. Each submitted command is a `Job` with its
own cancel flag, made when it is submitted: Stop is not queued, it sets the flags of the
running job and of the jobs still waiting, so a job stopped before the engine reaches it
never starts (the worker answers it at once as cancelled).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading

from PySide6.QtCore import QObject, Signal

from brisk.engine.api.conversation import CancelToken
from brisk.engine.api.events import EngineErrored
from brisk.engine.runtime.mlx_threads import MlxThread

log = logging.getLogger(__name__)
_SHUTDOWN = object()


class Job:
    """One submitted command, its id (every event it causes is also emitted with it on
    `EngineThread.job_event`) and its own cancel flag."""

    _ids = itertools.count(1)

    def __init__(self, command, *, cancel_token: CancelToken | None = None, on_event=None, on_done=None):
        self.id = next(self._ids)
        self.command = command
        self.cancel_token = cancel_token or CancelToken()
        # Called on the engine thread itself (no Qt in between): the API server's bridge.
        self.on_event, self.on_done = on_event, on_done

    def cancel(self) -> None:
        self.cancel_token.cancel()

    @property
    def cancelled(self) -> bool:
        return self.cancel_token.cancelled


class EngineThread(QObject):
    event = Signal(object)  # every event, for views of the whole engine
    job_event = Signal(int, object)  # (job id, event): for a widget that follows its own jobs only
    busy_changed = Signal(bool)

    def __init__(self, worker, parent=None):
        super().__init__(parent)
        self._worker = worker
        if hasattr(worker, "on_progress"):
            worker.on_progress = self.event.emit  # Qt queues it to the GUI thread
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._jobs: list[Job] = []  # submitted and not finished, the running one first
        self._thread = MlxThread(self._run, name="brisk-engine")  # never ends: see engine/runtime/mlx_threads.py
        self._thread.start()

    def submit(self, command, **callbacks) -> Job:
        job = Job(command, **callbacks)
        with self._lock:
            self._jobs.append(job)
        self._queue.put(job)
        return job

    def stop(self) -> None:
        """Cancel the running job and every job still waiting (partial answers are kept)."""
        with self._lock:
            for job in self._jobs:
                job.cancel()

    def shutdown(self, timeout: float = 5.0) -> None:
        self.stop()
        self._queue.put(_SHUTDOWN)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _SHUTDOWN:
                if hasattr(self._worker, "close"):
                    self._worker.close()  # on this thread: it owns the models and their MLX stream
                return
            self.busy_changed.emit(True)
            try:
                for event in self._worker.handle(job.command, job.cancel_token):
                    self.event.emit(event)
                    self.job_event.emit(job.id, event)
                    if job.on_event is not None:
                        job.on_event(event)
            except Exception as exc:  # a worker that breaks its promise still must not kill the thread
                from brisk.engine.runtime.crash_log import user_message

                log.exception("engine worker raised")
                failure = EngineErrored(user_message(exc, context="The engine"), "internal")
                self.event.emit(failure)
                self.job_event.emit(job.id, failure)
                if job.on_event is not None:
                    job.on_event(failure)
            finally:
                with self._lock:
                    self._jobs.remove(job)
                if job.on_done is not None:
                    job.on_done()
                self.busy_changed.emit(False)
