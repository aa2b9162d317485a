"""Ctrl+N (or New) with a search in the sidebar's box: the new chat, and the chat it becomes
once a message is sent, were hidden by the filter, with nothing highlighted (a real X server
trial, 2026-11-27). Starting a chat clears the search."""

from PySide6.QtCore import Qt

from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import ConversationEvent


def test_a_new_chat_clears_the_search_and_is_listed_and_highlighted(qtbot, make_window, engine):
    w = make_window()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    w.composer.edit.setPlainText("What is the capital of France?")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    first = w.controller.current
    engine.play(ConversationEvent(first, TurnFinished("Paris.", [1], TurnMetrics(finish_reason="stop"))))
    qtbot.keyClicks(w.sidebar.search, "France")
    qtbot.keyClick(w.sidebar.search, Qt.Key_N, Qt.ControlModifier)
    assert w.sidebar.search.text() == ""
    w.composer.edit.setPlainText("zebra facts")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    assert w.controller.current != first
    assert w.sidebar.list.currentItem() is not None
    assert w.sidebar.list.currentItem().text() == "zebra facts"
    qtbot.keyClicks(w.sidebar.search, "zzz")
    qtbot.mouseClick(w.sidebar.new_button, Qt.LeftButton)
    assert w.sidebar.search.text() == ""


def test_ctrl_n_after_a_delete_hides_the_undo_button_as_new_does(qtbot, make_window, engine):
    w = make_window()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    w.composer.edit.setPlainText("about rivers")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    cid = w.controller.current
    engine.play(ConversationEvent(cid, TurnFinished("The Vistula.", [1], TurnMetrics(finish_reason="stop"))))
    w.sidebar.list.setFocus()
    qtbot.keyClick(w.sidebar.list, Qt.Key_Delete)
    assert w.undo_button.isVisibleTo(w)
    qtbot.keyClick(w.composer.edit, Qt.Key_N, Qt.ControlModifier)
    assert not w.undo_button.isVisibleTo(w)
    qtbot.keyClick(w.composer.edit, Qt.Key_Z, Qt.ControlModifier)  # Ctrl+Z still restores
    assert "about rivers" in w.sidebar.titles()
