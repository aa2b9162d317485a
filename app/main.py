"""`brisk-app`: the desktop app. Builds the QApplication, the store, the engine thread and
the main window, in the theme the user chose (app/theme.py)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import brisk.resources as resources


def check_report(app, window) -> list[str]:
    """What `--check` prints: the model's state, and whether the icons and stylesheet
    were found (an install that lost its package data still opens, unstyled)."""
    lost = resources.missing()
    return [
        window.dashboard.model_state.text(),
        f"resources: {'all found' if not lost else 'missing ' + ', '.join(lost)} ({resources.path()})",
        f"stylesheet: {len(app.styleSheet())} characters",
        f"window icon: {'loaded' if not app.windowIcon().isNull() else 'missing'}",
    ]


def default_database() -> Path:
    from brisk.engine.models.store import brisk_home

    return brisk_home() / "brisk.db"


def build_window(*, model_id: str, store_path: Path, worker=None, models=None, before_load=None):
    """The window wired to a real engine thread (tests pass a worker of their own).
    `before_load(window)` runs before the model starts loading: a slot connected later
    misses what the engine thread said first (a fast load's ModelLoaded too)."""
    from brisk.app.engine_thread import EngineThread
    from brisk.app.store import Store
    from brisk.app.window import MainWindow
    from brisk.engine.accel.speculative.costs_file import StoredPairCosts
    from brisk.engine.api.settings import ChatSettings
    from brisk.engine.host.worker import EngineWorker
    from brisk.engine.kv.saved import SavedCaches
    from brisk.engine.models.store import ModelStore

    store = Store(store_path, default_location=store_path == default_database())
    # Chats' prompt caches are kept beside the database they belong to (a folder that is not
    # private is refused now, with the database closed, rather than written through later).
    try:
        saved = SavedCaches.beside(store_path)
    except BaseException:
        store.close()
        raise
    engine = EngineThread(worker or EngineWorker(saved_caches=saved, pair_costs=StoredPairCosts()))
    window = MainWindow(
        store,
        engine,
        models=ModelStore().list() if models is None else models,
        default_settings=ChatSettings(model=model_id),
    )
    engine.event.connect(lambda e: _refresh_models(window, e))
    window.engine = engine
    if before_load is not None:
        before_load(window)
    window.controller.load_model(model_id)
    return window


def _refresh_models(window, event) -> None:
    from brisk.engine.api.events import ModelLoaded
    from brisk.engine.models.store import ModelStore

    if isinstance(event, ModelLoaded):
        window.settings_panel.set_models(ModelStore().list())


def _quit_when_loaded(app, window) -> None:
    """--check: print the model's progress as it comes (a first run says what it
    downloads, and how much, before it starts), and quit once it loaded or failed."""
    from PySide6.QtCore import QTimer

    from brisk.engine.api.events import EngineErrored, ModelLoaded, ModelLoadProgressed

    def done(event):
        if isinstance(event, ModelLoadProgressed):
            print(f"{event.model_id}: {event.message}", flush=True)
        if isinstance(event, (ModelLoaded, EngineErrored)):
            if isinstance(event, EngineErrored):
                window.dashboard.set_model_state(f"failed: {event.message}")
            QTimer.singleShot(0, app.quit)  # posted: a load done before app.exec() still ends it

    window.engine.event.connect(done)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    from brisk.engine.runtime.hub_env import hub_endpoint_problem

    problem = hub_endpoint_problem()  # huggingface_hub would raise when the engine imports it
    if problem:
        print(f"brisk-app: error: {problem}", file=sys.stderr)
        return 1
    from PySide6.QtGui import QIcon
    from PySide6.QtWidgets import QApplication

    from brisk.app.store import StoreUnavailable
    from brisk.engine.api.errors import UnsafeLocation
    from brisk.engine.api.settings import DEFAULT_MODEL_ID

    parser = argparse.ArgumentParser(prog="brisk-app", description="Brisk: fast local LLM chat")
    parser.add_argument("--model", default=DEFAULT_MODEL_ID, help="model for new chats")
    parser.add_argument("--database", type=Path, help="chat database (default: in Brisk's data folder)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="open the window, load the model (installing the default on first run), report, quit",
    )
    args = parser.parse_args(argv)
    from brisk.engine.runtime.crash_log import configure_console_logging

    configure_console_logging()
    from brisk.app.platform_check import install_advice, missing_libraries, qt_reference_leak, wants_xcb

    leak = qt_reference_leak()
    if leak:  # Python would abort mid-chat or at quit (issue 54); refuse now with the fix
        print(f"brisk-app: error: {leak}", file=sys.stderr)
        return 1
    missing = missing_libraries() if wants_xcb() else []
    if missing:  # Qt would abort with a misleading message; say exactly what to install
        print(f"brisk-app: error: {install_advice(missing)}", file=sys.stderr)
        return 1
    app = QApplication(sys.argv[:1])
    app.setApplicationName("Brisk")
    app.setWindowIcon(QIcon(str(resources.path("icons", "brisk.svg"))))
    from brisk.app.theme import apply_theme, saved_theme

    apply_theme(app, saved_theme())
    app.styleHints().colorSchemeChanged.connect(lambda _: apply_theme(app, saved_theme()))
    try:
        window = build_window(
            model_id=args.model,
            store_path=args.database or default_database(),
            before_load=(lambda w: _quit_when_loaded(app, w)) if args.check else None,
        )
    except (StoreUnavailable, UnsafeLocation) as exc:  # a folder, locked, not private, a newer schema: untouched
        return _refuse(app, str(exc), args.check)
    except Exception as exc:  # a bug: a sentence and the log's path, never a traceback
        from brisk.engine.runtime.crash_log import user_message

        return _refuse(app, user_message(exc, context="Starting Brisk"), args.check)
    sys.excepthook = lambda kind, exc, tb: _report_bug(window, exc)
    window.show()
    if args.check:
        app.processEvents()
        print(f"first window after {time.perf_counter() - started:.1f} s", flush=True)
    code = app.exec()
    if args.check:
        print("\n".join(check_report(app, window)))
        healthy = "loaded" in window.dashboard.model_state.text() and not resources.missing()
        code = 0 if healthy else 1
    window.engine.shutdown(timeout=30)  # it saves open chats' prompt caches first
    window.store.close()
    return code


def _report_bug(window, exc: BaseException) -> None:
    """A bug in a Qt slot: one line in the status bar, the traceback in the error log."""
    from brisk.engine.runtime.crash_log import user_message

    message = user_message(exc, context="The window")
    print(f"brisk-app: {message}", file=sys.stderr)
    window.statusBar().showMessage(message, 30000)


def _refuse(app, message: str, quiet: bool) -> int:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QMessageBox

    print(f"brisk-app: error: {message}", file=sys.stderr)
    if not quiet:
        box = QMessageBox(QMessageBox.Critical, "Brisk cannot start", message)
        box.setTextFormat(Qt.PlainText)  # the message quotes paths, which may look like markup
        box.exec()
    return 1


if __name__ == "__main__":
    sys.exit(main())
