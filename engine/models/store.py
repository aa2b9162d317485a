"""The model store: installed model folders and their catalog entries.

Layout under `brisk_home()`:
    models/<id>/            an MLX model folder plus `brisk.json` (its catalog entry)
    models/.staging-<id>/   an install in progress; moved into place only when complete
    cache/                  downloads (Hugging Face snapshots, PyPI wheels), resumable
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Iterator

from brisk.engine.api.errors import BriskError, BrokenModelFolder, ModelNotFound
from brisk.engine.models.folder import FolderInfo, inspect_folder

CATALOG_FILE = "brisk.json"
MODEL_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}")


def brisk_home() -> Path:
    """Where Brisk keeps its data: $BRISK_HOME, else the platform's user data dir."""
    override = os.environ.get("BRISK_HOME")
    if override:
        return Path(override).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("Brisk", appauthor=False))


@dataclass(frozen=True)
class CatalogEntry(FolderInfo):
    """What `models list` shows: the folder's description plus where it came from."""

    id: str
    source: str
    installed_at: float

    def to_dict(self) -> dict:
        return asdict(self)


# What each catalog field must hold: `models list` formats them (a dict there failed it for
# every model) and the loader reads them.
_ENTRY_TYPES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": (int, float), "bool": bool}


def _check_entry(entry: CatalogEntry, folder_id: str) -> None:
    """TypeError unless every field holds its declared type and the id is the folder's own
    (an entry claiming "../../etc" was listed under that id)."""
    for name, annotation in ((f.name, str(f.type)) for f in fields(entry)):
        value, wanted = getattr(entry, name), _ENTRY_TYPES.get(annotation)
        is_bool = isinstance(value, bool)
        if wanted is not None and (not isinstance(value, wanted) or (is_bool and annotation != "bool")):
            raise TypeError(f"{name} must be {annotation}, not {type(value).__name__}")
    if entry.id != folder_id:
        raise TypeError(f"it names the model {entry.id!r}, but its folder is {folder_id!r}")


def lock_file(handle) -> None:
    """An exclusive, non-blocking lock on an open file (BlockingIOError when held elsewhere)."""
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            raise BlockingIOError(str(exc)) from exc
    else:
        import fcntl

        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def unlock_file(handle) -> None:
    if sys.platform == "win32":
        import msvcrt

        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def validate_model_id(model_id: str) -> str:
    # fullmatch: `$` would accept an id ending in a newline
    if not isinstance(model_id, str) or not MODEL_ID_PATTERN.fullmatch(model_id) or ".." in model_id:
        raise BriskError(f"Invalid model id '{model_id}': use lowercase letters, digits, '.', '_' or '-' (max 80)")
    return model_id


def model_id_from_repo(repo_id: str) -> str:
    return validate_model_id(re.sub(r"[^a-z0-9._-]+", "-", repo_id.split("/")[-1].lower()).strip("-."))


class ModelStore:
    def __init__(self, home: Path | None = None):
        self.home = Path(home) if home else brisk_home()
        self.models_dir = self.home / "models"
        self.cache_dir = self.home / "cache"

    def path(self, model_id: str) -> Path:
        return self.models_dir / validate_model_id(model_id)

    def has(self, model_id: str) -> bool:
        return (self.path(model_id) / CATALOG_FILE).is_file()

    def get(self, model_id: str) -> CatalogEntry:
        folder = self.path(model_id)
        entry_file = folder / CATALOG_FILE
        if not entry_file.is_file():
            installed = ", ".join(e.id for e in self.list()) or "none"
            raise ModelNotFound(
                f"Model '{model_id}' is not installed (installed: {installed}). "
                "Try `brisk models install-bundled`, `brisk models pull REPO` or `brisk models import-gguf`."
            )
        try:
            entry = CatalogEntry(**json.loads(entry_file.read_text()))
            _check_entry(entry, model_id)
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            raise BrokenModelFolder(f"Catalog entry {entry_file} is corrupt ({exc}); reinstall the model") from exc
        if not entry.memory_bytes:  # written before entries knew their bits and memory
            info = inspect_folder(folder)
            entry = replace(entry, bits_per_weight=info.bits_per_weight, memory_bytes=info.memory_bytes)
        return entry

    def list(self) -> list[CatalogEntry]:
        if not self.models_dir.is_dir():
            return []
        entries = []
        for folder in sorted(self.models_dir.iterdir()):
            if folder.name.startswith(".") or not (folder / CATALOG_FILE).is_file():
                continue
            try:
                entries.append(self.get(folder.name))
            except BriskError:
                continue  # a corrupt entry must not hide the others; `get` reports it by name
        return entries

    def remove(self, model_id: str) -> None:
        folder = self.path(model_id)
        if folder.is_symlink():  # a link the user made: remove the link, never what it points to
            folder.unlink()
            return
        if not folder.is_dir():
            raise ModelNotFound(f"Model '{model_id}' is not installed")
        shutil.rmtree(folder)

    @contextmanager
    def staging(self, model_id: str, *, replace: bool = False) -> Iterator[Path]:
        """A scratch folder that becomes models/<id> only if the block succeeds."""
        final = self.path(model_id)
        self._remove_stale_staging()
        with self._install_lock(model_id):
            if final.exists() and not replace:
                raise BriskError(f"Model '{model_id}' is already installed; remove it first or choose another --id")
            stage = self.models_dir / f".staging-{model_id}"
            shutil.rmtree(stage, ignore_errors=True)
            stage.mkdir(parents=True)
            try:
                yield stage
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
            if final.is_symlink():
                final.unlink()
            elif final.exists():
                shutil.rmtree(final)
            stage.rename(final)

    def _remove_stale_staging(self) -> None:
        """Staging folders of installs that were killed (out of memory: a 10 M-token GGUF left
        one): no live install holds their lock."""
        for stage in self.models_dir.glob(".staging-*"):
            try:
                with self._install_lock(stage.name.removeprefix(".staging-")):
                    shutil.rmtree(stage, ignore_errors=True)
            except BriskError:
                continue  # being installed right now

    @contextmanager
    def _install_lock(self, model_id: str) -> Iterator[None]:
        """One install of an id at a time, across processes: the loser is told, not corrupted."""
        locks = self.home / "locks"  # beside models/, which holds only models and staging folders
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"install-{model_id}", "a+") as handle:
            try:
                lock_file(handle)
            except BlockingIOError:
                raise BriskError(
                    f"Model '{model_id}' is already being installed by another Brisk; wait for it to finish"
                ) from None
            try:
                yield
            finally:
                unlock_file(handle)

    def register(self, folder: Path, *, model_id: str, source: str) -> CatalogEntry:
        """Verify `folder` and write its catalog entry."""
        info = inspect_folder(folder)
        entry = CatalogEntry(id=model_id, source=source, installed_at=time.time(), **asdict(info))
        (folder / CATALOG_FILE).write_text(json.dumps(entry.to_dict(), indent=2))
        return entry

    def install_folder(self, source_folder: Path, *, model_id: str, source: str) -> CatalogEntry:
        """Copy an existing MLX model folder into the store."""
        inspect_folder(source_folder)  # refuse a broken folder before copying gigabytes
        with self.staging(model_id) as stage:
            for item in Path(source_folder).iterdir():
                if item.is_file() and item.name != CATALOG_FILE:
                    shutil.copy2(item, stage / item.name)
            self.register(stage, model_id=model_id, source=source)
        return self.get(model_id)
