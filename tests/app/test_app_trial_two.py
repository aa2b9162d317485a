"""Inputs from the second adversarial trial of the app (issue 54): each built here, each
handled without a hang, a traceback, a rendered file or lost text."""

import os
import sqlite3

import pytest
from PySide6.QtCore import Qt

from brisk.app.chat_files import MAX_IMPORT_MESSAGES, read_export, write_export
from brisk.app.store import Store, StoreError, StoreUnavailable
from brisk.engine.api.events import TokenEmitted
from brisk.engine.host.worker import ConversationEvent
from tests.app.test_window import answer, send


def _fifo(tmp_path):
    path = tmp_path / "pipe.json"
    os.mkfifo(path)
    return path


def test_a_note_on_a_damaged_row_is_shown_as_text_not_rendered(qtbot, make_window, db_path, tmp_path):
    """The note quotes the stored value: '<img src=...>' in a finish_reason drew a local file
    in the tooltip (a FIFO there hung the app)."""
    w = make_window()
    cid = send(qtbot, w, "hi").conversation_id
    answer(w.controller.engine, cid, ["hello"])
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE messages SET finish_reason = ? WHERE role = 'assistant'", ("<img src=/p.png>",))
    w.controller.open(cid)
    tips = [m.toolTip() for m in w.chat_view.messages if m.toolTip()]
    assert tips and all("&lt;img" in tip and "<img" not in tip for tip in tips)


def test_switching_chats_while_an_answer_streams_draws_nothing_deleted(qtbot, make_window, engine):
    """The render timer drew the streaming bubble after the chat view had deleted it: a
    RuntimeError in the timer's slot (pytest-qt fails the test on an exception in a slot)."""
    w = make_window()
    cid = send(qtbot, w, "tell me").conversation_id
    engine.play(ConversationEvent(cid, TokenEmitted("Once upon", 1)))
    w.controller.new_conversation()  # the view is cleared while the answer still streams
    qtbot.wait(300)  # the render timer fires, and the deleted bubble is gone
    assert w.chat_view.messages == []


def test_importing_a_pipe_or_a_device_is_refused_not_waited_on(tmp_path):
    with pytest.raises(StoreError, match="not a regular file"):
        read_export(_fifo(tmp_path))  # no writer: a blocking open or read never returns
    with pytest.raises(StoreError, match="not a regular file"):
        read_export("/dev/zero")  # read to its end: memory without limit
    with pytest.raises(StoreError, match="not a regular file"):
        read_export(tmp_path)


def test_exporting_onto_a_pipe_or_a_folder_is_refused_and_a_file_appears_whole(tmp_path):
    with pytest.raises(StoreError, match="not a regular file"):
        write_export(_fifo(tmp_path), "{}")
    with pytest.raises(StoreError, match="not a regular file"):
        write_export(tmp_path, "{}")
    with pytest.raises(StoreError):
        write_export(tmp_path / "missing" / "chat.json", "{}")
    target = tmp_path / "chat.json"
    target.write_text("old")
    write_export(target, '{"new": true}')
    assert target.read_text() == '{"new": true}' and [p.name for p in tmp_path.iterdir() if ".part" in p.name] == []


def test_the_window_reports_an_export_it_cannot_write_in_the_status_bar(qtbot, make_window, tmp_path):
    w = make_window()
    send(qtbot, w, "hi")
    w.export("json", str(tmp_path))  # a folder: IsADirectoryError escaped before
    assert "Cannot export" in w.statusBar().currentMessage()


def test_a_chat_too_long_to_open_is_refused_at_import(tmp_path):
    store = Store(tmp_path / "brisk.db")
    from brisk.app.chat_files import import_json

    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(MAX_IMPORT_MESSAGES + 1)]
    with pytest.raises(StoreError, match="imports at most"):
        import_json(store, {"format": "brisk-chat", "version": 1, "messages": messages})
    assert store.conversations() == []


def test_a_renamed_chats_export_imports_again(tmp_path):
    from brisk.app.chat_files import export_json, import_json

    store = Store(tmp_path / "brisk.db")
    cid = store.create_conversation("New chat", {})
    store.rename(cid, "t" * 5000)  # the rename box takes up to 32,767 characters
    again = import_json(store, export_json(store, cid))
    assert store.conversation(again).title == store.conversation(cid).title == "t" * 1000


def test_a_title_made_huge_by_hand_is_shown_cut(tmp_path):
    store = Store(tmp_path / "brisk.db")
    cid = store.create_conversation("New chat", {})
    store.close()
    with sqlite3.connect(tmp_path / "brisk.db") as db:
        db.execute("UPDATE conversations SET title = ? WHERE id = ?", ("T" * 2_000_000, cid))
    assert len(Store(tmp_path / "brisk.db").conversation(cid).title) == 1000


def test_a_trigger_that_refuses_the_start_up_repair_is_a_clear_refusal(tmp_path):
    store = Store(tmp_path / "brisk.db")
    cid = store.create_conversation("chat", {})
    store.add_message(cid, "user", "hi")
    store.begin_answer(cid)  # streaming = 1: the next start marks it interrupted
    store.close()
    with sqlite3.connect(tmp_path / "brisk.db") as db:
        db.execute("CREATE TRIGGER no BEFORE UPDATE ON messages BEGIN SELECT RAISE(ABORT, 'no'); END")
    with pytest.raises(StoreUnavailable, match="cannot be written"):
        Store(tmp_path / "brisk.db")


def test_quitting_mid_answer_keeps_what_was_shown(qtbot, make_window, engine, db_path):
    """Saves come every 0.5 s: text that arrived since the last one was lost at quit."""
    w = make_window()
    cid = send(qtbot, w, "tell me").conversation_id
    engine.play(*(ConversationEvent(cid, TokenEmitted(f"w{i} ", i)) for i in range(50)))
    w.close()
    with sqlite3.connect(db_path) as db:
        (content,) = db.execute("SELECT content FROM messages WHERE role = 'assistant'").fetchone()
    assert content == "".join(f"w{i} " for i in range(50))


def test_the_start_refusal_shows_its_path_as_typed(qtbot, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    import brisk.app.main

    shown = []
    monkeypatch.setattr(QMessageBox, "exec", lambda box: shown.append((box.textFormat(), box.text())) or 0)
    assert brisk.app.main._refuse(None, "cannot use /tmp/<img src=x.png>/brisk.db", quiet=False) == 1
    assert shown == [(Qt.PlainText, "cannot use /tmp/<img src=x.png>/brisk.db")]


@pytest.mark.parametrize("column", ["settings", "deleted"])
def test_a_column_dropped_by_hand_is_added_back_and_the_chats_open(tmp_path, column):
    """'no such column: settings' failed every start ("Starting Brisk failed unexpectedly")."""
    store = Store(tmp_path / "brisk.db")
    cid = store.create_conversation("kept chat", {})
    store.add_message(cid, "user", "still here")
    store.close()
    with sqlite3.connect(tmp_path / "brisk.db") as db:
        db.execute(f"ALTER TABLE conversations DROP COLUMN {column}")
    again = Store(tmp_path / "brisk.db")
    assert [c.title for c in again.conversations()] == ["kept chat"]
    assert [m.content for m in again.messages(cid)] == ["still here"]
    assert any(column in problem for problem in again.problems)


def test_a_dropped_column_with_no_default_moves_the_file_aside_and_keeps_it(tmp_path):
    store = Store(tmp_path / "brisk.db")
    store.create_conversation("chat", {})
    store.close()
    with sqlite3.connect(tmp_path / "brisk.db") as db:
        db.execute("ALTER TABLE conversations DROP COLUMN title")
    again = Store(tmp_path / "brisk.db")
    assert again.conversations() == [] and "kept as" in again.recovery_note
    assert [p for p in tmp_path.iterdir() if "unreadable" in p.name]
