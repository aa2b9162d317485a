"""A long message in full, as plain text, one part at a time.

Putting a whole 50 MB message into one text document took Qt 16 s of building blocks
before anything showed (and a bubble laid out whole kept the window from opening), so the
view holds PART_CHARS characters at a time with Previous and Next to move through them."""

from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

# About 0.15 s for Qt to take in: the most a click in this view costs.
PART_CHARS = 500_000
# A line is laid out whole, so a longer one is cut for display (a 50 MB single line).
LINE_CHARS = 10_000
VIEW_HEIGHT = 480


def break_long_lines(text: str, width: int = LINE_CHARS) -> str:
    """`text` with every line longer than `width` cut into lines of `width` (for display only:
    Copy, export and the store keep the text as it is)."""
    if "\n" not in text and len(text) <= width:
        return text
    lines = []
    for line in text.split("\n"):
        lines.extend([line[at : at + width] for at in range(0, len(line), width)] or [""])
    return "\n".join(lines)


class FullTextView(QWidget):
    """A read-only plain-text view of `text` that lays out only what it shows: one part of
    PART_CHARS characters, and of that only the lines on screen."""

    def __init__(self, text: str, parent=None, *, height: int | None = VIEW_HEIGHT):
        """`height`: fixed inside a bubble (the chat scrolls, not the bubble); None in a dialog."""
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        if height is not None:
            self.view.setFixedHeight(height)
        layout.addWidget(self.view)
        pager = QHBoxLayout()
        self.previous = QPushButton("Previous part")
        self.previous.clicked.connect(lambda: self.show_part(self.part - 1))
        self.next = QPushButton("Next part")
        self.next.clicked.connect(lambda: self.show_part(self.part + 1))
        self.where = QLabel("")
        for w in (self.previous, self.where, self.next):
            pager.addWidget(w)
        pager.addStretch()
        self.pager = QWidget()
        self.pager.setLayout(pager)
        layout.addWidget(self.pager)
        self.text, self.part, self._shown = text, 0, ("", -1)
        self.show_part(0)

    @property
    def parts(self) -> int:
        return max(1, -(-len(self.text) // PART_CHARS))

    def set_text(self, text: str) -> None:
        """The message grew (a streaming answer): the part on screen is redone only if it changed."""
        self.text = text
        self.show_part(self.part)

    def show_part(self, part: int) -> None:
        self.part = min(max(part, 0), self.parts - 1)
        start = self.part * PART_CHARS
        piece = self.text[start : start + PART_CHARS]
        if (piece, self.part) != self._shown:
            self._shown = (piece, self.part)
            self.view.setPlainText(break_long_lines(piece))
        self.pager.setVisible(self.parts > 1)
        span = f"characters {start + 1:,}–{start + len(piece):,} of {len(self.text):,}"
        self.where.setText(f"Part {self.part + 1} of {self.parts}: {span}")
        self.previous.setEnabled(self.part > 0)
        self.next.setEnabled(self.part < self.parts - 1)
