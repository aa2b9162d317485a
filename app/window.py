"""The main window: composes the panels and binds menus and shortcuts to the controller."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from brisk.app.api_server import HOST as API_HOST
from brisk.app.api_server import PORT as API_PORT
from brisk.app.chat_files import export_json, export_markdown, import_json, read_export, write_export
from brisk.app.controller import ChatController
from brisk.app.store import StoreError
from brisk.app.widgets.chat_view import ChatView
from brisk.app.widgets.composer import Composer
from brisk.app.widgets.dashboard import Dashboard
from brisk.app.widgets.prefill_bar import PrefillBar
from brisk.app.widgets.settings_panel import SettingsPanel
from brisk.app.widgets.sidebar import Sidebar

# Height a window manager's title bar and frame take above the client area (Openbox: about 20 px)
TITLE_BAR_ALLOWANCE = 40


class MainWindow(QMainWindow):
    def __init__(
        self, store, engine, *, models: list, default_settings=None, memory_probe=None, free_memory_probe=None
    ):
        super().__init__()
        self.setWindowTitle("Brisk")
        self.resize(1280, 800)  # fitted to the screen's free area once the widgets are in (fit_to_screen)
        self.sidebar = Sidebar()
        self.chat_view = ChatView()
        self.prefill_bar = PrefillBar()
        self.composer = Composer()
        self.settings_panel = SettingsPanel()
        self.settings_panel.set_models(models)
        self.dashboard = Dashboard(memory_probe=memory_probe, free_memory_probe=free_memory_probe)
        # Short, so the chat column stays narrow enough for a 1024-wide screen; the colours in the tip.
        self.tint = QCheckBox("Tint speculated tokens")
        self.tint.setToolTip("Blue: tokens from the draft model; green: tokens looked up in the chat")
        self.tint.toggled.connect(self.chat_view.set_tint_draft)

        center = QWidget()
        column = QVBoxLayout(center)
        column.addWidget(self.chat_view, 1)
        column.addWidget(self.prefill_bar)
        column.addWidget(self.composer)
        column.addWidget(self.tint)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.dashboard, "Dashboard")
        self.tabs.addTab(self.settings_panel, "Chat settings")
        splitter = QSplitter(Qt.Horizontal)
        for widget, stretch in ((self.sidebar, 0), (center, 1), (self.tabs, 0)):
            splitter.addWidget(widget)
            splitter.setStretchFactor(splitter.count() - 1, stretch)
        splitter.setSizes([240, 700, 340])
        self.setCentralWidget(splitter)

        from brisk.app.remote_engine import RemoteEngine

        self.remote = RemoteEngine(parent=self)  # chats whose model is a Brisk server elsewhere
        self.settings_panel.set_remotes({i: s.url for i, s in self.remote.servers.items()})
        self.dashboard.describe_remote = self.remote.describe
        self.controller = ChatController(
            store,
            engine,
            remote=self.remote,
            chat_view=self.chat_view,
            composer=self.composer,
            prefill_bar=self.prefill_bar,
            settings_panel=self.settings_panel,
            dashboard=self.dashboard,
            default_settings=default_settings,
            parent=self,
        )
        self.store = store
        c = self.controller
        c.notice.connect(lambda text: self.statusBar().showMessage(text, 10000))
        c.lasting_notice.connect(self._show_lasting_notice)
        self._lasting_notice = ""
        c.conversations_changed.connect(self.refresh_sidebar)
        self.sidebar.selected.connect(c.open)
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.rename_requested.connect(c.rename)
        self.sidebar.delete_requested.connect(self.delete_with_undo)
        self.sidebar.search_changed.connect(c.search)
        self.chat_view.edit_submitted.connect(self.controller.edit)
        self.chat_view.version_requested.connect(self.controller.show_version)
        self.api_server = None  # app/api_server.py, made when first switched on
        self.api_status = QLabel("")
        self.api_status.setTextFormat(Qt.PlainText)  # it quotes addresses and errors
        self.statusBar().addPermanentWidget(self.api_status)
        self.undo_button = QPushButton("Undo")
        self.undo_button.hide()
        self.statusBar().addPermanentWidget(self.undo_button)
        self._build_menus()
        self._watch_models()
        self.undo_stack: list[int] = []  # deleted chats, the last on top: Ctrl+Z restores them in turn
        try:  # unused "New chat"s left by an earlier Brisk (or a crash) are not kept
            store.drop_empty()
        except StoreError:
            pass  # read-only: shown as they are
        self.refresh_sidebar()
        convs = store.conversations()
        if convs:
            c.open(convs[0].id)
        elif not store.read_only:
            c.new_conversation()
        note = " ".join(filter(None, [store.recovery_note, *store.problems]))
        if note:
            self.recovery_box = QMessageBox(QMessageBox.Warning, "Chat database", note, parent=self)
            self.recovery_box.setTextFormat(Qt.PlainText)  # the note quotes paths and stored text
            QTimer.singleShot(0, self.recovery_box.open)  # window-modal, never blocks the event loop
            self.statusBar().showMessage(note)
        self.refresh_sidebar()
        self.fit_to_screen()
        # A user opens the app and types a message; Qt would start in the first box, the search.
        self.composer.edit.setFocus(Qt.OtherFocusReason)

    def fit_to_screen(self) -> None:
        """No bigger than the screen's free area less a title bar: a 1280x800 client area on a
        1280x800 or 1366x768 screen put the status bar (and its Undo button) below the edge."""
        screen = self.screen() or QGuiApplication.primaryScreen()
        if screen is None:
            return
        free = screen.availableGeometry()
        self.resize(min(self.width(), free.width()), min(self.height(), free.height() - TITLE_BAR_ALLOWANCE))

    def _build_menus(self) -> None:
        """File / Edit / View / Models / Help, with the shortcuts desktop apps use."""
        c = self.controller
        menus = {
            "&File": (
                ("New chat", QKeySequence.New, self.new_chat),
                ("Import chat (JSON)…", QKeySequence("Ctrl+I"), self.import_json),
                ("Export as Markdown…", QKeySequence("Ctrl+E"), lambda: self.export("md")),
                ("Export as JSON…", QKeySequence("Ctrl+Shift+E"), lambda: self.export("json")),
                None,
                ("Quit", QKeySequence("Ctrl+Q"), self.close),
            ),
            "&Edit": (
                ("Undo delete", QKeySequence.Undo, self.undo_delete),
                ("Stop answer", QKeySequence("Esc"), c.stop),
                ("Regenerate", QKeySequence("Ctrl+R"), c.regenerate),
                ("Search chats", QKeySequence.Find, self.focus_search),
                ("Focus message box", QKeySequence("Ctrl+L"), self.composer.edit.setFocus),
            ),
            "&View": (
                ("Chat settings", QKeySequence("Ctrl+,"), self.show_settings),
                ("Show dashboard", QKeySequence("Ctrl+D"), self.toggle_dashboard),
            ),
            "&Models": (
                ("Models…", QKeySequence("Ctrl+M"), self.show_models),
                ("Serve OpenAI-compatible API", QKeySequence(), self.toggle_api_server),
            ),
            "&Help": (("About Brisk", QKeySequence(), self.show_about),),
        }
        self.actions_by_text = {}
        for title, entries in menus.items():
            menu = self.menuBar().addMenu(title)
            for entry in entries:
                if entry is None:
                    menu.addSeparator()
                    continue
                text, keys, slot = entry
                action = QAction(text, self)
                action.setShortcut(keys)
                # not triggered(bool) as the slot's first argument (it made Import JSON do nothing)
                action.triggered.connect(lambda _checked=False, slot=slot: slot())
                menu.addAction(action)
                self.addAction(action)
                self.actions_by_text[text] = action
        dashboard = self.actions_by_text["Show dashboard"]
        dashboard.setCheckable(True)
        dashboard.setChecked(True)
        self._build_theme_menu(self.menuBar().actions()[2].menu())
        self._build_font_actions(self.menuBar().actions()[2].menu())
        serving = self.actions_by_text["Serve OpenAI-compatible API"]
        serving.setCheckable(True)
        serving.setToolTip(f"Answer OpenAI API requests at http://{API_HOST}:{API_PORT}/v1 with this app's engine")

    def _build_theme_menu(self, view_menu) -> None:
        """View > Theme: System, Light or Dark, kept across launches."""
        from PySide6.QtGui import QActionGroup

        from brisk.app.theme import THEMES, saved_theme

        menu = view_menu.addMenu("Theme")
        group = QActionGroup(self)
        chosen = saved_theme()
        self.theme_actions = {}
        for choice in THEMES:
            action = QAction(choice.capitalize(), self, checkable=True, checked=choice == chosen)
            action.triggered.connect(lambda _checked=False, choice=choice: self.set_theme(choice))
            group.addAction(action)
            menu.addAction(action)
            self.theme_actions[choice] = action

    def _build_font_actions(self, view_menu) -> None:
        """View > Bigger / Smaller / Default text size, for the chat's text, kept across launches."""
        from brisk.app.theme import saved_chat_font_px

        view_menu.addSeparator()
        for text, keys, step in (
            ("Bigger text", [QKeySequence("Ctrl+="), QKeySequence(QKeySequence.ZoomIn)], 1),
            ("Smaller text", [QKeySequence("Ctrl+-"), QKeySequence(QKeySequence.ZoomOut)], -1),
            ("Default text size", [QKeySequence("Ctrl+0")], 0),
        ):
            action = QAction(text, self)
            action.setShortcuts(list(dict.fromkeys(keys)))  # ZoomOut is Ctrl+- itself here: twice is ambiguous
            action.triggered.connect(lambda _checked=False, step=step: self.step_chat_font(step))
            view_menu.addAction(action)
            self.addAction(action)
            self.actions_by_text[text] = action
        self.set_chat_font(saved_chat_font_px(), save=False)

    def step_chat_font(self, step: int) -> None:
        """+1 / -1 pixel, or 0 for the default size."""
        from brisk.app.theme import DEFAULT_CHAT_FONT_PX

        self.set_chat_font(self.chat_font_px + step if step else DEFAULT_CHAT_FONT_PX)

    def set_chat_font(self, px: int, *, save: bool = True) -> None:
        from brisk.app.theme import CHAT_FONT_RANGE, chat_font_sheet, save_chat_font_px

        self.chat_font_px = min(max(px, CHAT_FONT_RANGE[0]), CHAT_FONT_RANGE[1])
        for widget in (self.chat_view, self.composer.edit):
            widget.setStyleSheet(chat_font_sheet(self.chat_font_px))
        if save:
            save_chat_font_px(self.chat_font_px)
            self.statusBar().showMessage(f"Chat text: {self.chat_font_px} px (Ctrl+0 resets)", 3000)

    def set_theme(self, choice: str) -> None:
        from PySide6.QtWidgets import QApplication

        from brisk.app.theme import apply_theme, save_theme

        apply_theme(QApplication.instance(), choice)
        save_theme(choice)
        self.theme_actions[choice].setChecked(True)

    def _watch_models(self) -> None:
        """Models installed or removed elsewhere (the CLI, another window) appear at once."""
        from PySide6.QtCore import QFileSystemWatcher

        from brisk.engine.models.store import ModelStore

        folder = ModelStore().models_dir
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return
        self.models_watcher = QFileSystemWatcher([str(folder)], self)
        self.models_watcher.directoryChanged.connect(self.models_changed_on_disk)

    def models_changed_on_disk(self, *_) -> None:
        from brisk.engine.models.store import ModelStore

        self.settings_panel.set_models(ModelStore().list())
        if getattr(self, "model_manager", None) is not None:
            self.model_manager.refresh()

    def toggle_dashboard(self) -> None:
        """Collapse the dashboard and settings column so the chat gets the width."""
        self.tabs.setVisible(not self.tabs.isVisible())
        self.actions_by_text["Show dashboard"].setChecked(self.tabs.isVisible())

    def show_about(self) -> QMessageBox:
        self.about_box = QMessageBox(QMessageBox.Information, "About Brisk", about_text(), parent=self)
        self.about_box.open()
        return self.about_box

    def toggle_api_server(self) -> None:
        """Start or stop the API server on this window's engine thread (Models menu)."""
        from brisk.app.api_server import ApiServer

        action = self.actions_by_text["Serve OpenAI-compatible API"]
        if self.api_server is None:
            self.api_server = ApiServer(self.controller.engine, parent=self)
            self.api_server.status_changed.connect(self.api_status.setText)
        if self.api_server.running:
            self.api_server.stop()
        else:
            try:
                url = self.api_server.start(self.controller.default_settings.model)
                self.statusBar().showMessage(f"Serving the OpenAI-compatible API at {url}", 10000)
            except OSError as exc:
                self.statusBar().showMessage(str(exc), 15000)
        action.setChecked(self.api_server.running)

    def show_models(self):
        from brisk.app.widgets.model_manager import ModelManager
        from brisk.engine.models.bundled import BUNDLED
        from brisk.engine.models.store import ModelStore

        if getattr(self, "model_manager", None) is None:
            self.model_manager = ModelManager(
                self.controller.engine,
                lambda: ModelStore().list(),
                sorted(BUNDLED),
                self,
                store=self.controller.store,
                chat_settings=self.settings_panel.settings,
                remote=self.remote,
            )
            self.model_manager.remotes.changed.connect(
                lambda: self.settings_panel.set_remotes({i: s.url for i, s in self.remote.servers.items()})
            )
            self.controller.engine.event.connect(self._models_changed)
        self.model_manager.refresh()
        self.model_manager.show()
        return self.model_manager

    def _models_changed(self, event) -> None:
        from brisk.engine.host.model_commands import ModelsChanged
        from brisk.engine.models.store import ModelStore

        if isinstance(event, ModelsChanged):
            self.settings_panel.set_models(ModelStore().list())

    def _show_lasting_notice(self, text: str) -> None:
        """A download or compile stays said while it goes on ("" when it ended: cleared,
        unless the status bar has moved on to another message)."""
        bar = self.statusBar()
        if text:
            bar.showMessage(text)
        elif bar.currentMessage() == self._lasting_notice:
            bar.clearMessage()
        self._lasting_notice = text

    def refresh_sidebar(self) -> None:
        self.sidebar.set_conversations(self.controller.conversations(), self.controller.current)

    def new_chat(self) -> None:
        """Ctrl+N or New: a search left in the box would hide the new chat from the list."""
        if self.sidebar.search.text():
            self.sidebar.search.clear()  # search_changed refills the list unfiltered
        self._end_undo()  # something else done, by the New button or by Ctrl+N alike
        self.controller.new_conversation()

    def focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def show_settings(self) -> None:
        self.tabs.setCurrentWidget(self.settings_panel)

    def delete_with_undo(self, cid: int) -> None:
        title = self.store.conversation(cid).title
        self.controller.delete(cid)
        self.statusBar().showMessage(f"Deleted “{title}” (Ctrl+Z restores it)")
        self.undo_stack.append(cid)
        if not getattr(self, "_undo_wired", False):
            self.undo_button.clicked.connect(self.undo_delete)
            # Undo stays until the user does something else, however long they take to notice
            for signal in (self.sidebar.selected, self.sidebar.new_requested, self.composer.send_requested):
                signal.connect(self._end_undo)
            self._undo_wired = True
        self.undo_button.show()

    def _end_undo(self, *_) -> None:
        """The button goes once the user does something else; Ctrl+Z still restores until quit
        (deleted chats stay in the database, hidden, until then)."""
        self.undo_button.hide()

    def undo_delete(self) -> None:
        """Ctrl+Z or Undo: the last deleted chat back, whole (messages, versions, attachments,
        settings: deleting only hid it), opened and highlighted in the sidebar."""
        if not self.undo_stack:
            self.statusBar().showMessage("Nothing to undo", 3000)
            return
        cid = self.undo_stack[-1]
        if not self.controller.undelete(cid):
            return  # the status bar says why; Ctrl+Z can try again
        self.undo_stack.pop()
        self.controller.open(cid)
        self.refresh_sidebar()
        self.undo_button.setVisible(bool(self.undo_stack) and self.undo_button.isVisible())
        self.statusBar().showMessage(f"Restored “{self.store.conversation(cid).title}”", 3000)

    def export(self, kind: str, path: str | None = None) -> None:
        cid = self.controller.current
        if cid is None:
            return
        if path is None:
            suggested = Path(documents_folder()) / f"{safe_file_name(self.store.conversation(cid).title)}.{kind}"
            path, _ = QFileDialog.getSaveFileName(
                self, "Export chat", str(suggested), "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
            )
        if not path:
            return
        data = (
            export_markdown(self.store, cid)
            if kind == "md"
            else json.dumps(export_json(self.store, cid), indent=2, ensure_ascii=False)
        )
        try:
            write_export(path, data)
        except StoreError as exc:
            self.statusBar().showMessage(f"Cannot export to {Path(path).name}: {exc}", 10000)
            return
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    def import_json(self, path: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Import chat", "", "JSON (*.json)")
        if not path:
            return
        try:
            cid = import_json(self.store, read_export(path))
        except StoreError as exc:
            self.statusBar().showMessage(f"Cannot import {Path(path).name}: {exc}", 10000)
            return
        self.controller.open(cid)
        self.refresh_sidebar()

    def closeEvent(self, event) -> None:
        self.controller.save_before_quit()
        self.remote.shutdown()  # a remote answer streaming now ends here; what came is saved above
        try:
            self.controller.drop_if_empty(self.controller.current)  # an unused "New chat" is not kept
        except Exception:  # noqa: BLE001  closing must never fail (the next start drops it)
            pass
        if self.api_server is not None:
            self.api_server.stop()
        try:
            self.store.purge_deleted()  # what was deleted can no longer be undone
        except Exception:  # noqa: BLE001  closing must never fail
            pass
        super().closeEvent(event)


def documents_folder() -> str:
    """The user's documents folder (exports default there, not the working directory)."""
    from PySide6.QtCore import QStandardPaths

    return QStandardPaths.writableLocation(QStandardPaths.DocumentsLocation) or str(Path.home())


def safe_file_name(title: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in " -_." else "_" for ch in title).strip(" .")
    return cleaned[:60] or "chat"


def about_text() -> str:
    """Brisk's version and what it runs on, for bug reports."""
    import PySide6
    from PySide6.QtCore import qVersion

    from brisk.engine.version import runtime_versions

    found = runtime_versions()
    return (
        f"Brisk {found['brisk']}\nFast local LLM chat on MLX.\n\n"
        f"MLX {found['mlx']} · mlx-lm {found['mlx-lm']}\n"
        f"Qt {qVersion()} · PySide6 {PySide6.__version__}\nBLAS: {found['blas']}"
    )
