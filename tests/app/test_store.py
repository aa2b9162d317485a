"""The SQLite store: migrations, unreadable databases kept aside, answers surviving a kill."""

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from brisk.app.store import Store, StoreUnavailable
from brisk.app.store_opening import SCHEMA_VERSION


def test_fresh_store_has_the_schema_and_wal(tmp_path):
    store = Store(tmp_path / "b.db")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.recovery_note == ""


def test_corrupt_database_is_kept_and_reported(tmp_path, qtbot, make_window):
    path = tmp_path / "b.db"
    garbage = b"this is not a database at all" * 100
    path.write_bytes(garbage)
    window = make_window(path)
    assert "could not be opened" in window.store.recovery_note
    backups = list(tmp_path.glob("b.db.unreadable-*"))
    assert len(backups) == 1 and backups[0].read_bytes() == garbage
    assert "kept as" in window.statusBar().currentMessage()
    assert window.store.conversations()  # a fresh database, with the new chat in it


def test_database_from_a_newer_brisk_is_not_touched(tmp_path):
    path = tmp_path / "b.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE future (x)")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    original = path.read_bytes()
    with pytest.raises(StoreUnavailable, match="newer Brisk"):
        Store(path)
    assert path.read_bytes() == original and not list(tmp_path.glob("b.db.unreadable-*"))


def test_killed_mid_answer_keeps_the_streamed_text(tmp_path):
    """A real process streams an answer into the store and is SIGKILLed mid-answer."""
    path = tmp_path / "b.db"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).resolve().parents[2])!r})
        from brisk.app.store import Store
        s = Store({str(path)!r})
        cid = s.create_conversation("chat", {{}})
        s.add_message(cid, "user", "tell me a story")
        s.add_message(cid, "assistant", "an earlier, finished answer", finish_reason="stop")
        s.add_message(cid, "user", "another")
        mid = s.begin_answer(cid)
        s.set_content(mid, "Once upon a time")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9, proc.stderr
    store = Store(path)
    (conv,) = store.conversations()
    messages = store.messages(conv.id)
    assert [(m.role, m.content, m.finish_reason) for m in messages] == [
        ("user", "tell me a story", None),
        ("assistant", "an earlier, finished answer", "stop"),
        ("user", "another", None),
        ("assistant", "Once upon a time", "interrupted"),
    ]


def test_streaming_answer_is_saved_while_it_streams(qtbot, make_window, engine, monkeypatch):
    from brisk.engine.api.events import TokenEmitted
    from brisk.engine.host.worker import ConversationEvent

    monkeypatch.setattr("brisk.app.chat_turns.SAVE_INTERVAL_S", 0.0)
    w = make_window()
    w.composer.edit.setPlainText("hi")
    w.composer.send_button.click()
    cid = w.controller.current
    engine.play(ConversationEvent(cid, TokenEmitted("Part", 1)), ConversationEvent(cid, TokenEmitted("ial", 2)))
    fresh = Store(w.store.path)  # what another process (or a restart after a kill) sees
    assert fresh.messages(cid)[-1].content == "Partial"
