"""The model manager's work: install, download, import and remove on the engine, and the
catalogue search beside it. It submits the commands and passes on only its own jobs'
events, as signals the dialog shows; a chat's error or the engine's other jobs never reach
the dialog. Its messages are in the app's words, never the CLI's."""

from __future__ import annotations

import itertools
import threading

from PySide6.QtCore import QObject, Signal

from brisk.engine.api.events import DownloadProgressed, EngineErrored
from brisk.engine.api.settings import DEFAULT_MODEL_ID
from brisk.engine.host.model_commands import ModelsChanged, RemoveModel, app_wording

MAX_SEARCHES = 3  # searches waiting on the hub at once; each asks up to 8 things in parallel


class ModelOperations(QObject):
    progressed = Signal(str, int, int)  # what is being fetched, bytes done, total (0: not known yet)
    finished = Signal(str)  # what happened, success or failure, in words
    models_changed = Signal()
    searched = Signal(object)  # a catalogue SearchResult, or the one line that says why there is none

    def __init__(self, engine, parent=None):
        super().__init__(parent)
        self.engine = engine
        self.running = None  # the job of the install, download or import under way
        self._own: dict[int, object] = {}  # every job this object submitted, to its command
        self._searches = itertools.count(1)
        self._latest_search = 0
        self._search_threads: list[threading.Thread] = []
        self._relay.connect(self._deliver)
        engine.job_event.connect(self._job_event)

    _relay = Signal(int, object)  # a search thread's answer, handed to the GUI thread

    @property
    def busy(self) -> bool:
        return self.running is not None

    def start(self, command) -> None:
        """One install, download or import at a time; its progress and end are reported."""
        self.running = self.engine.submit(command)
        self._own[self.running.id] = command

    def pending(self, command) -> bool:
        """Whether this very command is submitted and not yet finished (Install pressed twice
        queued a second download of the same model)."""
        return command in self._own.values()

    def remove(self, model_id: str) -> None:
        command = RemoveModel(model_id)
        self._own[self.engine.submit(command).id] = command

    def cancel(self) -> None:
        """Stop this operation only, never a chat's answer."""
        if self.running is not None:
            self.running.cancel()

    def search(self, text: str, *, k_bits: int = 16, v_bits: int = 16, group_size: int = 32) -> bool:
        """Search the hub off the GUI thread (the network may take seconds, or never answer);
        only the latest search's answer is delivered. False, and nothing asked, while
        MAX_SEARCHES are still waiting for a slow hub (Enter held down started one each)."""
        self._search_threads = [t for t in self._search_threads if t.is_alive()]
        if len(self._search_threads) >= MAX_SEARCHES:
            return False
        number = self._latest_search = next(self._searches)

        def run() -> None:
            from brisk.engine.api.errors import BriskError
            from brisk.engine.models.catalog import search_hub

            try:
                outcome: object = search_hub(text, k_bits=k_bits, v_bits=v_bits, group_size=group_size)
            except BriskError as exc:
                outcome = app_wording(str(exc))
            except Exception as exc:  # a bug must reach the dialog as a line, not kill the thread silently
                outcome = f"The search failed: {type(exc).__name__}: {exc}"
            try:
                self._relay.emit(number, outcome)
            except RuntimeError:  # the dialog was closed and deleted while the hub answered
                pass

        thread = threading.Thread(target=run, name="brisk-catalog-search", daemon=True)
        self._search_threads.append(thread)
        thread.start()
        return True

    def wait_for_searches(self, timeout: float = 30.0) -> None:
        """For tests and shutdown: the searches under way have ended (their answers queued)."""
        for thread in self._search_threads:
            thread.join(timeout)

    def _deliver(self, number: int, outcome: object) -> None:
        if number == self._latest_search:
            self.searched.emit(outcome)

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
            self._own.pop(job_id, None)
            self.finished.emit(app_wording(event.message))
            if isinstance(event, ModelsChanged):
                self.models_changed.emit()


def chats_using(store, model_id: str) -> int:
    """How many chats (not deleted) answer with `model_id` or draft with it."""
    count = 0
    for conversation in store.conversations():
        settings = conversation.settings if isinstance(conversation.settings, dict) else {}
        if model_id in (settings.get("model", DEFAULT_MODEL_ID), settings.get("draft")):
            count += 1
    return count
