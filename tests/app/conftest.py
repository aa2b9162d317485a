"""GUI tests run offscreen with a fake engine that replays scripted events."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("PySide6", reason="the GUI tests need PySide6 (pip install -e '.[gui,test]')")

from dataclasses import dataclass  # noqa: E402

from PySide6.QtCore import QObject, Signal  # noqa: E402


class FakeEngine(QObject):
    """Records commands; a test plays events through `play` as the engine thread would."""

    event = Signal(object)
    job_event = Signal(int, object)
    busy_changed = Signal(bool)

    def __init__(self):
        super().__init__()
        self.commands = []
        self.stopped = 0
        self.cancelled = []  # commands whose own job was cancelled

    def submit(self, command):
        self.commands.append(command)
        return FakeJob(self, command)

    def stop(self):
        self.stopped += 1

    def shutdown(self, timeout=0):
        pass

    def play(self, *events, job=None):
        """Events as the engine thread emits them; on `job_event` they belong to `job`
        (default: the last command submitted)."""
        job_id = job.id if job is not None else len(self.commands)
        for e in events:
            self.event.emit(e)
            self.job_event.emit(job_id, e)


class FakeJob:
    """What EngineThread.submit returns: the command and its own cancel."""

    def __init__(self, engine, command):
        self.engine, self.command, self.cancelled = engine, command, False
        self.id = len(engine.commands)  # 1, 2, ... in submission order

    def cancel(self):
        self.cancelled = True
        self.engine.stopped += 1
        self.engine.cancelled.append(self.command)


@dataclass
class Entry:
    """The catalog fields the settings panel reads."""

    id: str
    parameters: int
    tokenizer_fingerprint: str
    architecture: str


MODELS = [
    Entry("big", 1_500_000_000, "qwen", "qwen2"),
    Entry("small", 500_000_000, "qwen", "qwen2"),
    Entry("tiny", 135_000_000, "smol", "llama"),
]


@pytest.fixture
def engine():
    return FakeEngine()


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "brisk.db"


@pytest.fixture
def make_window(qtbot, engine, db_path):
    from brisk.app.store import Store
    from brisk.app.window import MainWindow
    from brisk.engine.api.settings import ChatSettings

    made = []

    def make(path=None):
        store = Store(path or db_path)
        window = MainWindow(
            store,
            engine,
            models=MODELS,
            default_settings=ChatSettings(model="big"),
            memory_probe=lambda: 123 * 2**20,
            free_memory_probe=lambda: 9 * 2**20,
        )
        qtbot.addWidget(window)
        window.show()
        window.activateWindow()
        qtbot.waitExposed(window)
        made.append(window)
        return window

    yield make
    for w in made:
        w.store.close()


@pytest.fixture(autouse=True)
def fresh_preferences():
    """Each test starts with no saved theme or measured draft costs (app/preferences.py)."""
    from brisk.engine.models.store import brisk_home

    (brisk_home() / "app.ini").unlink(missing_ok=True)
    yield
    (brisk_home() / "app.ini").unlink(missing_ok=True)
