"""The model manager's 'Remote engines' box: Brisk servers elsewhere that a chat can pick in
its model list like an installed model. A key is typed into a password box, kept in an
owner-only file (app/remote_client.py) and shown only masked."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from brisk.app.remote_client import make_remote, masked, save_remotes
from brisk.engine.host.serve.cli import is_loopback

COLUMNS = ("Name", "Address", "Model", "API key")


class RemoteEnginesBox(QGroupBox):
    changed = Signal()  # servers added or removed: the model lists offer them

    def __init__(self, remote, parent=None):
        super().__init__("Remote engines (Brisk servers elsewhere)", parent)
        self.remote = remote  # app/remote_engine.py: its `servers` are the ones kept
        self.setToolTip(
            "A chat whose model is remote:NAME sends its turns to that server's OpenAI-compatible API "
            "(brisk serve); the dashboard then shows the server's metrics"
        )
        layout = QVBoxLayout(self)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setMaximumHeight(110)
        layout.addWidget(self.table)
        row = QHBoxLayout()
        self.name = QLineEdit()
        self.name.setPlaceholderText("name, e.g. studio")
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://192.168.1.20:8088")
        self.model = QLineEdit()
        self.model.setPlaceholderText("model (empty: the server's)")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText("API key (not needed on this machine)")
        self.add_button = QPushButton("Add")
        self.add_button.clicked.connect(self.add)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_selected)
        for w in (self.name, self.url, self.model, self.key, self.add_button, self.remove_button):
            row.addWidget(w)
        row.setStretch(1, 2)
        layout.addLayout(row)
        self.status = QLabel("")
        self.status.setTextFormat(Qt.PlainText)  # it quotes typed names and addresses
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.refresh()

    def refresh(self) -> None:
        servers = sorted(self.remote.servers.values(), key=lambda s: s.name)
        self.table.setRowCount(len(servers))
        for r, s in enumerate(servers):
            for c, text in enumerate((s.id, s.url, s.model or "(the server's default)", masked(s.key))):
                self.table.setItem(r, c, QTableWidgetItem(text))
        self.table.resizeColumnsToContents()

    def add(self) -> None:
        try:
            server = make_remote(self.name.text(), self.url.text(), self.key.text(), self.model.text())
        except ValueError as exc:
            self.status.setText(str(exc))
            return
        replaced = server.id in self.remote.servers
        if not self._save({**self.remote.servers, server.id: server}):
            return
        self.key.clear()  # not left in a widget's memory longer than needed
        # brisk serve speaks plain HTTP: on a network the key and the chats can be read on the way
        clear = server.url.startswith("http:") and not is_loopback(server.host)
        self.status.setText(
            f"{'Updated' if replaced else 'Added'} {server.id}: pick it as a chat's model in Chat settings"
            + (
                ". Over plain http the key and your chats cross the network unencrypted: an SSH tunnel "
                "(ssh -L 8088:127.0.0.1:8088 host) or an https proxy keeps them private"
                if clear
                else ""
            )
        )

    def remove_selected(self) -> None:
        ids = {self.table.item(i.row(), 0).text() for i in self.table.selectedIndexes()}
        if ids and self._save({k: v for k, v in self.remote.servers.items() if k not in ids}):
            self.status.setText(f"Removed {', '.join(sorted(ids))}; chats that used it keep their messages")

    def _save(self, servers: dict) -> bool:
        from brisk.engine.api.errors import BriskError

        try:
            save_remotes(servers.values())
        except (OSError, BriskError) as exc:  # BriskError: a data folder others can write
            self.status.setText(f"Cannot save the remote engines: {exc}")
            return False
        self.remote.servers = servers
        self.refresh()
        self.changed.emit()
        return True
