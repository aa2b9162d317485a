"""Conversations, newest first: new, rename, delete (with undo), search by title and content."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QHBoxLayout,
    QInputDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from brisk.app.icons import icon


class Sidebar(QWidget):
    selected = Signal(int)
    new_requested = Signal()
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("sidebar")
        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.search_changed.emit)
        top.addWidget(self.search)
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.setIcon(icon("new"))
        self.new_button.clicked.connect(self.new_requested.emit)
        top.addWidget(self.new_button)
        layout.addLayout(top)
        self.list = QListWidget()
        # Long titles end in "…" instead of widening the list behind a horizontal scrollbar.
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        # Delete removes the chosen chat (Ctrl+Z in the window brings it back)
        delete = QAction("Delete chat", self.list)
        delete.setShortcut(QKeySequence.Delete)
        delete.setShortcutContext(Qt.WidgetShortcut)
        delete.triggered.connect(self._delete_current)
        self.list.addAction(delete)
        layout.addWidget(self.list)
        self._filling = False

    def set_conversations(self, conversations, current: int | None) -> None:
        self._filling = True
        self.list.clear()
        for conv in conversations:
            item = QListWidgetItem(conv.title)
            item.setData(Qt.UserRole, conv.id)
            self.list.addItem(item)
            if conv.id == current:
                self.list.setCurrentItem(item)
        self._filling = False

    def titles(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def _current_changed(self, item, _previous) -> None:
        if item is not None and not self._filling:
            self.selected.emit(item.data(Qt.UserRole))

    def _delete_current(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.delete_requested.emit(item.data(Qt.UserRole))

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = item.data(Qt.UserRole)
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self._rename(cid, item.text()))
        menu.addAction("Delete (Del; Ctrl+Z undoes)", lambda: self.delete_requested.emit(cid))
        menu.exec(self.list.mapToGlobal(pos))

    def _rename(self, cid: int, title: str) -> None:
        text, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=title)
        if ok and text.strip():
            self.rename_requested.emit(cid, text.strip())
