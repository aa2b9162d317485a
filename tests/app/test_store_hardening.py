"""The chat database under hostile conditions (issue 14): a healthy database is never
moved aside, nothing that is not Brisk's file is ever moved, one bad row never keeps the
app from starting, and a failed save loses nothing."""

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import brisk.app.store_opening as store_opening
from brisk.app.chat_files import import_json
from brisk.app.store import Store, StoreError, StoreUnavailable

ROOT = Path(__file__).resolve().parents[2]


def make_chat(store, text="hello"):
    cid = store.create_conversation("chat", {"model": "big"})
    store.add_message(cid, "user", text)
    store.add_message(cid, "assistant", "an answer", finish_reason="stop", metrics={"ttft_s": 1.0})
    return cid


# --- 4. private files ----------------------------------------------------------------------


def test_data_folder_and_database_are_private(tmp_path):
    folder = tmp_path / "home" / "Brisk"
    store = Store(folder / "brisk.db")
    make_chat(store)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in (folder / "brisk.db", folder / "brisk.db-wal"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    store.close()


def test_a_database_left_world_readable_by_an_older_brisk_is_made_private(tmp_path):
    path = tmp_path / "b.db"
    Store(path).close()
    os.chmod(path, 0o644)
    Store(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --- 5. locks are not corruption; two instances ---------------------------------------------


def test_a_locked_database_is_reported_in_use_and_never_moved_aside(tmp_path, monkeypatch):
    path = tmp_path / "b.db"
    first = Store(path)
    make_chat(first)
    first.close()
    monkeypatch.setattr(store_opening, "LOCK_TIMEOUT_S", 0.3)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import sqlite3, sys, time
        db = sqlite3.connect({str(path)!r}, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        print("locked", flush=True)
        time.sleep(5)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreUnavailable, match="in use by another program"):
            Store(path)
    finally:
        holder.kill()
        holder.wait()
    assert not list(tmp_path.glob("b.db.unreadable-*"))
    reopened = Store(path)
    assert [c.title for c in reopened.conversations()] == ["chat"]


def test_a_second_instance_opens_read_only_and_never_interrupts_the_first_ones_answer(tmp_path):
    path = tmp_path / "b.db"
    first = Store(path)
    cid = make_chat(first)
    live = first.begin_answer(cid)
    first.set_content(live, "streaming…")
    second = Store(path)
    assert second.read_only and "read-only" in second.recovery_note
    assert second.messages(cid)[-1].content == "streaming…"  # it can read
    with pytest.raises(StoreError, match="read-only"):
        second.add_message(cid, "user", "from the second window")
    row = first.db.execute("SELECT streaming, finish_reason FROM messages WHERE id = ?", (live,)).fetchone()
    assert row == (1, None)  # still the first one's live answer
    first.finish_answer(live, "done", "stop", None)
    second.close()
    first.close()


# --- 6. never move what is not Brisk's --------------------------------------------------------


def test_a_directory_as_the_database_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "my-documents"
    folder.mkdir()
    (folder / "thesis.txt").write_text("years of work")
    with pytest.raises(StoreUnavailable, match="is a folder"):
        Store(folder)
    assert (folder / "thesis.txt").read_text() == "years of work"
    assert not list(tmp_path.glob("*.unreadable-*"))


def test_a_users_non_database_file_is_never_renamed(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes, not a database")
    with pytest.raises(StoreUnavailable, match="leaves it as it is"):
        Store(notes)
    assert notes.read_text() == "my notes, not a database"


def test_a_symlink_to_a_broken_file_is_not_moved(tmp_path):
    target = tmp_path / "elsewhere.db"
    target.write_bytes(b"garbage" * 100)
    link = tmp_path / "b.db"
    link.symlink_to(target)
    with pytest.raises(StoreUnavailable):
        Store(link)
    assert link.is_symlink() and target.read_bytes() == b"garbage" * 100


# --- 7. disk full -------------------------------------------------------------------------------


def fill_disk(store):
    """A real SQLITE_FULL: no page may be added beyond what the file already has."""
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")


def test_disk_full_says_disk_full_not_cannot_rollback(tmp_path):
    store = Store(tmp_path / "b.db")
    cid = make_chat(store)
    fill_disk(store)
    with pytest.raises(StoreError, match="disk is full"):
        store.add_message(cid, "user", "x" * 200_000)
    assert not store.db.in_transaction
    assert [m.content for m in store.messages(cid)] == ["hello", "an answer"]


# --- 8. one bad row, odd versions, missing tables ------------------------------------------------


def corrupt(path, sql):
    db = sqlite3.connect(path)
    db.executescript(sql)
    db.commit()
    db.close()


def test_bad_settings_and_metrics_rows_are_skipped_and_reported(tmp_path):
    path = tmp_path / "b.db"
    store = Store(path)
    good, bad = make_chat(store, "good"), make_chat(store, "bad")
    store.close()
    corrupt(
        path,
        f"UPDATE conversations SET settings = 'not json' WHERE id = {bad};"
        f"UPDATE messages SET metrics = '{{broken' WHERE conversation_id = {bad};",
    )
    store = Store(path)
    convs = {c.id: c for c in store.conversations()}
    assert convs[bad].settings == {} and convs[good].settings == {"model": "big"}
    assert [m.metrics for m in store.messages(bad)] == [None, None]
    assert [m.content for m in store.messages(bad)] == ["bad", "an answer"]
    assert any("chat settings" in p for p in store.problems) and any("metrics" in p for p in store.problems)


def test_a_dropped_attachments_table_is_recreated_and_chats_kept(tmp_path):
    path = tmp_path / "b.db"
    store = Store(path)
    cid = make_chat(store)
    store.close()
    corrupt(path, "DROP TABLE attachments;")
    store = Store(path)
    assert store.attachments(cid) == [] and [m.content for m in store.messages(cid)] == ["hello", "an answer"]
    assert any("attachments" in p for p in store.problems)
    store.add_attachment(cid, "a.txt", "text", 3, "abc", pages=None)
    store.add_attachment(cid, "b.pdf", "pdf", 3, "abc", pages=2)  # the recreated table has the later column too
    assert [a["pages"] for a in store.attachments(cid)] == [None, 2]


def test_a_dropped_versions_table_is_recreated_and_regenerate_works(tmp_path):
    path = tmp_path / "b.db"
    store = Store(path)
    cid = make_chat(store)
    store.close()
    corrupt(path, "DROP TABLE answer_versions;")
    store = Store(path)
    assert any("answer_versions" in p for p in store.problems)
    store.regenerate_at(cid, 1)
    assert store.versions(cid, 1) == (1, 2)


@pytest.mark.parametrize("version", [-5, 99])
def test_unknown_schema_versions_are_refused_without_touching_the_file(tmp_path, version):
    path = tmp_path / "b.db"
    store = Store(path)
    make_chat(store)
    store.close()  # closed now: left to the garbage collector, its last checkpoint could land mid-test
    corrupt(path, f"PRAGMA user_version = {version};")
    original = path.read_bytes()
    with pytest.raises(StoreUnavailable, match=f"schema {version}"):
        Store(path)
    assert path.read_bytes() == original and not list(tmp_path.glob("b.db.unreadable-*"))


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root writes through read-only permissions, so a read-only folder cannot be made here",
)
def test_a_database_in_a_read_only_folder_opens_read_only(tmp_path):
    folder = tmp_path / "ro"
    store = Store(folder / "b.db")
    cid = make_chat(store)
    store.close()
    os.chmod(folder, 0o500)
    try:
        store = Store(folder / "b.db")
        assert store.read_only and "read-only" in store.recovery_note
        assert [m.content for m in store.messages(cid)] == ["hello", "an answer"]
    finally:
        os.chmod(folder, 0o700)


def test_a_read_only_database_file_opens_read_only(tmp_path, monkeypatch):
    """The same read-only path, reached through SQLite's own refusal to write (works as root too)."""
    path = tmp_path / "b.db"
    cid = make_chat(Store(path))
    real_open = Store._open

    def refuse_writes(self, *, read_only):
        if not read_only:
            raise store_opening._ReadOnly("attempt to write a readonly database")
        return real_open(self, read_only=True)

    monkeypatch.setattr(Store, "_open", refuse_writes)
    store = Store(path)
    assert store.read_only and [m.content for m in store.messages(cid)] == ["hello", "an answer"]


# --- 9. imports are all or nothing ------------------------------------------------------------

GOOD_EXPORT = {
    "format": "brisk-chat",
    "version": 1,
    "title": "t",
    "settings": {"temperature": 0.5},
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "finish_reason": "stop", "metrics": {}},
    ],
}


@pytest.mark.parametrize(
    "change,match",
    [
        ({"settings": "abc"}, "settings must be an object"),
        ({"settings": {"temperature": "hot"}}, "settings are invalid"),
        ({"title": ["a list"]}, "title must be text"),
        ({"messages": [{"role": "assistant", "content": "x", "finish_reason": {"a": 1}}]}, "finish_reason"),
        ({"messages": [{"role": "assistant", "content": "x", "metrics": [1]}]}, "metrics"),
    ],
)
def test_imports_with_wrong_types_are_refused_and_add_nothing(tmp_path, change, match):
    store = Store(tmp_path / "b.db")
    with pytest.raises(StoreError, match=match):
        import_json(store, {**GOOD_EXPORT, **change})
    assert store.conversations() == []
    cid = import_json(store, json.loads(json.dumps(GOOD_EXPORT)))
    assert [m.content for m in store.messages(cid)] == ["hi", "yo"]
