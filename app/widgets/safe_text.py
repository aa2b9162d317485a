"""Showing text that came from a user, a model, a file or a database row without letting
Qt act on it: no file, device or network read while rendering, links opened only on a
click and only for http(s), labels and tooltips that never turn into rich text.

Qt reads resources synchronously while it lays out rich text: `![x](/dev/zero)` grew the
app to 5 GB, a FIFO path hung it, and a `file:` link showed /etc/passwd in a bubble.
"""

from __future__ import annotations

from PySide6 import QtGui
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QImage, QTextDocument
from PySide6.QtWidgets import QLabel

# Markdown as GitHub writes it, but raw HTML stays text: a message is never markup.
MARKDOWN_FEATURES = QTextDocument.MarkdownDialectGitHub | QTextDocument.MarkdownNoHTML
LINK_SCHEMES = ("http", "https")


def _placeholder() -> QImage:
    image = QImage(1, 1, QImage.Format_ARGB32)
    image.fill(0)  # transparent
    return image


class SafeDocument(QTextDocument):
    """A document that loads nothing: every image is a 1x1 transparent placeholder and every
    other resource (stylesheet, page) is empty, whatever its scheme or path.

    An image must not come back empty: Qt's image handler then opens the path itself."""

    PLACEHOLDER = None  # made on first use: a QImage needs the QGuiApplication

    def __init__(self, parent=None):
        super().__init__(parent)
        self.refused: list[str] = []  # the urls asked for, for tests and debugging

    def loadResource(self, kind: int, url: QUrl):
        self.refused.append(url.toString())
        del self.refused[:-16]  # a message with a million images keeps only the last few
        if kind == QTextDocument.ImageResource:
            if SafeDocument.PLACEHOLDER is None:
                SafeDocument.PLACEHOLDER = _placeholder()
            return SafeDocument.PLACEHOLDER
        return ""


def is_openable_link(url: QUrl) -> bool:
    """Only web pages leave the app: not file:, qrc:, data:, javascript: or a relative path."""
    return url.isValid() and url.scheme().lower() in LINK_SCHEMES and bool(url.host())


def open_link(url: QUrl) -> bool:
    """Open a clicked link in the browser if it is a web page; anything else is ignored."""
    if not is_openable_link(url):
        return False
    return QDesktopServices.openUrl(url)


def plain_label(text: str = "") -> QLabel:
    """A label that shows its text as typed: QLabel's default AutoText renders anything that
    looks like HTML (an `<img src=/dev/zero>` file name) as rich text."""
    label = QLabel(text)
    label.setTextFormat(Qt.PlainText)
    return label


def plain_tooltip(text: str) -> str:
    """A tooltip that shows `text` as typed: Qt renders a tooltip that looks like HTML as rich
    text, so such a text is escaped (plain-looking text is kept as it is)."""
    # QtGui's Qt namespace has these two; QtCore's does not.
    return QtGui.Qt.convertFromPlainText(text) if QtGui.Qt.mightBeRichText(text) else text
