"""Issue 58, found in a by-hand pass under Xvfb + openbox (2026-11-27): what the real app
showed that the earlier tests did not pin."""

from brisk.engine.api.events import TokenEmitted
from brisk.engine.host.worker import ConversationEvent
from tests.app.test_window import send


def test_the_model_line_stops_saying_loading_once_the_answer_streams(qtbot, make_window, engine):
    """A Qwen chat whose model the engine already held (a document's fit check had loaded
    it): 'Loading qwen… for this message…' stayed beside the streaming answer until the turn
    ended. The first token came from that model, so it is loaded."""
    w = make_window()
    qwen = w.store.create_conversation("qwen chat", {"model": "tiny"})
    w.controller.open(qwen)
    cid = send(qtbot, w).conversation_id
    assert w.dashboard.model_state.text() == "Loading tiny for this message…"
    engine.play(ConversationEvent(cid, TokenEmitted("Hel", 1)))
    assert "Loading" not in w.dashboard.model_state.text()
    assert w.dashboard.model_state.text().startswith("tiny loaded")


def _answered(qtbot, w, engine, coverage=None):
    from tests.app.test_window import answer, metrics

    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)  # focus exists only in the active window
    cid = send(qtbot, w, "Where is the spare key?").conversation_id
    extra = dict(prefill_method="uniprefill", coverage=coverage) if coverage else {}
    answer(engine, cid, ["Under the lantern."], metrics(**extra))
    return cid


def _click_with_focus(qtbot, button):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    button.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is button)
    qtbot.mouseClick(button, Qt.LeftButton)


def test_regenerate_keeps_the_focus_off_the_search_box(qtbot, make_window, engine):
    """Clicking Regenerate rebuilt the chat and Qt gave the focus to the next widget in line,
    the sidebar's search box: the next keys typed filtered the chats away (as paging did)."""
    from PySide6.QtWidgets import QApplication

    w = make_window()
    _answered(qtbot, w, engine)
    _click_with_focus(qtbot, w.chat_view.messages[-1].regenerate_button)
    assert QApplication.focusWidget() is not w.sidebar.search
    assert w.chat_view.isAncestorOf(QApplication.focusWidget()) or QApplication.focusWidget() is w.chat_view


def test_read_it_all_keeps_the_focus_off_the_search_box(qtbot, make_window, engine):
    """The same through the coverage footer's 'Read it all' (seen under Xvfb + openbox: after it,
    the search box held the text cursor)."""
    from PySide6.QtWidgets import QApplication

    from tests.app.test_coverage_warning import KEPT

    w = make_window()
    _answered(qtbot, w, engine, coverage=KEPT)
    cover = w.chat_view.messages[-1].coverage
    button = cover.answer_again or cover.read_all
    _click_with_focus(qtbot, button)
    assert QApplication.focusWidget() is not w.sidebar.search
    assert w.chat_view.isAncestorOf(QApplication.focusWidget()) or QApplication.focusWidget() is w.chat_view


def test_send_waits_for_a_document_still_being_read(qtbot, make_window, engine):
    """Seen under Xvfb: attach doc4k.txt while the engine was busy ('Reading the document…'),
    press Send: the question went without it, the model answered from nothing, and the chip
    came after, waiting to go with the next message. Send is refused until the chip shows;
    the typed question stays in the box."""
    from brisk.engine.host.worker import Answer, CheckDocument, DocumentChecked
    from brisk.engine.turn.documents import Document, Fit

    w = make_window()
    w.composer.attach_requested.emit("/tmp/doc4k.txt")
    check = engine.commands[-1]
    assert isinstance(check, CheckDocument)
    count = len(engine.commands)
    w.composer.edit.setPlainText("Where is the spare key?")
    from PySide6.QtCore import Qt

    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    assert len(engine.commands) == count  # nothing sent without the document
    assert "doc4k.txt" in w.composer.message.text() and w.composer.edit.toPlainText() == "Where is the spare key?"
    document = Document("doc4k.txt", "text", "The spare key is under the lantern.", 8)
    engine.play(DocumentChecked(check.conversation_id, document, Fit(9, 40, 8192, 0, 0, True)))
    command = send(qtbot, w, "Where is the spare key?")
    assert isinstance(command, Answer) and "under the lantern" in command.messages[-1].content


def test_a_document_that_cannot_be_read_does_not_hold_send(qtbot, make_window, engine):
    from brisk.engine.api.events import EngineErrored
    from brisk.engine.host.worker import Answer

    w = make_window()
    w.composer.attach_requested.emit("/tmp/missing.pdf")
    cid = engine.commands[-1].conversation_id
    engine.play(ConversationEvent(cid, EngineErrored("Cannot read missing.pdf: no such file", "document")))
    assert isinstance(send(qtbot, w, "Hello"), Answer)


def test_a_chat_opened_while_its_model_loads_says_it_is_loading(qtbot, make_window, engine):
    """Just after launch (the app loads the default model first), Ctrl+N's chat said 'big loads
    at this chat's next message' while that very load ran (seen under Xvfb). A load that fails
    leaves no 'Loading' line behind."""
    from brisk.engine.api.events import EngineErrored, ModelLoaded

    w = make_window()
    w.controller.load_model("big")
    w.controller.open(w.store.create_conversation("rivers", {"model": "big"}))
    assert w.dashboard.model_state.text() == "Loading big…"
    engine.play(ModelLoaded("big", {"architecture": "llama", "context_length": 9030}))
    assert w.dashboard.model_state.text().startswith("big loaded")
    w.controller.load_model("tiny")
    engine.play(EngineErrored("Model load failed: no such model", "model"))
    qwen = w.store.create_conversation("qwen chat", {"model": "tiny"})
    w.controller.open(qwen)
    assert "Loading" not in w.dashboard.model_state.text()
