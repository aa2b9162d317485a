"""Native kernels built ahead of time and shipped in a bundle (`kernels/prebuilt/`).

Most desktop users have no C++ compiler, so a bundle carries both native libraries
already built: the ctypes one (kernels/ctypes_library.py) and the MLX primitives
(kernels/mlx_extension.py). `packaging/build_kernels.py` compiles them into the folder
with `build_into` and writes a manifest that records, per file, its sha256, the digest
of the sources it was built from, the CPU features it was compiled for, and what it
must run beside (Python's ABI, and for the primitives the exact mlx).

A prebuilt file is loaded only when all of these hold on this machine, and only from a
folder and file no one else can write (the same rule as the kernel cache); the manifest
names it by a plain file name in its own folder, and neither may be a symlink. Otherwise
`lookup` says why not; the caller then builds locally (source installs) or keeps the
portable path, and `brisk info` reports which happened.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

FOLDER = Path(__file__).with_name("prebuilt")
MANIFEST = "manifest.json"


def folder() -> Path:
    """Where prebuilt kernels are looked for (`BRISK_PREBUILT_KERNELS` overrides it)."""
    return Path(os.environ.get("BRISK_PREBUILT_KERNELS") or FOLDER)


def sources_digest(sources: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def platform_tag() -> str:
    return f"{sys.platform}-{platform.machine().lower()}-{sys.implementation.cache_tag}"


def check_shipped(path: Path, *, follow: bool = True) -> None:
    """PermissionError unless `path` is owned by this user or root and writable by no
    one else: a library anyone could swap must never be loaded. With `follow=False` a
    symlink is refused too (what it points to could be anywhere)."""
    info = path.stat() if follow else path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(f"{path} is a symbolic link")
    if hasattr(os, "getuid") and info.st_uid not in (0, os.getuid()):
        raise PermissionError(f"{path} belongs to another user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})")


def shipped_file(where: Path, name: object) -> Path:
    """The manifest's `file` for a library: a plain file name, a regular file (not a symlink)
    right in the manifest's folder `where`, which only its owner can write. An absolute path,
    one with a folder or `..` in it, or a link into a folder others write was loaded once."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise PermissionError(f"the manifest names {name!r}, not a file name inside {where}")
    path = where / name
    check_shipped(path, follow=False)
    if not stat.S_ISREG(path.lstat().st_mode):
        raise PermissionError(f"{path} is not a regular file")
    if path.resolve().parent != where.resolve():  # e.g. a Windows drive or device name
        raise PermissionError(f"the manifest names {name!r}, which is not inside {where}")
    return path


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lookup(kind: str, sources: Iterable[Path], requires: dict[str, str], cpu: Iterable[str]) -> tuple[Path | None, str]:
    """(the prebuilt file for `kind`, "") when it can be trusted and fits this machine;
    (None, why not) otherwise. `requires` are the facts it must have been built for;
    `cpu` the features this CPU has."""
    where = folder()
    manifest = where / MANIFEST
    if not manifest.is_file():
        return None, "no prebuilt kernels in this install"
    try:
        check_shipped(where)
        check_shipped(manifest, follow=False)
        entry = json.loads(manifest.read_text())["libraries"][kind]
        path = shipped_file(where, entry["file"])
        if file_sha256(path) != entry["sha256"]:
            return None, f"prebuilt {path.name} does not match its recorded sha256"
    except (OSError, KeyError, ValueError, TypeError) as error:
        return None, f"prebuilt kernels unusable: {error}"
    if entry.get("sources") != sources_digest(sources):
        return None, f"prebuilt {path.name} was built from other kernel sources"
    for name, value in requires.items():
        if entry.get("requires", {}).get(name) != value:
            return None, f"prebuilt {path.name} was built for {name} {entry.get('requires', {}).get(name)}, not {value}"
    lacking = sorted(set(entry.get("cpu", ())) - set(cpu))
    if lacking:
        return None, f"prebuilt {path.name} needs CPU features this machine lacks: {', '.join(lacking)}"
    return path, ""


@dataclass
class Loaded:
    """What a loader got: the object (None: portable path), where it came from, and why."""

    value: object
    origin: str  # "prebuilt", "built locally", "fallback" or "off"
    path: str = ""
    note: str = ""


def load_first(
    kind: str,
    *,
    prebuilt: tuple[Path | None, str],
    open_file: Callable[[Path], object],
    build: Callable[[], tuple[object, Path]],
    errors: tuple[type[BaseException], ...],
) -> Loaded:
    """The prebuilt file when `lookup` found one that opens, else a local build, else the
    portable fallback; the note keeps every reason along the way."""
    path, why_not = prebuilt
    if path is not None:
        try:
            return Loaded(open_file(path), "prebuilt", str(path))
        except errors as error:
            why_not = f"prebuilt {path.name} did not load: {error}"
    try:
        value, built = build()
        return Loaded(value, "built locally", str(built), why_not)
    except errors as error:
        return Loaded(None, "fallback", "", f"{why_not}; building locally failed: {error}")
