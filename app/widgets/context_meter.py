"""The context-fill meter under the chat: how many of the model's context tokens the next
turn would hold, with the attached documents' share drawn apart."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

DOCUMENTS_COLOUR = "#bf8700"  # amber: the documents' part of the bar
# Past this share the bar turns red: an answer has little room left.
NEARLY_FULL = 0.9
FULL_COLOUR = "#d0453a"


class FillBar(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.used = self.documents = 0.0  # shares of the context, 0..1
        self.setFixedHeight(8)
        self.setMinimumWidth(80)

    def set_shares(self, used: float, documents: float) -> None:
        self.used, self.documents = min(max(used, 0.0), 1.0), min(max(documents, 0.0), 1.0)
        self.update()

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        painter.setPen(Qt.NoPen)
        whole = QRectF(self.rect())
        painter.setBrush(self.palette().mid())
        painter.drawRoundedRect(whole, 3, 3)
        full = self.used >= NEARLY_FULL
        painter.setBrush(QColor(FULL_COLOUR) if full else self.palette().highlight().color())
        painter.drawRoundedRect(QRectF(whole.x(), whole.y(), whole.width() * self.used, whole.height()), 3, 3)
        documents = min(self.documents, self.used)
        if full:  # documents that fill the context must not hide the red: theirs is the lower half
            whole = QRectF(whole.x(), whole.y() + whole.height() / 2, whole.width(), whole.height() / 2)
        painter.setBrush(QColor(DOCUMENTS_COLOUR))
        painter.drawRoundedRect(QRectF(whole.x(), whole.y(), whole.width() * documents, whole.height()), 3, 3)


class ContextMeter(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("contextMeter")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.bar = FillBar()
        self.label = QLabel("")
        self.label.setObjectName("contextMeterText")
        self.label.setTextFormat(Qt.PlainText)  # it names models
        self.label.setWordWrap(True)  # "more than N of M tokens · documents more than K" at a narrow width
        row.addWidget(self.bar, 2)
        row.addWidget(self.label, 3)  # a wrapped label takes the width its line needs before wrapping
        self.setToolTip(
            "Tokens the next turn would hold (the chat, its system prompt, waiting documents and the "
            "message typed so far) of the model's context; the documents' share is amber"
        )
        self.show_unknown("")

    def show_fill(
        self, used: int, context: int, documents: int, *, exact: bool = True, documents_exact: bool = True
    ) -> None:
        # A count that stopped past the context is a lower bound: a document's own count may have
        # gone further than the whole message's, and the whole is never shown below its part.
        if documents > used:
            used, exact = documents, exact and documents_exact
        share = used / context if context else 0.0
        more = "" if exact else "more than "
        text = f"Context: {more}{used:,} of {context:,} tokens ({share:.0%})"
        if documents:
            text += f" · documents {'' if documents_exact else 'more than '}{documents:,}"
        self.label.setText(text)
        self.label.setStyleSheet(f"color: {FULL_COLOUR};" if share >= NEARLY_FULL else "")
        self.bar.set_shares(share, documents / context if context else 0.0)
        self.bar.show()

    def show_unknown(self, note: str) -> None:
        self.label.setText(note)
        self.bar.set_shares(0.0, 0.0)
        self.bar.hide()
