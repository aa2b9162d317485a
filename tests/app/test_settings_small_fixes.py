"""Issue 58's smaller items, through the real widgets: the attachment chip says what its
message says, and paging answer versions keeps the focus on the chat."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import ConversationEvent, DocumentChecked
from brisk.engine.turn.documents import Document, check_fit


class CountingTokenizer:
    """One token per character (what check_fit counts with)."""

    chat_template = None

    def encode(self, text, **_):
        return list(range(len(text)))


class TinyModel:
    id, context_length, path = "tiny", 2048, None
    config = {"num_hidden_layers": 2}
    tokenizer = CountingTokenizer()


def test_a_document_past_the_context_says_more_than_on_its_chip_as_in_its_message(qtbot, make_window, engine):
    """The chip said '14,352 tokens' where its message said 'more than 14,352 tokens'."""
    w = make_window()
    cid = w.controller.current
    doc = Document("novel.txt", "text", "word " * 20_000, 100_000)
    fit = check_fit(TinyModel(), [], doc, ChatSettings(model="tiny"), memory_available=2**30)
    assert not fit.fits and "is more than" in fit.reason  # counting stopped past the context
    engine.play(DocumentChecked(cid, doc, fit))
    chip = w.composer.attachments[0].label.text()
    count = f"{fit.tokens:,}"
    assert f"more than {count} tokens" in chip and f"more than {count} tokens" in w.composer.message.text()


def test_a_document_counted_in_full_shows_its_exact_count(qtbot, make_window, engine):
    w = make_window()
    doc = Document("note.txt", "text", "short note", 10)
    fit = check_fit(TinyModel(), [], doc, ChatSettings(model="tiny"), memory_available=2**30)
    assert fit.fits and fit.tokens_exact
    engine.play(DocumentChecked(w.controller.current, doc, fit))
    assert w.composer.attachments[0].label.text() == f"note.txt · {fit.tokens:,} tokens · fits"


def _answered_twice(qtbot, w, engine):
    w.composer.edit.setPlainText("Name a river")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    cid = w.controller.current
    engine.play(ConversationEvent(cid, TurnFinished("Vistula.", [1], TurnMetrics(finish_reason="stop"))))
    w.controller.regenerate()
    engine.play(ConversationEvent(cid, TurnFinished("Danube.", [1], TurnMetrics(finish_reason="stop"))))
    return cid


def test_paging_answer_versions_keeps_the_focus_on_the_chat(qtbot, make_window, engine):
    """Clicking '<' rebuilt the bubble and Qt gave the focus to the search box."""
    w = make_window()
    _answered_twice(qtbot, w, engine)
    last = w.chat_view.messages[-1]
    assert last.version_label.text() == "2/2"
    qtbot.waitUntil(last.older.isVisible)
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)  # focus exists only in the active window
    last.older.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is last.older)
    qtbot.mouseClick(last.older, Qt.LeftButton)
    shown = w.chat_view.messages[-1]
    assert shown.text == "Vistula." and shown.version_label.text() == "1/2"
    focus = QApplication.focusWidget()
    assert focus is not w.sidebar.search and focus is shown.newer  # '<' is spent: '>' pages back
    qtbot.keyClick(focus, Qt.Key_Space)  # the keyboard pages on from where the focus stayed
    assert w.chat_view.messages[-1].text == "Danube." and QApplication.focusWidget() is w.chat_view.messages[-1].older
