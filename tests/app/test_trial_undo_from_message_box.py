"""Ctrl+Z restores a deleted chat while the message box has the focus (where it is nearly
always): the box took every Ctrl+Z as its own text undo, with nothing to undo (a real X
server trial, 2026-11-27). With typing to undo, Ctrl+Z still undoes the typing first."""

from PySide6.QtCore import Qt

from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import ConversationEvent


def test_ctrl_z_in_the_message_box_brings_a_deleted_chat_back_after_undoing_typing(qtbot, make_window, engine):
    w = make_window()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    edit = w.composer.edit
    edit.setPlainText("about rivers")
    qtbot.keyClick(edit, Qt.Key_Return)
    rivers = w.controller.current
    engine.play(ConversationEvent(rivers, TurnFinished("The Vistula.", [1], TurnMetrics(finish_reason="stop"))))
    w.sidebar.list.setFocus()
    qtbot.keyClick(w.sidebar.list, Qt.Key_Delete)
    assert "about rivers" not in w.sidebar.titles()
    edit.setFocus()
    qtbot.keyClicks(edit, "x")
    qtbot.keyClick(edit, Qt.Key_Z, Qt.ControlModifier)  # first the typing
    assert edit.toPlainText() == "" and "about rivers" not in w.sidebar.titles()
    qtbot.keyClick(edit, Qt.Key_Z, Qt.ControlModifier)  # then the delete
    assert "about rivers" in w.sidebar.titles() and w.controller.current == rivers
