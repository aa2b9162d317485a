"""Prompt caches that outlive the app: one file per conversation, in a folder beside the
chat database, so a long document chat reopened tomorrow answers without re-reading it.

A file is written when a session leaves memory (evicted, or the app closes) and read on
the conversation's first turn. The folder must be private (engine/runtime/private_files.py): one
that another user owns or can write is refused, never written through. `PromptCache.load`
refuses a file not signed by this installation (engine/kv/signing.py), of another model
or tokenizer, or malformed; such a file is deleted and the chat is prefilled as if there
were none. At most `DEFAULT_MAX_FILES` are kept, the least recently written deleted first.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from pathlib import Path

from brisk.engine.api.errors import BriskError
from brisk.engine.runtime.private_files import check_owned_file, check_private_dir, new_private_file

log = logging.getLogger(__name__)

# A few long chats: each file is the KV of one conversation (SmolLM2 at 4K tokens: ~190 MB).
DEFAULT_MAX_FILES = 8
# A cache being written; renamed to `chat-<id>.safetensors` once complete.
PARTIAL_SUFFIX = ".partial.safetensors"
CACHE_NAME = re.compile(r"chat-(-?\d+)\.safetensors")


class SavedCaches:
    def __init__(self, folder: Path, *, max_files: int = DEFAULT_MAX_FILES):
        self.folder = Path(folder)
        self.max_files = max_files
        self._opened = time.time()  # partial files older than this were left by a crash

    @classmethod
    def beside(cls, database, **options) -> SavedCaches:
        """The caches of chat database `database` (in `<name>.caches` next to it), checked
        now: UnsafeLocation when that folder, or the signing key, is not private."""
        database = Path(database)
        saved = cls(database.with_name(database.name + ".caches"), **options)
        saved.check()
        return saved

    def check(self) -> None:
        """UnsafeLocation when the folder or the signing key could have been changed by
        another user; removes partial files that a crash left behind."""
        from brisk.engine.kv.signing import key_path

        key = key_path()
        for folder in (key.parent, self.folder):
            try:
                check_private_dir(folder)
            except FileNotFoundError:
                continue  # made private when first written to
        check_owned_file(key)
        if self.folder.is_dir():
            self._prune(partials_before=self._opened)

    def path(self, conversation_id: int) -> Path:
        return self.folder / f"chat-{int(conversation_id)}.safetensors"

    def save(self, conversation_id: int, session) -> None:
        """Write the session's cache (nothing when it has none); a failure is logged, not raised:
        losing a cache costs one prefill, never the chat."""
        if session.cache.layers is None or not session.cache.tokens:
            return
        started = time.time()
        try:
            target = self.path(conversation_id)
            # A fresh 0600 file (O_EXCL | O_NOFOLLOW) in a folder only we can write: nothing
            # planted there can be written through, and a crash never leaves a half file
            # under the real name.
            partial = new_private_file(self.folder, prefix=f"{target.stem}.", suffix=PARTIAL_SUFFIX)
            try:
                session.save_cache(partial)
                check_owned_file(target)  # never rename over a planted folder
                os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
            self._prune(partials_before=started)
        except (BriskError, OSError, RuntimeError, ValueError) as exc:
            log.warning("could not save the prompt cache of chat %s: %s", conversation_id, exc)

    def restore(self, conversation_id: int, session) -> bool:
        """Adopt the saved cache into a fresh session; True when it was used. Anything wrong
        (not private, unsigned, damaged, another model's) is a miss, and the file is deleted."""
        path = self.path(conversation_id)
        try:
            check_private_dir(self.folder)
            if check_owned_file(path) is None:
                return False
            session.load_cache(path)
        except FileNotFoundError:
            return False
        except (BriskError, OSError) as exc:  # it can never be used
            log.info("saved prompt cache of chat %s refused: %s", conversation_id, exc)
            self._remove(path)
            return False
        return True

    def _remove(self, path: Path) -> None:
        try:
            check_private_dir(self.folder)  # never unlink inside a folder someone else controls
            os.unlink(path)  # a symlink itself, never what it points to
        except (BriskError, OSError):
            pass

    def _prune(self, *, partials_before: float) -> None:
        """Keep the newest `max_files` caches; remove symlinks (dangling or not) and partial
        files older than `partials_before` (a crash's leftovers); skip anything else."""
        caches: list[tuple[float, Path]] = []
        with os.scandir(self.folder) as entries:
            for entry in entries:
                path = Path(entry.path)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                if stat.S_ISLNK(info.st_mode):
                    if CACHE_NAME.fullmatch(entry.name) or entry.name.endswith(PARTIAL_SUFFIX):
                        self._remove(path)  # Brisk never makes links: someone planted it
                elif not stat.S_ISREG(info.st_mode):
                    continue
                elif entry.name.endswith(PARTIAL_SUFFIX):
                    if info.st_mtime < partials_before:
                        self._remove(path)
                elif CACHE_NAME.fullmatch(entry.name):
                    caches.append((info.st_mtime, path))
        caches.sort(key=lambda pair: pair[0], reverse=True)
        for _, old in caches[self.max_files :]:
            self._remove(old)
