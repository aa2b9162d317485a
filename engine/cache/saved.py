"""Prompt caches that outlive the app: one file per conversation, in a folder beside the
chat database, so a long document chat reopened tomorrow answers without re-reading it.

A file is written when a session leaves memory (evicted, or the app closes) and read on
the conversation's first turn. `PromptCache.load` refuses a file of another model or
tokenizer, or one whose KV does not match its tokens; such a file is deleted. At most
`DEFAULT_MAX_FILES` are kept, the least recently written deleted first.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.errors import BriskError

log = logging.getLogger(__name__)

# A few long chats: each file is the KV of one conversation (SmolLM2 at 4K tokens: ~190 MB).
DEFAULT_MAX_FILES = 8


class SavedCaches:
    def __init__(self, folder: Path, *, max_files: int = DEFAULT_MAX_FILES):
        self.folder = Path(folder)
        self.max_files = max_files

    def path(self, conversation_id: int) -> Path:
        return self.folder / f"chat-{int(conversation_id)}.safetensors"

    def save(self, conversation_id: int, session) -> None:
        """Write the session's cache (nothing when it has none); a failure is logged, not raised:
        losing a cache costs one prefill, never the chat."""
        if session.cache.layers is None or not session.cache.tokens:
            return
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            target = self.path(conversation_id)
            partial = target.with_name(target.stem + ".partial.safetensors")
            session.save_cache(partial)
            os.chmod(partial, 0o600)  # a conversation's KV is as private as its text
            os.replace(partial, target)  # a crash mid-write never leaves a half file under the real name
            self._prune()
        except (BriskError, OSError, RuntimeError, ValueError) as exc:
            log.warning("could not save the prompt cache of chat %s: %s", conversation_id, exc)

    def restore(self, conversation_id: int, session) -> bool:
        """Adopt the saved cache into a fresh session; True when it was used."""
        path = self.path(conversation_id)
        if not path.is_file():
            return False
        try:
            session.load_cache(path)
        except BriskError as exc:  # another model, or damaged: it can never be used
            log.info("saved prompt cache of chat %s refused: %s", conversation_id, exc)
            path.unlink(missing_ok=True)
            return False
        return True

    def _prune(self) -> None:
        files = sorted(self.folder.glob("chat-*.safetensors"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in [f for f in files if ".partial" not in f.name][self.max_files :]:
            old.unlink(missing_ok=True)
