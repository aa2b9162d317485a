"""The app's OpenAI-compatible server: `brisk serve` on the app's own engine thread.

Requests are answered by the same worker (and models) as the chats, through the engine
thread's queue, so a request and a chat never run at once. Server requests use negative
conversation ids, which no chat has.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, QTimer, Signal

from brisk.engine.api.conversation import CancelToken

HOST, PORT = "127.0.0.1", 8088


class ApiServer(QObject):
    status_changed = Signal(str)  # for the status bar: the address and requests served, or ""

    def __init__(self, engine, parent=None):
        super().__init__(parent)
        self.engine = engine
        self.local = None
        self.queue = None
        self._timer = QTimer(self, interval=1000, timeout=self._report)

    @property
    def running(self) -> bool:
        return self.local is not None

    def _execute(self, command, cancel: CancelToken, deliver) -> None:
        """Run a worker command on the app's engine thread; wait here until it is done."""
        done = threading.Event()
        self.engine.submit(command, cancel_token=cancel, on_event=deliver, on_done=done.set)
        done.wait()

    def start(self, default_model: str, *, port: int | None = None) -> str:
        from brisk.engine.host.serve.app import Server
        from brisk.engine.host.serve.local import LocalServer
        from brisk.engine.host.serve.scheduler import EngineQueue

        if self.running:
            return self.url
        port = PORT if port is None else port
        self.queue = EngineQueue(execute=self._execute)
        try:
            self.local = LocalServer(Server(self.queue, default_model=default_model).app(), host=HOST, port=port)
        except OSError as exc:
            self.queue.close()
            self.queue = None
            raise OSError(f"Cannot serve on {HOST}:{port}: {exc.strerror or exc}") from exc
        self._timer.start()
        self._report()
        return self.url

    @property
    def url(self) -> str:
        return f"{self.local.url}/v1" if self.local else ""

    def stop(self) -> None:
        if not self.running:
            return
        self._timer.stop()
        self.local.stop()
        self.queue.close(timeout=5)
        self.local = self.queue = None
        self.status_changed.emit("")

    def _report(self) -> None:
        stats = self.queue.stats()
        busy = f", {stats['queued']} waiting" if stats["queued"] else ""
        self.status_changed.emit(f"API: {self.url} · {stats['served']} served{busy}")
