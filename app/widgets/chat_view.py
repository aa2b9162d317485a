"""The conversation: one bubble per message, Markdown with highlighted code, streaming."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QGuiApplication, QSyntaxHighlighter, QTextCharFormat, QTextFormat
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.widgets.coverage import CoverageMap

KEYWORDS = re.compile(r"\b(def|class|return|if|elif|else|for|while|in|import|from|as|with|try|except|finally|raise|"
                      r"lambda|yield|async|await|fn|let|mut|const|var|function|struct|impl|pub|use|match|new|"
                      r"public|private|static|void|int|float|bool|true|false|True|False|None|null)\b")
STRINGS = re.compile(r"(\"[^\"\n]*\"|'[^'\n]*')")
COMMENTS = re.compile(r"(#.*$|//.*$)")
NUMBERS = re.compile(r"\b\d+(\.\d+)?\b")
RENDER_INTERVAL_MS = 80  # re-render a streaming answer at most this often


class CodeHighlighter(QSyntaxHighlighter):
    """Keywords, strings, numbers and comments inside fenced code blocks."""

    def __init__(self, document):
        super().__init__(document)
        self.styles = {}
        for name, color, bold in (("keyword", "#c678dd", True), ("string", "#98c379", False),
                                  ("comment", "#7f848e", False), ("number", "#d19a66", False)):
            fmt = QTextCharFormat()
            fmt.setForeground(QColor(color))
            fmt.setFontWeight(QFont.Bold if bold else QFont.Normal)
            self.styles[name] = fmt

    def highlightBlock(self, text: str) -> None:
        fmt = self.currentBlock().blockFormat()
        if not (fmt.hasProperty(QTextFormat.BlockCodeFence) or fmt.hasProperty(QTextFormat.BlockCodeLanguage)):
            return
        for name, pattern in (("keyword", KEYWORDS), ("number", NUMBERS), ("string", STRINGS), ("comment", COMMENTS)):
            for match in pattern.finditer(text):
                self.setFormat(match.start(), match.end() - match.start(), self.styles[name])


class MessageBody(QTextBrowser):
    """Read-only rich text that grows to fit its content instead of scrolling."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Minimum)
        self.highlighter = CodeHighlighter(self.document())
        self.document().contentsChanged.connect(self._fit)

    def _fit(self) -> None:
        self.document().setTextWidth(self.viewport().width())
        self.setFixedHeight(int(self.document().size().height()) + 8)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit()


# Speculated tokens the target kept, by who proposed them (the tint checkbox's legend).
SOURCE_TINTS = {"draft": "rgba(80, 160, 255, 0.28)", "lookup": "rgba(63, 185, 80, 0.30)"}

class MessageWidget(QFrame):
    copy_requested = Signal(str)
    edit_requested = Signal(int)
    regenerate_requested = Signal()
    read_all_requested = Signal()

    def __init__(self, index: int, role: str, text: str = "", finish_reason: str | None = None, parent=None):
        super().__init__(parent)
        self.index, self.role = index, role
        # (text, source): "" the target's own tokens, "draft" or "lookup" speculated ones it kept
        self.segments: list[tuple[str, str]] = [(text, "")] if text else []
        self.tint_draft = False
        self.setObjectName(f"message-{role}")
        self.setProperty("role", role)
        layout = QVBoxLayout(self)
        header = QHBoxLayout()
        self.title = QLabel({"user": "You", "assistant": "Brisk", "system": "System"}.get(role, role))
        self.title.setObjectName("messageRole")
        header.addWidget(self.title)
        self.status = QLabel(_finish_note(finish_reason))
        self.status.setObjectName("messageStatus")
        header.addWidget(self.status)
        header.addStretch()
        self.copy_button = QPushButton("Copy")
        self.copy_button.clicked.connect(lambda: self.copy_requested.emit(self.text))
        self.copy_code_button = QPushButton("Copy code")
        self.copy_code_button.clicked.connect(lambda: self.copy_requested.emit(self.code()))
        header.addWidget(self.copy_code_button)
        header.addWidget(self.copy_button)
        if role == "user":
            self.edit_button = QPushButton("Edit")
            self.edit_button.clicked.connect(lambda: self.edit_requested.emit(self.index))
            header.addWidget(self.edit_button)
        else:
            self.regenerate_button = QPushButton("Regenerate")
            self.regenerate_button.clicked.connect(self.regenerate_requested.emit)
            header.addWidget(self.regenerate_button)
        layout.addLayout(header)
        self.body = MessageBody()
        layout.addWidget(self.body)
        self.coverage: CoverageMap | None = None
        self.render()

    def set_coverage(self, coverage: dict | None) -> None:
        """Show what a sparse prefill read for this answer (nothing for a dense one)."""
        if self.coverage is not None:
            self.coverage.setParent(None)
            self.coverage.deleteLater()
            self.coverage = None
        if coverage and coverage.get("read_share", 1.0) < 1.0:
            self.coverage = CoverageMap(coverage)
            self.coverage.read_all_requested.connect(self.read_all_requested.emit)
            self.layout().addWidget(self.coverage)

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)

    def code(self) -> str:
        blocks = re.findall(r"```[^\n]*\n(.*?)```", self.text, flags=re.S)
        return "\n".join(b.rstrip("\n") for b in blocks)

    def append(self, delta: str, source: str = "") -> None:
        if self.segments and self.segments[-1][1] == source:
            self.segments[-1] = (self.segments[-1][0] + delta, source)
        else:
            self.segments.append((delta, source))

    def set_finish(self, reason: str | None) -> None:
        self.status.setText(_finish_note(reason))

    def render(self) -> None:
        self.copy_code_button.setVisible("```" in self.text)
        if self.tint_draft and any(source for _, source in self.segments):
            parts = [f'<span style="background-color: {SOURCE_TINTS[source]}">{html.escape(t)}</span>' if source
                     else html.escape(t) for t, source in self.segments]
            self.body.setHtml(f'<div style="white-space: pre-wrap">{"".join(parts)}</div>')
        else:
            self.body.setMarkdown(self.text)


def _finish_note(reason: str | None) -> str:
    return {"cancelled": "stopped", "length": "max tokens reached", "context": "context full",
            "interrupted": "interrupted (the app closed mid-answer)", "error": "failed"}.get(reason or "", "")


class ChatView(QScrollArea):
    edit_requested = Signal(int)
    regenerate_requested = Signal()
    read_all_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setObjectName("chatView")
        inner = QWidget()
        self.column = QVBoxLayout(inner)
        self.column.addStretch()
        self.setWidget(inner)
        self.messages: list[MessageWidget] = []
        self.tint_draft = False
        self._dirty: MessageWidget | None = None
        self._timer = QTimer(self, interval=RENDER_INTERVAL_MS, singleShot=True)
        self._timer.timeout.connect(self._render_dirty)
        # Stay at the bottom while content grows below (a streaming answer, its coverage
        # map), unless the user has scrolled up to read.
        self._follow = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda value: setattr(self, "_follow", value >= bar.maximum() - 4))
        bar.rangeChanged.connect(lambda _, top: bar.setValue(top) if self._follow else None)

    def clear(self) -> None:
        for widget in self.messages:
            widget.setParent(None)
            widget.deleteLater()
        self.messages = []

    def add_message(self, role: str, text: str = "", finish_reason: str | None = None,
                    coverage: dict | None = None) -> MessageWidget:
        widget = MessageWidget(len(self.messages), role, text, finish_reason)
        widget.set_coverage(coverage)
        widget.tint_draft = self.tint_draft
        widget.copy_requested.connect(lambda t: QGuiApplication.clipboard().setText(t))
        widget.edit_requested.connect(self.edit_requested.emit)
        widget.regenerate_requested.connect(self.regenerate_requested.emit)
        widget.read_all_requested.connect(self.read_all_requested.emit)
        self.column.insertWidget(self.column.count() - 1, widget)
        self.messages.append(widget)
        QTimer.singleShot(0, self._scroll_to_end)
        return widget

    def append_to_last(self, delta: str, source: str = "") -> None:
        if not self.messages or self.messages[-1].role != "assistant":
            self.add_message("assistant")
        self.messages[-1].append(delta, source)
        self._dirty = self.messages[-1]
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        self._timer.stop()
        self._render_dirty()

    def set_tint_draft(self, on: bool) -> None:
        self.tint_draft = on
        for widget in self.messages:
            widget.tint_draft = on
            widget.render()

    def _render_dirty(self) -> None:
        if self._dirty is not None:
            self._dirty.render()  # the view follows it only if the reader is at the bottom
            self._dirty = None

    def _scroll_to_end(self) -> None:
        self._follow = True
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
