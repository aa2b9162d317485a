"""A chat as a file: JSON export and import (checked whole before anything is written),
and Markdown export."""

from __future__ import annotations

from app.store import Store, StoreError
from engine.vocabulary import FINISH_REASONS


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
    """A chat exported by `export_json`: checked whole first, then written in one
    transaction, so a bad file adds nothing."""
    from engine.errors import InvalidSettings
    from engine.settings import ChatSettings

    if not isinstance(data, dict) or data.get("format") != "brisk-chat":
        raise StoreError('not a Brisk chat export (no "format": "brisk-chat")')
    messages, title, settings = data.get("messages"), data.get("title"), data.get("settings")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise StoreError("the export's messages are malformed (each needs a role and text content)")
    for i, m in enumerate(messages):
        if m.get("finish_reason") not in (None, *FINISH_REASONS):
            raise StoreError(f"message {i + 1} has an invalid finish_reason {m.get('finish_reason')!r}")
        if m.get("metrics") is not None and not isinstance(m["metrics"], dict):
            raise StoreError(f"message {i + 1} has metrics that are not an object")
    if title is not None and not isinstance(title, str):
        raise StoreError(f"the export's title must be text, not {type(title).__name__}")
    if settings is not None and not isinstance(settings, dict):
        raise StoreError(f"the export's settings must be an object, not {type(settings).__name__}")
    try:
        settings = ChatSettings.from_dict(settings or {}).to_dict() if settings else {}
    except (InvalidSettings, TypeError, ValueError) as exc:
        raise StoreError(f"the export's settings are invalid: {exc}") from exc
    with store._transaction():
        cid = store.create_conversation(title or "Imported chat", settings)
        for m in messages:
            store.add_message(
                cid, m["role"], m["content"], finish_reason=m.get("finish_reason"), metrics=m.get("metrics")
            )
    return cid


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
