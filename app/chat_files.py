"""A chat as a file: JSON export and import (every value checked before anything is
written), and Markdown export."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

from brisk.app.chat_schema import (
    MAX_CONTENT_CHARS,
    MAX_TITLE_CHARS,
    METRIC_CHECKS,
    ROLES,
    at,
    metrics_problems,
    one_of,
    settings_problems,
    shown,
    text_problem,
)
from brisk.app.store import Store, StoreError
from brisk.engine.api.literal_types import FINISH_REASONS
from brisk.engine.api.settings import ChatSettings

# Far above any chat's export (a message holds at most a few 8M-character documents), far
# below what reading the whole file into memory would make a problem.
MAX_EXPORT_BYTES = 512 * 2**20
# Opening a chat lays out every message: 8,000 took 30 s and 100,000 never finished, at
# every start after (the newest chat opens first).
MAX_IMPORT_MESSAGES = 5_000


def export_json(store: Store, conversation_id: int) -> dict:
    conv = store.conversation(conversation_id)
    return {
        "format": "brisk-chat",
        "version": 1,
        "title": conv.title,
        "settings": conv.settings,
        "messages": [
            {"role": m.role, "content": m.content, "finish_reason": m.finish_reason, "metrics": m.metrics}
            for m in store.messages(conversation_id)
        ],
    }


def import_json(store: Store, data: dict) -> int:
    """A chat exported by `export_json`: every value checked first (app/chat_schema.py), then
    written in one transaction, so a bad file adds nothing and says which value is wrong."""
    title, settings, messages = _checked_export(data)
    with store._transaction():
        cid = store.create_conversation(title, settings)
        for m in messages:
            store.add_message(
                cid, m["role"], m["content"], finish_reason=m.get("finish_reason"), metrics=m.get("metrics")
            )
    return cid


def read_export(path) -> dict:
    """A JSON file as `import_json` takes it; every way it can be unreadable is a StoreError."""
    path = Path(path)
    try:
        # Non-blocking open: a FIFO or a device must be refused, not waited on or read forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StoreError("it is not a regular file (a folder, a device or a pipe)")
        with os.fdopen(fd, "rb") as file:
            data = file.read(MAX_EXPORT_BYTES + 1)
        if len(data) > MAX_EXPORT_BYTES:
            raise StoreError(f"the file is larger than {MAX_EXPORT_BYTES // 2**20} MiB; no chat export is")
        text = data.decode("utf-8")
    except OSError as exc:
        raise StoreError(exc.strerror or str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise StoreError(f"the file is not UTF-8 text (byte {exc.start})") from exc
    try:
        return json.loads(text)
    except RecursionError:
        raise StoreError("the file nests too deeply to be a chat export") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise StoreError(f"the file is not valid JSON ({exc})") from exc


def write_export(path, text: str) -> None:
    """`text` into `path` whole or not at all: a FIFO, a device or a folder there is refused
    (a FIFO hung the app), and the file appears only once written (a temporary file beside it,
    renamed over it). Every failure is a StoreError."""
    path = Path(path)
    try:
        if path.exists() and not stat.S_ISREG(path.stat().st_mode):
            raise StoreError(f"{path.name} is not a regular file (a folder, a device or a pipe)")
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StoreError(exc.strerror or str(exc)) from exc


def _checked_export(data) -> tuple[str, dict, list[dict]]:
    """(title, settings, messages) as they will be saved; StoreError naming the first bad value."""
    if not isinstance(data, dict) or data.get("format") != "brisk-chat":
        raise StoreError('not a Brisk chat export (no "format": "brisk-chat")')
    if data.get("version", 1) != 1 or isinstance(data.get("version"), bool):
        raise StoreError(f"version must be 1 (this Brisk reads version 1 exports), not {shown(data.get('version'))}")
    title = data.get("title")
    problem = None if title is None else text_problem(title, max_chars=MAX_TITLE_CHARS)
    if problem:
        raise StoreError(f"title {problem}")
    settings = data.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise StoreError(f"settings must be an object, not {shown(settings)}")
    wrong = _first(settings_problems(settings or {}))
    if wrong:
        raise StoreError(f"the settings are invalid: {wrong[0]} {wrong[1]}")
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise StoreError(f"messages must be a list, not {shown(messages)}")
    if len(messages) > MAX_IMPORT_MESSAGES:
        raise StoreError(
            f"the chat has {len(messages):,} messages; Brisk imports at most {MAX_IMPORT_MESSAGES:,} "
            "(a chat that long is not usable in one window)"
        )
    return (
        title or "Imported chat",
        ChatSettings.from_dict(settings).to_dict() if settings else {},
        [_checked_message(f"messages[{i}]", m) for i, m in enumerate(messages)],
    )


def _checked_message(path: str, m) -> dict:
    if not isinstance(m, dict):
        raise StoreError(f"{path} must be an object, not {shown(m)}")
    checks = {
        "role": one_of(ROLES),
        "content": lambda v: text_problem(v, max_chars=MAX_CONTENT_CHARS),
        "finish_reason": lambda v: None if v is None else one_of(FINISH_REASONS)(v),
        "metrics": lambda v: None if v is None or isinstance(v, dict) else f"must be an object, not {shown(v)}",
    }
    for key, check in checks.items():
        problem = check(m.get(key))
        if problem:
            raise StoreError(at(f"{path}.{key}", problem))
    metrics = m.get("metrics") or {}
    wrong = _first(metrics_problems(metrics))
    if wrong:
        raise StoreError(at(f"{path}.metrics.{wrong[0]}", wrong[1]))
    # Fields this Brisk does not read are not saved (as settings written by a newer one are not).
    return {**{k: m.get(k) for k in ("role", "content", "finish_reason")}, "metrics": _known(metrics)}


def _first(problems: dict[str, str]) -> tuple[str, str] | None:
    return next(iter(problems.items()), None)


def _known(metrics: dict) -> dict | None:
    return {k: v for k, v in metrics.items() if k in METRIC_CHECKS} or None


def export_markdown(store: Store, conversation_id: int) -> str:
    conv = store.conversation(conversation_id)
    parts = [f"# {conv.title}\n"]
    for m in store.messages(conversation_id):
        parts.append(f"## {m.role.capitalize()}\n\n{close_open_fence(m.content)}\n")
    return "\n".join(parts)


def close_open_fence(text: str) -> str:
    """A truncated answer can stop inside a code block; close it so the rest of the export
    is not swallowed into the code."""
    fence = None
    for line in text.splitlines():
        stripped = line.lstrip()
        for marker in ("```", "~~~"):
            if stripped.startswith(marker):
                if fence is None:
                    fence = marker
                elif fence == marker and stripped.strip() == marker:
                    fence = None
                break
    return text if fence is None else f"{text.rstrip()}\n{fence}"
