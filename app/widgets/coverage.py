"""The coverage map under an answer that a sparse prefill produced: which parts of the
prompt the model read at full depth, the largest passages it skipped, and a one-click
"Read it all" that asks again with dense prefill."""

from __future__ import annotations

import html

from PySide6.QtCore import QRectF, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSizePolicy, QWidget

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
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        share = coverage.get("read_share", 1.0)
        self.label = QLabel(f"Read in full: {share:.0%} of the prompt")
        self.label.setObjectName("coverageLabel")
        self.strip = CoverageStrip(coverage)
        self.read_all = QPushButton("Read it all")
        self.read_all.setToolTip("Ask again with every token read by every layer (dense prefill, slower)")
        self.read_all.clicked.connect(self.read_all_requested.emit)
        for w in (self.label, self.strip, self.read_all):
            layout.addWidget(w)
        self.setToolTip(coverage_tooltip(coverage))


def coverage_tooltip(coverage: dict) -> str:
    layers = coverage.get("layers", [])
    share, total = coverage.get("read_share", 1.0), coverage.get("new_tokens", 0)
    if layers and layers[0][0] < 0:
        lines = [f"SpecPrefill: the model read {share:.0%} of the {total:,} new prompt tokens."]
    else:
        names = [html.escape(str(layer)) for layer, _ in layers]  # stored values: text, never markup
        lines = [
            f"UniPrefill dropped blocks at layers {', '.join(names)}; "
            f"the layers after {names[-1] if names else '-'} read {share:.0%} of the {total:,} new "
            "prompt tokens (one row per drop layer, blue = read)."
        ]
    skipped = coverage.get("skipped", [])
    if skipped:
        lines.append("Largest passages skipped by the deepest layers:")
        lines += [f"• tokens {s:,}–{e:,}: “{html.escape(text)}…”" for s, e, text in skipped]
    return "<br>".join(lines)
