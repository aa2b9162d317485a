"""The model manager's work on the engine: install, download, import, remove. It submits
the commands and passes on only its own jobs' events, as signals the dialog shows; a chat's
error or the engine's other jobs never reach the dialog."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from engine.events import DownloadProgressed, EngineErrored
from engine.model_commands import ModelsChanged, RemoveModel


class ModelOperations(QObject):
    progressed = Signal(str, int, int)  # what is being fetched, bytes done, total (0: not known yet)
    finished = Signal(str)  # what happened, success or failure, in words
    models_changed = Signal()

    def __init__(self, engine, parent=None):
        super().__init__(parent)
        self.engine = engine
        self.running = None  # the job of the install, download or import under way
        self._own: set[int] = set()  # every job this object submitted
        engine.job_event.connect(self._job_event)

    @property
    def busy(self) -> bool:
        return self.running is not None

    def start(self, command) -> None:
        """One install, download or import at a time; its progress and end are reported."""
        self.running = self.engine.submit(command)
        self._own.add(self.running.id)

    def remove(self, model_id: str) -> None:
        self._own.add(self.engine.submit(RemoveModel(model_id)).id)

    def cancel(self) -> None:
        """Stop this operation only, never a chat's answer."""
        if self.running is not None:
            self.running.cancel()

    def _job_event(self, job_id: int, event) -> None:
        if job_id not in self._own:
            return
        if isinstance(event, DownloadProgressed):
            self.progressed.emit(
                f"{event.repo_id}: {event.file}" if event.file else event.repo_id, event.done_bytes, event.total_bytes
            )
        elif isinstance(event, (ModelsChanged, EngineErrored)):
            if self.running is not None and self.running.id == job_id:
                self.running = None
            self._own.discard(job_id)
            self.finished.emit(event.message)
            if isinstance(event, ModelsChanged):
                self.models_changed.emit()
