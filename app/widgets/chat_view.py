"""The conversation: one bubble per message, Markdown with highlighted code, streaming.

Every message is untrusted: bubbles render it in a SafeDocument (nothing is loaded), and a
long one shows only its first DISPLAY_CHARS characters until "Show all"."""

from __future__ import annotations

import html
import re

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QGuiApplication, QSyntaxHighlighter, QTextCharFormat, QTextFormat
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from brisk.app.icons import icon
from brisk.app.widgets.coverage import CoverageMap
from brisk.app.widgets.full_text import FullTextView
from brisk.app.widgets.safe_text import MARKDOWN_FEATURES, SafeDocument, open_link, plain_label
from brisk.app.widgets.text_wrap import wrap_for
from brisk.engine.turn.documents import join_attached, split_attached

KEYWORDS = re.compile(
    r"\b(def|class|return|if|elif|else|for|while|in|import|from|as|with|try|except|finally|raise|"
    r"lambda|yield|async|await|fn|let|mut|const|var|function|struct|impl|pub|use|match|new|"
    r"public|private|static|void|int|float|bool|true|false|True|False|None|null)\b"
)
STRINGS = re.compile(r"(\"[^\"\n]*\"|'[^'\n]*')")
COMMENTS = re.compile(r"(#.*$|//.*$)")
NUMBERS = re.compile(r"\b\d+(\.\d+)?\b")
RENDER_INTERVAL_MS = 80  # re-render a streaming answer at most this often
# A bubble lays out at most this many characters (about 12K tokens, longer than almost any
# answer); a 50 MB message laid out whole kept the window from opening for minutes.
DISPLAY_CHARS = 50_000
# Past this an editor would freeze the app laying the text out (seconds per megabyte), and
# splitting it into words for a chip took 9 s for 50 MB: counted as characters instead.
EDITABLE_CHARS = 1_000_000
# Qt lays a Markdown table out cell by cell at every resize: 8,000 rows or 6,000 columns froze
# the window 10-12 s (5 s a resize). Past this many cell borders a message is shown as text.
MARKDOWN_TABLE_BORDERS = 2_000


class CodeHighlighter(QSyntaxHighlighter):
    """Keywords, strings, numbers and comments inside fenced code blocks."""

    def __init__(self, document):
        super().__init__(document)
        self.styles = {}
        for name, color, bold in (
            ("keyword", "#c678dd", True),
            ("string", "#98c379", False),
            ("comment", "#7f848e", False),
            ("number", "#d19a66", False),
        ):
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
    """Read-only rich text that grows to fit its content instead of scrolling. It loads no
    resource, and a clicked link opens in the browser only if it is http(s)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setDocument(SafeDocument(self))
        # Qt would follow a link itself: a file: one was loaded into the bubble.
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(open_link)
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

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.FontChange:  # the chat's text size changed (View > Bigger text)
            self._fit()


# Speculated tokens the target kept, by who proposed them (the tint checkbox's legend).
SOURCE_TINTS = {"draft": "rgba(80, 160, 255, 0.28)", "lookup": "rgba(63, 185, 80, 0.30)"}


class DocumentChip(QFrame):
    """A document sent with a message: name, type and tokens; Preview opens its text.
    The model received the whole text; the bubble shows it as a chip, not a code block."""

    def __init__(self, name: str, text: str, info: dict | None = None, parent=None):
        super().__init__(parent)
        self.setObjectName("documentChip")
        self.name, self.text = name, text
        info = info or {}
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 3, 6, 3)
        glyph = QLabel()
        glyph.setPixmap(icon("document").pixmap(16, 16))
        layout.addWidget(glyph)
        facts = [name, str(info.get("kind") or "text")]
        pages, tokens = _count(info.get("pages")), _count(info.get("tokens"))
        if pages:
            facts.append(f"{pages:,} page{'s' if pages != 1 else ''}")
        if tokens:
            facts.append(f"{tokens:,} tokens")
        facts.append(f"{len(text.split()):,} words" if len(text) <= EDITABLE_CHARS else f"{len(text):,} characters")
        self.label = plain_label(" · ".join(facts))
        layout.addWidget(self.label, 1)
        self.preview_button = QPushButton("Preview")
        self.preview_button.clicked.connect(self.preview)
        layout.addWidget(self.preview_button)
        self.dialog: QDialog | None = None

    def preview(self) -> QDialog:
        self.dialog = dialog = QDialog(self.window())
        dialog.setWindowTitle(self.name)
        dialog.resize(720, 560)
        layout = QVBoxLayout(dialog)
        layout.addWidget(FullTextView(self.text, height=None))  # a part at a time: it may be megabytes
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(dialog.reject)
        layout.addWidget(buttons)
        dialog.open()
        return dialog


class MessageWidget(QFrame):
    copy_requested = Signal(str)
    edit_requested = Signal(int)
    edit_submitted = Signal(int, str)  # index, the whole new content (documents kept)
    regenerate_requested = Signal()
    read_all_requested = Signal()
    version_requested = Signal(int)  # -1 older, +1 newer

    def __init__(
        self,
        index: int,
        role: str,
        text: str = "",
        finish_reason: str | None = None,
        parent=None,
        *,
        documents: dict | None = None,
    ):
        super().__init__(parent)
        self.index, self.role = index, role
        # A user message's attached documents show as chips; its text is what was typed.
        self.documents, text = split_attached(text) if role == "user" else ([], text)
        # (text, source): "" the target's own tokens, "draft" or "lookup" speculated ones it kept
        self.segments: list[tuple[str, str]] = [(text, "")] if text else []
        self.tint_draft = False
        self.setObjectName(f"message-{role}")
        self.setProperty("role", role)
        layout = QVBoxLayout(self)
        header = QHBoxLayout()
        self.title = plain_label({"user": "You", "assistant": "Brisk", "system": "System"}.get(role, role))
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
            if len(text) > EDITABLE_CHARS:
                self.edit_button.setEnabled(False)
                self.edit_button.setToolTip(f"Too long to edit here ({len(text):,} characters): Copy it instead")
            header.addWidget(self.edit_button)
        else:
            self.older = QPushButton("<")
            self.version_label = QLabel("")
            self.version_label.setObjectName("versionLabel")
            self.newer = QPushButton(">")
            for button, step, tip in ((self.older, -1, "The previous answer"), (self.newer, 1, "The next answer")):
                button.setFixedWidth(28)
                button.setToolTip(tip)
                button.clicked.connect(lambda _checked=False, step=step: self.version_requested.emit(step))
            for w in (self.older, self.version_label, self.newer):
                header.addWidget(w)
            self.regenerate_button = QPushButton("Regenerate")
            self.regenerate_button.clicked.connect(self.regenerate_requested.emit)
            header.addWidget(self.regenerate_button)
            self.set_versions(0, 1)
        layout.addLayout(header)
        self.chips = [DocumentChip(name, body, (documents or {}).get(name)) for name, body in self.documents]
        for chip in self.chips:
            layout.addWidget(chip)
        self.body = MessageBody()
        layout.addWidget(self.body)
        self.show_all_button = QPushButton("Show all")
        self.show_all_button.setObjectName("showAll")
        self.show_all_button.clicked.connect(self.toggle_show_all)
        self.show_all_button.hide()
        layout.addWidget(self.show_all_button)
        self.full_view: FullTextView | None = None
        self._shown: tuple | None = None  # what the body holds now, to skip redoing it
        self.editor: QPlainTextEdit | None = None
        self.coverage: CoverageMap | None = None
        self.render()

    def set_versions(self, shown: int, count: int) -> None:
        """Answer `shown` (0-based) of `count` kept by regenerating: "< 2/3 >" when there are several."""
        for w in (self.older, self.version_label, self.newer):
            w.setVisible(count > 1)
        self.version_label.setText(f"{shown + 1}/{count}")
        self.older.setEnabled(shown > 0)
        self.newer.setEnabled(shown < count - 1)

    # --- editing in place ---------------------------------------------------------------

    def start_editing(self) -> QPlainTextEdit:
        """Swap the text for an editor in the bubble (documents stay attached)."""
        if self.editor is not None:
            return self.editor
        self.editor = QPlainTextEdit()
        self.editor.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        wrap_for(self.editor, self.text)  # before the text goes in: Qt lays it out then
        self.editor.setPlainText(self.text)
        self.editor.setFixedHeight(min(max(72, self.body.height() + 24), 320))
        buttons = QDialogButtonBox()
        self.save_button = buttons.addButton("Save and send", QDialogButtonBox.AcceptRole)
        buttons.addButton(QDialogButtonBox.Cancel)
        buttons.accepted.connect(self._submit_edit)
        buttons.rejected.connect(self.stop_editing)
        self.edit_buttons = buttons
        self.body.hide()
        self._close_full_view()
        self.show_all_button.hide()
        self.layout().addWidget(self.editor)
        self.layout().addWidget(buttons)
        self.editor.setFocus()
        return self.editor

    def stop_editing(self) -> None:
        if self.editor is None:
            return
        for w in (self.editor, self.edit_buttons):
            w.setParent(None)
            w.deleteLater()
        self.editor = None
        self.body.show()
        self.render()  # the "Show all" button back, with its label

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText().strip()
        if not text and not self.documents:
            return
        # The editor stays until the chat is redrawn from the store: an edit refused (an answer
        # still running) keeps the user's words on screen.
        self.edit_submitted.emit(self.index, join_attached(self.documents, text))

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
        text = self.text
        self.copy_code_button.setVisible("```" in text)
        truncated = len(text) > DISPLAY_CHARS
        tinted = self.tint_draft and any(source for _, source in self.segments)
        if truncated:
            whole = f"Show all ({len(text):,} characters)"
            self.show_all_button.setText("Show less" if self.full_view is not None else whole)
            self.show_all_button.setVisible(self.editor is None)
            if self.full_view is not None:
                self.full_view.set_text(text)
        else:
            self.show_all_button.hide()
        shown = (truncated, tinted, len(text) if not truncated else None)
        if shown == self._shown and truncated:
            return  # a streaming answer past the limit: the part on screen is unchanged
        self._shown = shown
        wrap_for(self.body, text[:DISPLAY_CHARS])  # a blob of base64 wraps anywhere, in linear time
        if tinted:
            parts = [
                f'<span style="background-color: {SOURCE_TINTS[source]}">{html.escape(t)}</span>'
                if source
                else html.escape(t)
                for t, source in _head(self.segments, DISPLAY_CHARS)
            ]
            more = "…" if truncated else ""
            self.body.setHtml(f'<div style="white-space: pre-wrap">{"".join(parts)}{more}</div>')
        elif truncated:
            # Markdown only for a whole message: a cut one could end inside a code fence.
            self.body.setPlainText(text[:DISPLAY_CHARS] + "…")
        elif text.count("|") > MARKDOWN_TABLE_BORDERS:
            self.body.setPlainText(text)
        else:
            self.body.document().setMarkdown(text, MARKDOWN_FEATURES)

    # --- a long message in full ------------------------------------------------------------

    def toggle_show_all(self) -> None:
        if self.full_view is None:
            self.show_all()
        else:
            self._close_full_view()
            self.body.show()
            self.render()

    def show_all(self) -> FullTextView:
        """The whole text, in a plain-text view that takes it a part at a time, in place of the cut one."""
        if self.full_view is None:
            self.full_view = FullTextView(self.text)
            self.layout().insertWidget(self.layout().indexOf(self.body) + 1, self.full_view)
            self.full_view.show()  # now, not at the next turn of the event loop
            self.body.hide()
        self.show_all_button.setText("Show less")
        return self.full_view

    def _close_full_view(self) -> None:
        if self.full_view is not None:
            self.full_view.setParent(None)
            self.full_view.deleteLater()
            self.full_view = None


def _head(segments: list[tuple[str, str]], limit: int) -> list[tuple[str, str]]:
    """The segments that make up the first `limit` characters."""
    head, left = [], limit
    for text, source in segments:
        if left <= 0:
            break
        head.append((text[:left], source))
        left -= len(text)
    return head


def _count(value) -> int:
    """A page or token count from a stored row, or 0 if it is not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _finish_note(reason: str | None) -> str:
    return {
        "cancelled": "stopped",
        "length": "max tokens reached",
        "context": "context full",
        "interrupted": "interrupted (the app closed mid-answer)",
        "error": "failed",
    }.get(reason or "", "")


class ChatView(QScrollArea):
    edit_submitted = Signal(int, str)  # index, new content
    version_requested = Signal(int)  # -1 older, +1 newer answer
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
        self._dirty = None  # a streaming bubble about to be deleted: the render timer must not draw it
        for widget in self.messages:
            widget.setParent(None)
            widget.deleteLater()
        self.messages = []

    def add_message(
        self,
        role: str,
        text: str = "",
        finish_reason: str | None = None,
        coverage: dict | None = None,
        documents: dict | None = None,
    ) -> MessageWidget:
        widget = MessageWidget(len(self.messages), role, text, finish_reason, documents=documents)
        widget.set_coverage(coverage)
        widget.tint_draft = self.tint_draft
        widget.copy_requested.connect(lambda t: QGuiApplication.clipboard().setText(t))
        widget.edit_requested.connect(lambda index: self.messages[index].start_editing())
        widget.edit_submitted.connect(self.edit_submitted.emit)
        widget.version_requested.connect(self.version_requested.emit)
        widget.regenerate_requested.connect(self.regenerate_requested.emit)
        widget.read_all_requested.connect(self.read_all_requested.emit)
        self.column.insertWidget(self.column.count() - 1, widget)
        self.messages.append(widget)
        QTimer.singleShot(0, self._scroll_to_end)
        return widget

    def focus_versions(self, step: int) -> None:
        """After paging, focus the last answer's pager (the bubble that had it was rebuilt, and
        Qt gave the focus to the next widget in line: the search box): the same arrow while there
        are more that way, else the other, else the chat itself."""
        last = self.messages[-1] if self.messages else None
        buttons = (last.older, last.newer) if last is not None and last.role == "assistant" else ()
        if step > 0:
            buttons = buttons[::-1]
        target = next((b for b in buttons if not b.isHidden() and b.isEnabled()), self)  # shown at the next paint
        target.setFocus(Qt.OtherFocusReason)

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
