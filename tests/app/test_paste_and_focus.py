"""A pasted run without spaces (a base64 blob) is wrapped in linear time, and the message box
has the keyboard at launch.

Qt's default wrap looks for a word boundary across the rest of the run for every line it
breaks: one 300,000-character run took ~65 CPU-s to lay out in the composer (a frozen window).
Such text wraps anywhere (app/widgets/text_wrap.py); what is checked is the mode each widget
lays the text out with, as timing is not a test's to bound."""

import base64
import os

from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QApplication

from brisk.app.widgets.text_wrap import LONG_RUN_CHARS
from brisk.engine.host.worker import Answer

BLOB = base64.b64encode(os.urandom(225_000)).decode()  # 300,000 characters, no space or newline
WORDS = QTextOption.WrapAtWordBoundaryOrAnywhere
ANYWHERE = QTextOption.WrapAnywhere


def modes_laid_out(edit) -> list:
    """The wrap mode in force each time the box's document is laid out afresh."""
    seen = []
    edit.document().documentLayout().documentSizeChanged.connect(lambda _: seen.append(edit.wordWrapMode()))
    return seen


def test_a_pasted_blob_is_laid_out_wrapping_anywhere_and_prose_again_at_words(qtbot, make_window):
    w = make_window()
    edit = w.composer.edit
    seen = modes_laid_out(edit)
    QApplication.clipboard().setText(BLOB)
    edit.paste()
    assert edit.toPlainText() == BLOB
    assert seen and set(seen) == {ANYWHERE}  # never laid out with the quadratic word search
    edit.clear()
    assert edit.wordWrapMode() == WORDS
    edit.setPlainText("a short question about " + "words " * 300)
    assert edit.wordWrapMode() == WORDS  # prose keeps its word wrap
    edit.setPlainText("x" * (LONG_RUN_CHARS - 1) + " y")
    assert edit.wordWrapMode() == WORDS


def test_a_refused_blob_stays_in_the_box(qtbot, make_window, engine):
    """The test that typed 'x' * 300,000 before commit 00f1b5c, with the blob: still refused."""
    w = make_window()
    pages = w.store.db.execute("PRAGMA page_count").fetchone()[0]
    w.store.db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
    seen = modes_laid_out(w.composer.edit)
    w.composer.edit.setPlainText(BLOB)
    w.composer.send_button.click()
    assert w.composer.edit.toPlainText() == BLOB
    assert "disk is full" in w.composer.message.text()
    assert not [c for c in engine.commands if isinstance(c, Answer)]
    assert set(seen) == {ANYWHERE}


def test_a_sent_blob_shows_in_a_bubble_wrapping_anywhere(qtbot, make_window, engine):
    w = make_window()
    w.composer.edit.setPlainText(BLOB)
    w.composer.send_button.click()
    bubble = w.chat_view.messages[-2]  # the user's, then the answer's
    assert bubble.text == BLOB
    assert bubble.body.wordWrapMode() == ANYWHERE
    assert bubble.start_editing().wordWrapMode() == ANYWHERE


def test_the_message_box_has_the_keyboard_at_launch(qtbot, make_window):
    w = make_window()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is not None)
    assert QApplication.focusWidget() is w.composer.edit
    qtbot.keyClicks(QApplication.focusWidget(), "hello")
    assert w.composer.edit.toPlainText() == "hello"
    assert w.sidebar.search.text() == ""
