"""Opening the chat database safely: its schema and migrations, and what is done when the
file is not what it should be.

WAL journal, a schema version with forward migrations, and a rule: a database we cannot
read (corrupt, or written by a newer Brisk) is never overwritten. It is copied aside, the
user is told where, and the app starts with a fresh one. A table or column dropped by hand
is added back; a second Brisk on the same file opens it read-only.

An answer still marked streaming when the store opens was cut off by a crash or kill: it
is kept, marked `interrupted`. The queries on what the database holds are app/store.py's.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import time
from pathlib import Path
from urllib.parse import quote

from brisk.app.chat_schema import decode_text
from brisk.engine.api.errors import UnsafeLocation
from brisk.engine.models.store import lock_file
from brisk.engine.runtime.private_files import O_NOFOLLOW, check_owned_file, ensure_private_dir

SCHEMA_VERSION = 2
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
    # Earlier answers kept by Regenerate, by the position of the answer they stand beside;
    # the messages row at that position is the version shown (and sent on).
    2: """
    CREATE TABLE answer_versions (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL, content TEXT NOT NULL, finish_reason TEXT, metrics TEXT,
        created REAL NOT NULL);
    CREATE INDEX versions_by_answer ON answer_versions(conversation_id, position);
    ALTER TABLE attachments ADD COLUMN pages INTEGER;
    """,
}


class StoreError(Exception):
    """A store operation failed; the message says what and what was kept."""


class StoreUnavailable(StoreError):
    """The database cannot be used at all (a folder, locked, from a newer Brisk); nothing was moved."""


# Marks databases Brisk created (PRAGMA application_id, "BRSK"): only those are ever moved aside.
APPLICATION_ID = 0x4252534B
SQLITE_HEADER = b"SQLite format 3\x00"
# How long to wait for another program's lock before saying the database is in use.
LOCK_TIMEOUT_S = 5.0
TABLES = ("conversations", "messages", "attachments", "answer_versions")


class _Corrupt(Exception):
    """The file is not a usable SQLite database (bad header, failed integrity check)."""


class _ReadOnly(Exception):
    """The file or its folder cannot be written: open it read-only."""


class ChatDatabase:
    """The database file, opened (or moved aside and started afresh, or opened read-only);
    `recovery_note` and `problems` say what the user must be told about it."""

    def __init__(self, path, *, default_location: bool = False):
        self.path = Path(path)
        self.recovery_note = ""  # set when a bad database was moved aside, or opened read-only
        self.problems: list[str] = []  # rows that could not be read, reported once each
        self.read_only = False
        self._default_location = default_location
        self._check_path()
        self._instance_lock = self._take_instance_lock()
        try:
            self.db = self._open_or_recover()
        except BaseException:
            self._release_instance_lock()
            raise
        self.db.text_factory = decode_text  # a row that is not UTF-8 is read, and marked, not fatal
        if not self.read_only:
            self._recover_streaming()

    def _check_path(self) -> None:
        if self.path.is_dir():
            raise StoreUnavailable(f"{self.path} is a folder, not a chat database; choose a file for --database")
        if self.path.exists() and not self.path.is_file():
            raise StoreUnavailable(f"{self.path} is not a regular file; choose a file for --database")
        # Only a folder no other user can write, and a database file of ours: in /tmp (mode
        # 1777) another user could plant the database, or links Brisk would write through.
        try:
            ensure_private_dir(self.path.parent)
            check_owned_file(self.path)
        except UnsafeLocation as exc:
            raise StoreUnavailable(f"{exc} (start Brisk with --database OTHER_FILE)") from exc
        except OSError as exc:
            raise StoreUnavailable(f"Cannot create the data folder {self.path.parent}: {exc.strerror}") from exc
        if not self.path.exists():
            try:  # created private before SQLite opens it; SQLite gives -wal/-shm the same mode
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | O_NOFOLLOW, 0o600))
            except OSError:
                pass  # a read-only folder: opened read-only below, or reported
        elif _owned_regular_file(self.path):
            try:
                os.chmod(self.path, 0o600)  # databases from older Brisk versions were 0644
            except OSError:
                pass

    def _take_instance_lock(self):
        """One writing Brisk per database: a second one opens it read-only and never marks the
        first one's live answer `interrupted`."""
        try:
            handle = open(Path(str(self.path) + ".lock"), "a+")
        except OSError:
            return None  # read-only folder: the database opens read-only anyway
        try:
            lock_file(handle)
        except OSError:
            handle.close()
            self.read_only = True
            self.recovery_note = (
                "Another Brisk window has this chat database open, so this one shows it "
                "read-only: close the other one to chat here."
            )
            return None
        return handle

    def _release_instance_lock(self) -> None:
        if self._instance_lock is not None:
            self._instance_lock.close()
            self._instance_lock = None

    def _open_or_recover(self) -> sqlite3.Connection:
        try:
            return self._open(read_only=self.read_only)
        except _Corrupt as exc:
            if self.read_only or not self._may_move_aside():
                raise StoreUnavailable(
                    f"{self.path} cannot be used as a chat database ({exc}); Brisk leaves it "
                    "as it is. Choose another --database."
                ) from exc
            backup = self._move_aside()
            self.recovery_note = (
                f"The chat database could not be opened ({exc}). It was kept as {backup.name} "
                "and Brisk started with an empty one."
            )
            return self._open(read_only=False)
        except _ReadOnly as exc:
            self.read_only = True
            self.recovery_note = (
                f"The chat database is read-only ({exc}): you can read your chats, but nothing new is saved."
            )
            return self._open(read_only=True)

    def _open(self, *, read_only: bool) -> sqlite3.Connection:
        header = _read_header(self.path)
        if header and not header.startswith(SQLITE_HEADER[: len(header)]) or 0 < len(header) < len(SQLITE_HEADER):
            raise _Corrupt("it is not an SQLite database")
        uri = f"file:{quote(str(self.path.resolve()))}?mode={'ro' if read_only else 'rw'}"
        if read_only and not os.access(self.path.parent, os.W_OK):
            uri += "&immutable=1"  # nobody can write beside it: SQLite need not create its -shm file
        try:
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=LOCK_TIMEOUT_S)
        except sqlite3.OperationalError as exc:
            if read_only:
                raise StoreUnavailable(f"Cannot open the chat database {self.path}: {exc}") from exc
            raise _ReadOnly(str(exc)) from exc
        try:
            self._prepare(db, read_only=read_only)
        except BaseException:
            db.close()
            raise
        return db

    def _prepare(self, db: sqlite3.Connection, *, read_only: bool) -> None:
        try:
            db.execute("PRAGMA foreign_keys = ON")
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise _Corrupt("the integrity check failed")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if not 0 <= version <= SCHEMA_VERSION:  # checked before anything writes to the file
                newer = "a newer Brisk" if version > SCHEMA_VERSION else "something other than Brisk"
                raise StoreUnavailable(
                    f"{self.path} was written by {newer} (schema {version}; this Brisk reads "
                    f"{SCHEMA_VERSION}). It was left untouched: open it with that Brisk, or "
                    "start this one with --database OTHER_FILE."
                )
            if read_only:
                return
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            for v in range(version + 1, SCHEMA_VERSION + 1):
                db.execute("BEGIN")
                for statement in _statements(MIGRATIONS[v]):
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {v}")
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute("COMMIT")
            self._repair_tables(db)
            self._repair_columns(db)
        except sqlite3.OperationalError as exc:
            if sqlite_locked(exc):
                raise StoreUnavailable(
                    f"The chat database {self.path} is in use by another program (still locked "
                    f"after {LOCK_TIMEOUT_S:g} s); close it and start Brisk again."
                ) from exc
            if any(word in str(exc) for word in ("readonly", "read-only", "unable to open")):
                raise _ReadOnly(str(exc)) from exc
            raise _Corrupt(str(exc)) from exc
        except sqlite3.DatabaseError as exc:  # "file is not a database", "malformed"
            raise _Corrupt(str(exc)) from exc

    def _repair_tables(self, db: sqlite3.Connection) -> None:
        """Recreate a table that went missing (e.g. dropped by hand), empty, and say so."""
        present = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        missing = [t for t in TABLES if t not in present]
        if not missing:
            return
        for statement in (s for v in sorted(MIGRATIONS) for s in _statements(MIGRATIONS[v])):
            if statement.startswith("ALTER TABLE") and not _adds_a_missing_column(db, statement):
                continue
            db.execute(
                statement.replace("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ").replace(
                    "CREATE INDEX ", "CREATE INDEX IF NOT EXISTS "
                )
            )
        self.problems.append(
            f"The chat database lacked its {', '.join(missing)} table(s); they were recreated "
            "empty and the rest of your chats are kept."
        )

    def _repair_columns(self, db: sqlite3.Connection) -> None:
        """Add back a column dropped by hand, with its default: every query names it, and
        'no such column' failed every start. One that has no default (the text of a message)
        cannot be made up: the file is then unusable and moved aside like any corrupt one."""
        reference = sqlite3.connect(":memory:")
        for v in sorted(MIGRATIONS):
            reference.executescript(MIGRATIONS[v])
        added = []
        for table in TABLES:
            have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            for _, name, kind, not_null, default, _ in reference.execute(f"PRAGMA table_info({table})"):
                if name in have:
                    continue
                if not_null and default is None:
                    raise _Corrupt(f"its {table} table lacks the {name} column")
                constraint = (" NOT NULL" if not_null else "") + (f" DEFAULT {default}" if default is not None else "")
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}{constraint}")
                added.append(f"{table}.{name}")
        reference.close()
        if added:
            self.problems.append(
                f"The chat database lacked the column(s) {', '.join(added)}; they were added back "
                "with their defaults and your chats are kept."
            )

    def _may_move_aside(self) -> bool:
        """Only a regular file Brisk could have made: at its default place, named *.db, or marked as ours."""
        if not _owned_regular_file(self.path) or self.path.is_symlink():
            return False
        return self._default_location or self.path.suffix == ".db" or _application_id(self.path) == APPLICATION_ID

    def _move_aside(self) -> Path:
        backup = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.move(self.path, backup)
        for suffix in ("-wal", "-shm"):
            side = Path(str(self.path) + suffix)
            if side.is_file() and not side.is_symlink():
                shutil.move(side, Path(str(backup) + suffix))
        os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        return backup

    def _recover_streaming(self) -> None:
        try:
            self.db.execute("UPDATE messages SET streaming = 0, finish_reason = 'interrupted' WHERE streaming = 1")
        except sqlite3.DatabaseError as exc:  # locked, read-only, or a trigger that refuses (IntegrityError)
            self.close()
            if isinstance(exc, sqlite3.OperationalError) and sqlite_locked(exc):
                raise StoreUnavailable(
                    f"The chat database {self.path} is in use by another program (still locked "
                    f"after {LOCK_TIMEOUT_S:g} s); close it and start Brisk again."
                ) from exc
            raise StoreUnavailable(f"The chat database {self.path} cannot be written: {exc}") from exc

    def close(self) -> None:
        self.db.close()
        self._release_instance_lock()


def _read_header(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_HEADER))
    except OSError:
        return b""


def _owned_regular_file(path: Path) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and (not hasattr(os, "getuid") or info.st_uid == os.getuid())


def _application_id(path: Path) -> int | None:
    with open(path, "rb") as fh:
        header = fh.read(100)
    return int.from_bytes(header[68:72], "big") if len(header) == 100 else None


def sqlite_locked(exc: Exception) -> bool:
    """SQLite's "database is locked" / "busy": another program holds the file, it is not damaged."""
    return "locked" in str(exc) or "busy" in str(exc)


def _adds_a_missing_column(db: sqlite3.Connection, statement: str) -> bool:
    """Whether "ALTER TABLE t ADD COLUMN c ..." adds a column t lacks (a recreated table does)."""
    words = statement.split()
    table, column = words[2], words[5]
    return column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
