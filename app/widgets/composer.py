"""The message composer: Enter sends, Shift+Enter breaks the line; documents attach with
their token count and whether they fit."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from brisk.app.icons import icon
from brisk.app.widgets.context_meter import ContextMeter
from brisk.app.widgets.safe_text import plain_label, plain_tooltip
from brisk.app.widgets.text_wrap import breakable, has_long_run, wrap_for

DOCUMENT_FILTER = (
    "Documents (*.txt *.md *.markdown *.pdf *.py *.js *.ts *.c *.h *.cpp *.rs *.go *.java *.json "
    "*.toml *.yaml *.yml *.html *.css *.sh);;All files (*)"
)


# The message box shows this many lines at any chat font size (View > Bigger text): a fixed
# 84 px held under two lines at the largest size.
COMPOSER_LINES = 3


class PromptEdit(QPlainTextEdit):
    """The message box. A pasted run without spaces (a base64 blob) wraps anywhere, chosen
    before Qt lays it out (app/widgets/text_wrap.py): else one such paste froze the app."""

    submitted = Signal()
    escaped = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        # Typing or deleting decides again, so prose wraps at words once the blob is gone.
        self.textChanged.connect(lambda: wrap_for(self, self.toPlainText()))

    def setPlainText(self, text: str) -> None:
        wrap_for(self, text)
        super().setPlainText(text)

    def insertFromMimeData(self, source) -> None:  # paste and drop
        if source.hasText() and has_long_run(source.text()):
            wrap_for(self, source.text())
        super().insertFromMimeData(source)

    def event(self, event) -> bool:
        # Ctrl+Z with nothing typed to undo is the window's (Undo delete chat): the box would eat it
        if (
            event.type() == QEvent.ShortcutOverride
            and event.matches(QKeySequence.Undo)
            and not self.document().isUndoAvailable()
        ):
            event.ignore()
            return False
        return super().event(event)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.FontChange, QEvent.StyleChange):  # the chat font is set by a stylesheet
            self.fit_lines()

    def fit_lines(self) -> None:
        margins = 2 * (self.frameWidth() + round(self.document().documentMargin()))
        self.setFixedHeight(max(84, COMPOSER_LINES * self.fontMetrics().lineSpacing() + margins + 4))

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not event.modifiers() & Qt.ShiftModifier:
            self.submitted.emit()
            return
        if event.key() == Qt.Key_Escape:  # the text edit keeps Esc from the window's shortcut
            self.escaped.emit()
            return
        super().keyPressEvent(event)


class AttachmentChip(QWidget):
    removed = Signal(object)

    def __init__(self, name: str, tokens: int, fits: bool, reason: str, parent=None, *, exact: bool = True):
        super().__init__(parent)
        self.name, self.tokens, self.fits = name, tokens, fits
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        note = "fits" if fits else "does not fit"
        glyph = QLabel()
        glyph.setPixmap(icon("document").pixmap(16, 16))  # an SVG: an emoji has no glyph on a bare Linux
        layout.addWidget(glyph)
        # A count that stopped past the context is a lower bound, and says so as its message does.
        count = f"{tokens:,} tokens" if exact else f"more than {tokens:,} tokens"
        self.label = plain_label(breakable(f"{name} · {count} · {note}"))  # a file name is not markup
        self.label.setWordWrap(True)  # a long name wraps rather than widening the window's middle
        self.label.setObjectName("attachmentOk" if fits else "attachmentTooBig")
        self.label.setToolTip(plain_tooltip(reason or f"{name} fits the context at this chat's KV setting"))
        layout.addWidget(self.label, 1)  # the spare width after the name, not split around it
        remove = QPushButton("✕")
        remove.setFixedWidth(28)
        remove.setToolTip("Remove this attachment")
        remove.clicked.connect(lambda: self.removed.emit(self))
        layout.addWidget(remove)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    attach_requested = Signal(str)  # a file path
    attachment_removed = Signal(int)  # the position of the chip the user removed with ✕

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.chips = QVBoxLayout()
        layout.addLayout(self.chips)
        self.message = plain_label()  # errors quote file names and their contents
        self.message.setObjectName("composerMessage")
        self.message.setWordWrap(True)
        self.message.hide()
        layout.addWidget(self.message)
        self.meter = ContextMeter()  # kept up to date by app/context_fill.py
        layout.addWidget(self.meter)
        row = QHBoxLayout()
        self.edit = PromptEdit()
        self.edit.setPlaceholderText("Message Brisk (Enter sends, Shift+Enter for a new line)")
        self.edit.fit_lines()
        self.edit.submitted.connect(self._submit)
        self.edit.escaped.connect(self.stop_requested.emit)
        row.addWidget(self.edit)
        buttons = QVBoxLayout()
        self.attach_button = QPushButton("Attach…")
        self.attach_button.clicked.connect(self._pick_file)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.clicked.connect(self._submit)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop_requested.emit)
        self.stop_button.hide()
        for b, name in ((self.attach_button, "attach"), (self.send_button, "send"), (self.stop_button, "stop")):
            b.setIcon(icon(name))
            buttons.addWidget(b)
        row.addLayout(buttons)
        layout.addLayout(row)
        self.attachments: list[AttachmentChip] = []

    def set_busy(self, busy: bool) -> None:
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)

    def show_message(self, text: str, *, error: bool = False) -> None:
        """A line above the box: a notice (muted), or an error (in the error colour)."""
        self.message.setText(breakable(text))  # a long file name wraps rather than narrowing the sidebar
        self.message.setProperty("error", error)
        self.message.style().unpolish(self.message)  # the stylesheet reads the property again
        self.message.style().polish(self.message)
        self.message.setVisible(bool(text))

    def add_attachment(
        self, name: str, tokens: int, fits: bool, reason: str = "", *, exact: bool = True
    ) -> AttachmentChip:
        chip = AttachmentChip(name, tokens, fits, reason, exact=exact)
        chip.removed.connect(self._user_removed)
        self.chips.addWidget(chip)
        self.attachments.append(chip)
        return chip

    def clear_attachments(self) -> None:
        for chip in list(self.attachments):
            self._remove_chip(chip)

    def _user_removed(self, chip) -> None:
        index = self.attachments.index(chip)
        self._remove_chip(chip)
        self.attachment_removed.emit(index)  # the controller drops the document from what is sent

    def _remove_chip(self, chip) -> None:
        self.attachments.remove(chip)
        chip.setParent(None)
        chip.deleteLater()

    def _pick_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Attach a document", "", DOCUMENT_FILTER)
        if path:
            self.attach_requested.emit(path)

    def _submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if not text and not self.attachments:
            return
        self.send_requested.emit(text)
