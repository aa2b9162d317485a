"""Ctrl+Z brings a deleted chat back whole, and an unused "New chat" is not kept (issue 58),
driven through the real window's keys and checked in the database."""

import sqlite3

from PySide6.QtCore import Qt

from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import ConversationEvent, DocumentChecked
from brisk.engine.turn.documents import Document, Fit


def active(qtbot, w):
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)  # window shortcuts and focus need the active window


def chat(qtbot, w, engine, question, answer="Sure."):
    """A new chat (Ctrl+N) with one turn; returns its id."""
    qtbot.keyClick(w.composer.edit, Qt.Key_N, Qt.ControlModifier)
    w.composer.edit.setPlainText(question)
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    cid = w.controller.current
    engine.play(ConversationEvent(cid, TurnFinished(answer, [1], TurnMetrics(finish_reason="stop"))))
    return cid


def rows(db_path, sql, *args):
    with sqlite3.connect(db_path) as db:
        return db.execute(sql, args).fetchall()


def select(qtbot, w, cid):
    """Click the chat in the sidebar, as a user does."""
    row = next(i for i in range(w.sidebar.list.count()) if w.sidebar.list.item(i).data(Qt.UserRole) == cid)
    rect = w.sidebar.list.visualItemRect(w.sidebar.list.item(row))
    qtbot.mouseClick(w.sidebar.list.viewport(), Qt.LeftButton, pos=rect.center())


def test_ctrl_z_restores_a_deleted_chat_whole_in_the_database_and_the_sidebar(qtbot, make_window, engine, db_path):
    w = make_window()
    active(qtbot, w)
    rivers = chat(qtbot, w, engine, "about rivers", "The Vistula.")
    w.controller.regenerate()  # a second version, kept beside the shown one
    engine.play(ConversationEvent(rivers, TurnFinished("The Danube.", [1], TurnMetrics(finish_reason="stop"))))
    w.store.add_attachment(rivers, "notes.txt", "text", 3, "river notes")
    before = {
        table: rows(db_path, f"SELECT * FROM {table} WHERE conversation_id = ?", rivers)
        for table in ("messages", "answer_versions", "attachments")
    }
    assert all(before.values())
    select(qtbot, w, rivers)
    w.sidebar.list.setFocus()
    qtbot.keyClick(w.sidebar.list, Qt.Key_Delete)  # the Delete key on the chosen chat
    assert "about rivers" not in w.sidebar.titles() and w.controller.current is None
    chat(qtbot, w, engine, "about mountains")  # something else first: Ctrl+Z still restores
    qtbot.keyClick(w.sidebar.list, Qt.Key_Z, Qt.ControlModifier)
    assert w.controller.current == rivers and "about rivers" in w.sidebar.titles()
    assert w.sidebar.list.currentItem().data(Qt.UserRole) == rivers  # highlighted and open
    assert [m.text for m in w.chat_view.messages] == ["about rivers", "The Danube."]
    assert w.chat_view.messages[-1].version_label.text() == "2/2"
    after = {
        table: rows(db_path, f"SELECT * FROM {table} WHERE conversation_id = ?", rivers)
        for table in ("messages", "answer_versions", "attachments")
    }
    assert after == before and rows(db_path, "SELECT deleted FROM conversations WHERE id = ?", rivers) == [(0,)]


def test_ctrl_z_undoes_several_deletes_last_first_and_then_says_nothing_is_left(qtbot, make_window, engine):
    w = make_window()
    active(qtbot, w)
    first, second = chat(qtbot, w, engine, "first chat"), chat(qtbot, w, engine, "second chat")
    w.sidebar.delete_requested.emit(first)
    w.sidebar.delete_requested.emit(second)
    assert w.sidebar.titles() == []
    qtbot.keyClick(w.sidebar.list, Qt.Key_Z, Qt.ControlModifier)
    assert w.sidebar.titles() == ["second chat"]
    qtbot.keyClick(w.sidebar.list, Qt.Key_Z, Qt.ControlModifier)
    assert sorted(w.sidebar.titles()) == ["first chat", "second chat"] and w.controller.current == first
    qtbot.keyClick(w.sidebar.list, Qt.Key_Z, Qt.ControlModifier)
    assert w.statusBar().currentMessage() == "Nothing to undo"


def test_ctrl_z_in_the_message_box_undoes_typing_not_a_delete(qtbot, make_window, engine):
    w = make_window()
    active(qtbot, w)
    gone = chat(qtbot, w, engine, "to delete")
    w.sidebar.delete_requested.emit(gone)
    w.composer.edit.setFocus()
    qtbot.keyClicks(w.composer.edit, "draft")
    qtbot.keyClick(w.composer.edit, Qt.Key_Z, Qt.ControlModifier)
    assert w.composer.edit.toPlainText() == "" and "to delete" not in w.sidebar.titles()


def test_new_chat_pressed_again_makes_no_second_empty_chat(qtbot, make_window, engine, db_path):
    w = make_window()
    active(qtbot, w)
    for _ in range(5):
        qtbot.keyClick(w.composer.edit, Qt.Key_N, Qt.ControlModifier)
    assert rows(db_path, "SELECT COUNT(*) FROM conversations") == [(1,)] and w.sidebar.titles() == ["New chat"]


def test_an_unused_new_chat_is_dropped_when_the_user_leaves_it(qtbot, make_window, engine, db_path):
    w = make_window()
    active(qtbot, w)
    kept = chat(qtbot, w, engine, "about rivers")
    qtbot.keyClick(w.composer.edit, Qt.Key_N, Qt.ControlModifier)
    empty = w.controller.current
    assert empty != kept and "New chat" in w.sidebar.titles()
    select(qtbot, w, kept)
    qtbot.waitUntil(lambda: w.sidebar.titles() == ["about rivers"])
    assert w.controller.current == kept and rows(db_path, "SELECT id FROM conversations") == [(kept,)]


def test_a_new_chat_with_a_document_waiting_is_kept_while_the_user_looks_elsewhere(qtbot, make_window, engine):
    w = make_window()
    active(qtbot, w)
    kept = chat(qtbot, w, engine, "about rivers")
    qtbot.keyClick(w.composer.edit, Qt.Key_N, Qt.ControlModifier)
    waiting = w.controller.current
    engine.play(DocumentChecked(waiting, Document("plan.txt", "text", "the plan", 8), Fit(3, 10, 8192, 0, 0, True)))
    select(qtbot, w, kept)
    qtbot.wait(10)
    select(qtbot, w, waiting)
    assert w.controller.current == waiting and [c.name for c in w.composer.attachments] == ["plan.txt"]


def test_quitting_on_an_unused_new_chat_leaves_no_empty_chat(qtbot, make_window, engine, db_path):
    w = make_window()
    active(qtbot, w)
    chat(qtbot, w, engine, "about rivers")
    qtbot.keyClick(w.composer.edit, Qt.Key_N, Qt.ControlModifier)
    w.close()
    assert rows(db_path, "SELECT title FROM conversations") == [("about rivers",)]


def test_empty_chats_left_by_an_earlier_brisk_are_dropped_at_start(qtbot, make_window, db_path):
    from brisk.app.store import Store

    store = Store(db_path)
    real = store.create_conversation("about rivers", {})
    store.add_message(real, "user", "hello")
    for _ in range(4):
        store.create_conversation("New chat", {})
    store.close()
    w = make_window()
    assert w.sidebar.titles() == ["about rivers"] and w.controller.current == real
    assert rows(db_path, "SELECT id FROM conversations") == [(real,)]
