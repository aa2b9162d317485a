"""The app's SQLite store: conversations, messages with their per-turn metrics, per-chat
settings, attachments.

WAL journal, a schema version with forward migrations, and a rule: a database we cannot
read (corrupt, or written by a newer Brisk) is never overwritten. It is copied aside, the
user is told where, and the app starts with a fresh one.

Answers are saved while they stream (`begin_answer` / `set_content` / `finish_answer`);
an answer still marked streaming when the store opens was cut off by a crash or kill: it
is kept, marked `interrupted`.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
MIGRATIONS = {
    1: """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
        settings TEXT NOT NULL DEFAULT '{}', deleted INTEGER NOT NULL DEFAULT 0);
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
        finish_reason TEXT, metrics TEXT, streaming INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
    CREATE INDEX messages_by_conversation ON messages(conversation_id, position);
    CREATE TABLE attachments (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        name TEXT NOT NULL, kind TEXT NOT NULL, tokens INTEGER NOT NULL, text TEXT NOT NULL,
        created REAL NOT NULL);
    """,
}


class StoreError(Exception):
    pass


@dataclass
class Conversation:
    id: int
    title: str
    updated: float
    settings: dict


@dataclass
class StoredMessage:
    id: int
    role: str
    content: str
    finish_reason: str | None
    metrics: dict | None


class Store:
    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.recovery_note = ""  # set when a bad database was moved aside
        try:
            self.db = self._open()
        except (sqlite3.DatabaseError, StoreError) as exc:
            backup = self._move_aside()
            self.recovery_note = (f"The chat database could not be opened ({exc}). It was kept as {backup.name} "
                                  "and Brisk started with an empty one.")
            self.db = self._open()
        self._recover_streaming()

    # --- opening, migrations, recovery ------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA foreign_keys = ON")
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise StoreError("the integrity check failed")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:  # checked before anything writes to the file
                raise StoreError(f"it was written by a newer Brisk (schema {version}, this one reads {SCHEMA_VERSION})")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            for v in range(version + 1, SCHEMA_VERSION + 1):
                db.execute("BEGIN")
                for statement in _statements(MIGRATIONS[v]):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {v}")
                db.execute("COMMIT")
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        backup = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.move(self.path, backup)
        for suffix in ("-wal", "-shm"):
            side = Path(str(self.path) + suffix)
            if side.exists():
                shutil.move(side, Path(str(backup) + suffix))
        return backup

    def _recover_streaming(self) -> None:
        self.db.execute("UPDATE messages SET streaming = 0, finish_reason = 'interrupted' WHERE streaming = 1")

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self):
        if self.db.in_transaction:  # nested: the outer one commits
            yield
            return
        self.db.execute("BEGIN")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    # --- conversations ----------------------------------------------------------------

    def create_conversation(self, title: str, settings: dict) -> int:
        now = time.time()
        cur = self.db.execute("INSERT INTO conversations (title, created, updated, settings) VALUES (?, ?, ?, ?)",
                              (title, now, now, json.dumps(settings)))
        return cur.lastrowid

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches titles and message text, case-insensitively."""
        sql = "SELECT id, title, updated, settings FROM conversations c WHERE deleted = 0"
        args: tuple = ()
        if search:
            pattern = f"%{_escape_like(search)}%"
            sql += (" AND (title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE"
                    " m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\'))")
            args = (pattern, pattern)
        rows = self.db.execute(sql + " ORDER BY updated DESC, id DESC", args).fetchall()
        return [Conversation(i, t, u, json.loads(s)) for i, t, u, s in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        row = self.db.execute("SELECT id, title, updated, settings FROM conversations WHERE id = ?",
                              (conversation_id,)).fetchone()
        if row is None:
            raise StoreError(f"conversation {conversation_id} does not exist")
        return Conversation(row[0], row[1], row[2], json.loads(row[3]))

    def rename(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or "Untitled", conversation_id))

    def save_settings(self, conversation_id: int, settings: dict) -> None:
        self.db.execute("UPDATE conversations SET settings = ? WHERE id = ?", (json.dumps(settings), conversation_id))

    def delete(self, conversation_id: int) -> None:
        """Hidden at once, removed for good by `purge_deleted` (so it can be undone)."""
        self.db.execute("UPDATE conversations SET deleted = 1 WHERE id = ?", (conversation_id,))

    def undelete(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET deleted = 0 WHERE id = ?", (conversation_id,))

    def purge_deleted(self) -> None:
        self.db.execute("DELETE FROM conversations WHERE deleted = 1")

    def _touch(self, conversation_id: int) -> None:
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    # --- messages ----------------------------------------------------------------------

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute("SELECT id, role, content, finish_reason, metrics FROM messages"
                               " WHERE conversation_id = ? ORDER BY position", (conversation_id,)).fetchall()
        return [StoredMessage(i, r, c, f, json.loads(m) if m else None) for i, r, c, f, m in rows]

    def add_message(self, conversation_id: int, role: str, content: str, *, finish_reason: str | None = None,
                    metrics: dict | None = None, streaming: bool = False) -> int:
        with self._transaction():
            position = self.db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?",
                                       (conversation_id,)).fetchone()[0]
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, position, role, content, finish_reason, metrics, streaming,"
                " created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, position, role, content, finish_reason, json.dumps(metrics) if metrics else None,
                 int(streaming), time.time()))
            self._touch(conversation_id)
        return cur.lastrowid

    def begin_answer(self, conversation_id: int) -> int:
        return self.add_message(conversation_id, "assistant", "", streaming=True)

    def set_content(self, message_id: int, content: str) -> None:
        """A message's text: a streaming answer so far, or an edited question."""
        self.db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))

    def finish_answer(self, message_id: int, content: str, finish_reason: str, metrics: dict | None) -> None:
        self.db.execute("UPDATE messages SET content = ?, finish_reason = ?, metrics = ?, streaming = 0 WHERE id = ?",
                        (content, finish_reason, json.dumps(metrics) if metrics else None, message_id))

    def truncate(self, conversation_id: int, keep: int) -> None:
        """Keep the first `keep` messages (edit and regenerate drop what follows)."""
        self.db.execute("DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, keep))

    # --- attachments -----------------------------------------------------------------

    def add_attachment(self, conversation_id: int, name: str, kind: str, tokens: int, text: str) -> int:
        cur = self.db.execute("INSERT INTO attachments (conversation_id, name, kind, tokens, text, created)"
                              " VALUES (?, ?, ?, ?, ?, ?)", (conversation_id, name, kind, tokens, text, time.time()))
        return cur.lastrowid

    def attachments(self, conversation_id: int) -> list[dict]:
        rows = self.db.execute("SELECT id, name, kind, tokens FROM attachments WHERE conversation_id = ? ORDER BY id",
                               (conversation_id,)).fetchall()
        return [{"id": i, "name": n, "kind": k, "tokens": t} for i, n, k, t in rows]

    # --- export / import ---------------------------------------------------------------

    def export_json(self, conversation_id: int) -> dict:
        conv = self.conversation(conversation_id)
        return {"format": "brisk-chat", "version": 1, "title": conv.title, "settings": conv.settings,
                "messages": [{"role": m.role, "content": m.content, "finish_reason": m.finish_reason,
                              "metrics": m.metrics} for m in self.messages(conversation_id)]}

    def import_json(self, data: dict) -> int:
        if not isinstance(data, dict) or data.get("format") != "brisk-chat":
            raise StoreError("not a Brisk chat export (no \"format\": \"brisk-chat\")")
        messages = data.get("messages")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in messages):
            raise StoreError("the export's messages are malformed (each needs a role and text content)")
        with self._transaction():
            cid = self.create_conversation(str(data.get("title") or "Imported chat"), dict(data.get("settings") or {}))
            for m in messages:
                self.add_message(cid, m["role"], m["content"], finish_reason=m.get("finish_reason"),
                                 metrics=m.get("metrics") if isinstance(m.get("metrics"), dict) else None)
        return cid


def export_markdown(store: Store, conversation_id: int) -> str:
    conv = store.conversation(conversation_id)
    parts = [f"# {conv.title}\n"]
    for m in store.messages(conversation_id):
        parts.append(f"## {m.role.capitalize()}\n\n{m.content}\n")
    return "\n".join(parts)


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
