"""The coverage map under an answer that a sparse prefill produced: which method read the
prompt and how much of it at full depth, the largest passages it skipped, and a one-click
"Read it all" that asks again with dense prefill.

When the turn's coverage says the passages the question points at were mostly skipped
(`question_dropped`, engine/accel/question_focus.py), a warning says so above the map,
with "Read it all and answer again" beside it: an answer that may have missed its facts
must not look like any other."""

from __future__ import annotations

import html

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

READ = QColor(80, 160, 255)
SKIPPED = QColor(128, 128, 128, 70)
ROW_HEIGHT = 5


class CoverageStrip(QWidget):
    """The prompt from start to end, one row per drop layer (deeper rows lower): blue where
    that layer read the tokens, grey where it had dropped them."""

    def __init__(self, coverage: dict, parent=None):
        super().__init__(parent)
        self.total = max(coverage.get("new_tokens", 0), 1)
        self.layers = coverage.get("layers", [])
        self.setMinimumWidth(120)
        self.setFixedHeight(ROW_HEIGHT * max(len(self.layers), 1) + 2)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        try:  # a painter left open when drawing raises takes the whole app down
            self._paint(painter)
        finally:
            painter.end()

    def _paint(self, painter: QPainter) -> None:
        width = self.width()
        for row, (_, runs) in enumerate(self.layers):
            y = 1 + row * ROW_HEIGHT
            painter.fillRect(QRectF(0, y, width, ROW_HEIGHT - 1), SKIPPED)
            for start, end in runs:
                painter.fillRect(
                    QRectF(width * start / self.total, y, max(width * (end - start) / self.total, 1), ROW_HEIGHT - 1),
                    READ,
                )


class CoverageMap(QWidget):
    read_all_requested = Signal()

    def __init__(self, coverage: dict, parent=None):
        super().__init__(parent)
        self.setObjectName("coverageMap")
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        self.flagged = bool(coverage.get("question_dropped"))
        self.warning: QLabel | None = None
        self.answer_again: QPushButton | None = None
        if self.flagged:
            column.addLayout(self._warning_row(coverage))
        layout = QHBoxLayout()
        column.addLayout(layout)
        share = coverage.get("read_share", 1.0)
        self.label = QLabel(f"{method_name(coverage)} read {share:.0%} of the prompt in full")
        self.label.setObjectName("coverageLabel")
        self.strip = CoverageStrip(coverage)
        self.read_all = QPushButton("Read it all")
        self.read_all.setToolTip("Ask again with every token read by every layer (dense prefill, slower)")
        self.read_all.clicked.connect(self.read_all_requested.emit)
        for w in (self.label, self.strip, self.read_all):
            layout.addWidget(w)
        self.setToolTip(coverage_tooltip(coverage))

    def _warning_row(self, coverage: dict) -> QHBoxLayout:
        row = QHBoxLayout()
        read = coverage.get("question_read", 0.0)
        self.warning = QLabel(
            f"⚠ The passages sharing rare words with your question were mostly skipped ({read:.0%} of them "
            "read in full): this answer may have missed them."
        )
        self.warning.setObjectName("coverageWarning")
        self.warning.setTextFormat(Qt.PlainText)
        self.warning.setWordWrap(True)
        self.warning.setStyleSheet("color: #b35c00; font-weight: bold;")
        self.answer_again = QPushButton("Read it all and answer again")
        self.answer_again.setObjectName("readAllAgain")
        self.answer_again.setToolTip("Regenerate this answer with every token read (dense prefill, slower)")
        self.answer_again.clicked.connect(self.read_all_requested.emit)
        row.addWidget(self.warning, 1)
        row.addWidget(self.answer_again)
        return row


def method_name(coverage: dict) -> str:
    """Which sparse prefill read the prompt: the turn says so, or its map's shape (layer -1
    is SpecPrefill's whole model; older turns carry no method)."""
    method = coverage.get("method")
    if method in ("specprefill", "uniprefill"):
        return {"specprefill": "SpecPrefill", "uniprefill": "UniPrefill"}[method]
    layers = coverage.get("layers", [])
    return "SpecPrefill" if layers and layers[0][0] < 0 else "UniPrefill"


def coverage_tooltip(coverage: dict) -> str:
    layers = coverage.get("layers", [])
    share, total = coverage.get("read_share", 1.0), coverage.get("new_tokens", 0)
    whole_model = bool(layers) and layers[0][0] < 0  # SpecPrefill: no layer read what it skipped
    if whole_model:
        lines = [f"SpecPrefill: the model read {share:.0%} of the {total:,} new prompt tokens."]
    else:
        names = [html.escape(str(layer)) for layer, _ in layers]  # stored values: text, never markup
        lines = [
            f"UniPrefill dropped blocks at layers {', '.join(names)}; "
            f"the layers after {names[-1] if names else '-'} read {share:.0%} of the {total:,} new "
            "prompt tokens (one row per drop layer, blue = read)."
        ]
    if coverage.get("question_regions"):
        lines.append(
            # what it measures: a word match, not a proof that the answer's passage was read
            f"Passages sharing rare words with your question: {coverage.get('question_read', 1.0):.0%} read in "
            "full" + (" (mostly skipped)." if coverage.get("question_dropped") else ".")
        )
    skipped = coverage.get("skipped", [])
    if skipped:
        where = "the model did not read" if whole_model else "skipped by the deepest layers"
        lines.append(f"Largest passages {where}:")
        lines += [f"• tokens {s:,}–{e:,}: “{html.escape(text)}…”" for s, e, text in skipped]
    return "<br>".join(lines)
