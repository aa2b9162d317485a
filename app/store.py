"""The app's SQLite store: conversations, messages with their per-turn metrics, per-chat
settings, attachments, and the earlier answers Regenerate keeps.

Opening the file (schema, migrations, a damaged or newer database, one writer at a time)
is app/store_opening.py's; this module holds the queries on what it holds.

Answers are saved while they stream (`begin_answer` / `set_content` / `finish_answer`);
an answer still marked streaming when the store opens was cut off by a crash or kill: it
is kept, marked `interrupted`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager

from brisk.app.chat_schema import (  # noqa: F401  Conversation and StoredMessage are this module's objects
    MAX_TITLE_CHARS,
    Conversation,
    StoredMessage,
    read_message,
    read_number,
    read_settings,
    read_text,
)
from brisk.app.store_opening import (  # noqa: F401  the store's errors, raised by its queries and its opening
    ChatDatabase,
    StoreError,
    StoreUnavailable,
    sqlite_locked,
)


class Store(ChatDatabase):
    """The queries on the chats, their messages, answer versions and attachments."""

    @contextmanager
    def _transaction(self):
        if self.db.in_transaction:  # nested: the outer one commits
            yield
            return
        self._write("BEGIN")
        try:
            yield
            self._write("COMMIT")
        except BaseException:
            if self.db.in_transaction:  # SQLite already rolled back after some errors (disk full)
                self.db.execute("ROLLBACK")
            raise

    def _write(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        """Every write: SQLite's failures become a StoreError that says what happened."""
        if self.read_only:
            raise StoreError("The chat database is open read-only: not saved")
        try:
            return self.db.execute(sql, args)
        except sqlite3.OperationalError as exc:
            text = str(exc)
            if "full" in text:
                raise StoreError("The disk is full: not saved") from exc
            if sqlite_locked(exc):
                raise StoreError("The chat database is busy (locked by another program): not saved") from exc
            raise StoreError(f"Saving failed: {text}") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"Saving failed: {exc}") from exc

    def _unreadable(self, what: str) -> None:
        """Reported once: rows keep opening, without the values the app cannot use."""
        note = f"Unreadable {what} were skipped (the rest of the chat is kept)."
        if note not in self.problems:
            self.problems.append(note)

    def _conversation(self, row: tuple) -> Conversation:
        title, bad_title = read_text(row[1], "Untitled")
        settings, bad_settings = read_settings(row[3])
        if bad_title:
            self._unreadable("chat titles")
        if bad_settings:
            self._unreadable("chat settings")
        # A title edited in by hand can be megabytes: laid out in the sidebar at every start.
        return Conversation(row[0], title[:MAX_TITLE_CHARS], read_number(row[2]), settings)

    # --- conversations ----------------------------------------------------------------

    def create_conversation(self, title: str, settings: dict) -> int:
        now = time.time()
        cur = self._write(
            "INSERT INTO conversations (title, created, updated, settings) VALUES (?, ?, ?, ?)",
            (title, now, now, json.dumps(settings)),
        )
        return cur.lastrowid

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches titles and message text, case-insensitively."""
        sql = "SELECT id, title, updated, settings FROM conversations c WHERE deleted = 0"
        args: tuple = ()
        if search:
            pattern = f"%{_escape_like(search)}%"
            sql += (
                " AND (title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE"
                " m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\'))"
            )
            args = (pattern, pattern)
        rows = self.db.execute(sql + " ORDER BY updated DESC, id DESC", args).fetchall()
        return [self._conversation(row) for row in rows]

    def conversation(self, conversation_id: int) -> Conversation:
        row = self.db.execute(
            "SELECT id, title, updated, settings FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"conversation {conversation_id} does not exist")
        return self._conversation(row)

    def rename(self, conversation_id: int, title: str) -> None:
        # As long as an export may hold (app/chat_schema.py), so a renamed chat's backup imports.
        title = title.strip()[:MAX_TITLE_CHARS] or "Untitled"
        self._write("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def save_settings(self, conversation_id: int, settings: dict) -> None:
        self._write("UPDATE conversations SET settings = ? WHERE id = ?", (json.dumps(settings), conversation_id))

    def delete(self, conversation_id: int) -> None:
        """Hidden at once, removed for good by `purge_deleted` (so it can be undone)."""
        self._write("UPDATE conversations SET deleted = 1 WHERE id = ?", (conversation_id,))

    def undelete(self, conversation_id: int) -> None:
        self._write("UPDATE conversations SET deleted = 0 WHERE id = ?", (conversation_id,))

    def purge_deleted(self) -> None:
        self._write("DELETE FROM conversations WHERE deleted = 1")

    def drop_empty(self, conversation_id: int | None = None) -> int:
        """Remove for good the chat (None: every chat) that holds no message and no attachment:
        an unused "New chat" is not kept. Returns how many went."""
        sql = (
            "DELETE FROM conversations WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id ="
            " conversations.id) AND NOT EXISTS (SELECT 1 FROM attachments a WHERE a.conversation_id = conversations.id)"
        )
        if conversation_id is None:
            return self._write(sql).rowcount
        return self._write(sql + " AND id = ?", (conversation_id,)).rowcount

    def _touch(self, conversation_id: int) -> None:
        self._write("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    # --- messages ----------------------------------------------------------------------

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute(
            "SELECT id, role, content, finish_reason, metrics FROM messages"
            " WHERE conversation_id = ? ORDER BY position",
            (conversation_id,),
        ).fetchall()
        messages = []
        for row in rows:
            message, unread = read_message(row)
            for part in unread:
                self._unreadable("turn metrics" if part.startswith("turn metrics") else "message parts")
            messages.append(message)
        return messages

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        finish_reason: str | None = None,
        metrics: dict | None = None,
        streaming: bool = False,
    ) -> int:
        with self._transaction():
            position = self.db.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()[0]
            cur = self._write(
                "INSERT INTO messages (conversation_id, position, role, content, finish_reason, metrics, streaming,"
                " created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    position,
                    role,
                    content,
                    finish_reason,
                    json.dumps(metrics) if metrics else None,
                    int(streaming),
                    time.time(),
                ),
            )
            self._touch(conversation_id)
        return cur.lastrowid

    def begin_answer(self, conversation_id: int) -> int:
        return self.add_message(conversation_id, "assistant", "", streaming=True)

    def set_content(self, message_id: int, content: str) -> None:
        """A message's text: a streaming answer so far, or an edited question."""
        self._write("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))

    def finish_answer(self, message_id: int, content: str, finish_reason: str, metrics: dict | None) -> None:
        self._write(
            "UPDATE messages SET content = ?, finish_reason = ?, metrics = ?, streaming = 0 WHERE id = ?",
            (content, finish_reason, json.dumps(metrics) if metrics else None, message_id),
        )

    def truncate(self, conversation_id: int, keep: int) -> None:
        """Keep the first `keep` messages and the versions beside them (an edit drops what follows)."""
        with self._transaction():
            self._write("DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, keep))
            self._write(
                "DELETE FROM answer_versions WHERE conversation_id = ? AND position >= ?", (conversation_id, keep)
            )

    # --- answer versions (Regenerate keeps the earlier answers) ---------------------------

    def regenerate_at(self, conversation_id: int, position: int) -> int:
        """Keep the answer at `position` as an earlier version, drop it and what follows, and
        begin the new answer there; returns its message id."""
        with self._transaction():
            row = self.db.execute(
                "SELECT content, finish_reason, metrics, created FROM messages WHERE"
                " conversation_id = ? AND position = ? AND role = 'assistant'",
                (conversation_id, position),
            ).fetchone()
            if row and row[0]:
                self._write(
                    "INSERT INTO answer_versions (conversation_id, position, content, finish_reason, metrics,"
                    " created) VALUES (?, ?, ?, ?, ?, ?)",
                    (conversation_id, position, *row),
                )
            self._write("DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, position))
            self._write(
                "DELETE FROM answer_versions WHERE conversation_id = ? AND position > ?", (conversation_id, position)
            )
            return self.begin_answer(conversation_id)

    def versions(self, conversation_id: int, position: int) -> tuple[int, int]:
        """(index of the shown answer, how many) among the answers kept at `position`, oldest first."""
        shown = self.db.execute(
            "SELECT created FROM messages WHERE conversation_id = ? AND position = ?", (conversation_id, position)
        ).fetchone()
        if shown is None or "answer_versions" not in self._tables():
            return 0, 1
        created = [
            r[0]
            for r in self.db.execute(
                "SELECT created FROM answer_versions WHERE conversation_id = ? AND position = ?",
                (conversation_id, position),
            )
        ]
        return sum(read_number(c) < read_number(shown[0]) for c in created), len(created) + 1

    def show_version(self, conversation_id: int, position: int, step: int) -> bool:
        """Show the answer `step` places older (-1) or newer (+1) at `position`: it swaps places
        with the shown one, so the conversation goes on from it. False when there is none."""
        shown, count = self.versions(conversation_id, position)
        target = shown + step
        if not 0 <= target < count:
            return False
        with self._transaction():
            message = self.db.execute(
                "SELECT id, content, finish_reason, metrics, created FROM messages WHERE"
                " conversation_id = ? AND position = ?",
                (conversation_id, position),
            ).fetchone()
            others = self.db.execute(
                "SELECT id, content, finish_reason, metrics, created FROM answer_versions WHERE"
                " conversation_id = ? AND position = ? ORDER BY created",
                (conversation_id, position),
            ).fetchall()
            chosen = others[target if target < shown else target - 1]
            self._write(
                "UPDATE messages SET content = ?, finish_reason = ?, metrics = ?, created = ? WHERE id = ?",
                (*chosen[1:], message[0]),
            )
            self._write(
                "UPDATE answer_versions SET content = ?, finish_reason = ?, metrics = ?, created = ? WHERE id = ?",
                (*message[1:], chosen[0]),
            )
            self._touch(conversation_id)
        return True

    # --- attachments -----------------------------------------------------------------

    def add_attachment(
        self, conversation_id: int, name: str, kind: str, tokens: int, text: str, pages: int | None = None
    ) -> int:
        cur = self._write(
            "INSERT INTO attachments (conversation_id, name, kind, tokens, text, created, pages)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, name, kind, tokens, text, time.time(), pages),
        )
        return cur.lastrowid

    def attachments(self, conversation_id: int) -> list[dict]:
        if "attachments" not in self._tables():
            return []
        pages = "pages" if "pages" in {r[1] for r in self.db.execute("PRAGMA table_info(attachments)")} else "NULL"
        rows = self.db.execute(
            f"SELECT id, name, kind, tokens, {pages} FROM attachments WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        ).fetchall()
        return [
            {"id": i, "name": read_text(n, "")[0], "kind": read_text(k, "text")[0], "tokens": t, "pages": p}
            for i, n, k, t, p in rows
        ]

    def _tables(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
