"""A chat's turns on a Brisk server elsewhere, beside the local engine thread.

It takes the same `Answer` command and gives back the same events (`ConversationEvent`s
of `TokenEmitted`, then `TurnFinished` or `EngineErrored`) on one Qt signal, so the
controller saves, shows and marks a remote answer as it does a local one. Each turn runs
on its own worker thread (the GUI never waits on the network); Stop cancels the job and
shuts the connection, which wakes a read waiting on the server.
"""

from __future__ import annotations

import logging
import threading
import time

from PySide6.QtCore import QObject, Signal

from brisk.app.engine_thread import Job
from brisk.app.remote_client import RemoteError, RemoteServer, Stream, load_remotes, request_body
from brisk.engine.api.events import EngineErrored, TokenEmitted, TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import ConversationEvent

log = logging.getLogger(__name__)
# Server metrics that mean nothing here: a clock of the server's own process.
NOT_COPIED = {"engine_started_at", "extra", "sources", "coverage", "model_id"}


class RemoteJob(Job):
    def __init__(self, command):
        super().__init__(command)
        self.stream: Stream | None = None

    def cancel(self) -> None:
        super().cancel()
        if self.stream is not None:
            self.stream.close()


class RemoteEngine(QObject):
    event = Signal(object)  # as EngineThread.event: the controller's on_event takes both

    def __init__(self, servers=None, parent=None):
        super().__init__(parent)
        self.servers: dict[str, RemoteServer] = load_remotes() if servers is None else dict(servers)
        self._threads: list[threading.Thread] = []
        self._jobs: list[RemoteJob] = []  # submitted, their threads maybe still running

    def server(self, model_id: str) -> RemoteServer | None:
        return self.servers.get(model_id)

    def describe(self, model_id: str) -> str:
        """'studio at http://host:8088 (model x)', for the dashboard; '' when unknown."""
        s = self.servers.get(model_id)
        if s is None:
            return ""
        return f"{s.name} at {s.url}" + (f" (model {s.model})" if s.model else " (the server's default model)")

    def submit(self, command) -> RemoteJob:
        job = RemoteJob(command)
        thread = threading.Thread(target=self._run, args=(job,), name="brisk-remote-turn", daemon=True)
        alive = [(t, j) for t, j in zip(self._threads, self._jobs) if t.is_alive()]
        self._threads, self._jobs = [t for t, _ in alive] + [thread], [j for _, j in alive] + [job]
        thread.start()
        return job

    def wait(self, timeout: float = 30.0) -> None:
        """For tests: the turns under way have ended (their events queued)."""
        for thread in list(self._threads):
            thread.join(timeout)

    def shutdown(self, timeout: float = 2.0) -> None:
        """Quitting: every turn under way stopped (its connection shut) and its thread ended."""
        for job in list(self._jobs):
            job.cancel()
        self.wait(timeout)

    def _emit(self, cid: int, event) -> None:
        try:
            self.event.emit(ConversationEvent(cid, event))
        except RuntimeError:  # the window closed while the server answered
            pass

    def _run(self, job: RemoteJob) -> None:
        command = job.command
        cid, settings = command.conversation_id, command.settings
        server = self.servers.get(settings.model)
        if server is None:
            self._emit(cid, EngineErrored(f"No remote engine named {settings.model} is set up (Models…)", "remote"))
            return
        started = time.monotonic()
        text, last = "", None
        job.stream = stream = Stream(server)
        if job.cancelled:
            stream.close()
        try:
            for kind, value in stream.pieces(request_body(server, command.messages, settings)):
                if kind == "text":
                    text += value
                    self._emit(cid, TokenEmitted(value, 0))
                else:
                    last = value
        except RemoteError as exc:
            self._emit(cid, EngineErrored(str(exc), "remote"))
            return
        except Exception as exc:  # a bug must reach the chat as a line, never end the thread silently
            log.exception("remote turn failed")
            self._emit(cid, EngineErrored(f"The remote turn failed: {type(exc).__name__}", "remote"))
            return
        if job.cancelled:
            reason = "cancelled"
        elif last is None:
            self._emit(cid, EngineErrored(f"{server.name} ended the answer without its metrics", "remote"))
            return
        else:
            reason = ""
        self._emit(cid, TurnFinished(text, [], remote_metrics(server, settings.model, last, started, reason)))


def remote_metrics(server: RemoteServer, model_id: str, last: dict | None, started: float, reason: str) -> TurnMetrics:
    """The server's TurnMetrics as the app keeps a turn's: its own clock's stamp replaced by
    this one's (the send), where and what answered in `extra`, and the ranks' memory there."""
    brisk = (last or {}).get("brisk") or {}
    sent = brisk.get("metrics") if isinstance(brisk.get("metrics"), dict) else {}
    metrics = TurnMetrics()
    known = set(TurnMetrics.__dataclass_fields__) - NOT_COPIED
    for name, value in sent.items():
        if name in known and isinstance(value, type(getattr(metrics, name))):
            setattr(metrics, name, value)
        elif name in known and isinstance(getattr(metrics, name), float) and isinstance(value, int):
            setattr(metrics, name, float(value))
    # a server on ranks puts each rank's memory in its metrics' extra (engine/distributed/serve_lockstep.py)
    server_extra = sent.get("extra") if isinstance(sent.get("extra"), dict) else {}
    ranks = server_extra.get("ranks") or sent.get("ranks")
    parallel = server_extra.get("parallel") or sent.get("parallel") or ""
    metrics.extra = {
        "remote": {"name": server.name, "url": server.url, "model": sent.get("model_id") or server.model},
        **({"ranks": ranks, "parallel": parallel} if isinstance(ranks, list) and ranks else {}),
    }
    metrics.model_id = model_id
    metrics.engine_started_at = started  # the turn left here then: TTFT's parts add up from it
    if reason:
        metrics.finish_reason = reason
    if not metrics.finish_reason:
        metrics.finish_reason = "stop"
    return metrics
