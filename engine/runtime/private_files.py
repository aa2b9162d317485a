"""Folders and files only this user can change: where Brisk keeps chats, saved prompt
caches and their key.

A chat database given with `--database` may sit in a folder others can write (/tmp, mode
1777). There another user can plant what Brisk then trusts or writes through: a symlink
named like the caches folder (Brisk overwrote the file it points to), a file they own
(it keeps their ownership, so they read the chat's token ids), a database of their own.
The rule here, as OpenSSH applies it to ~/.ssh: a folder Brisk writes into must be a real
folder (not a symlink) owned by this user (or root) and writable by no one else; a file
found there must be a regular file of ours that no one else can write. New files are made
under a fresh name with O_EXCL | O_NOFOLLOW and renamed into place.

Group-writable is accepted only for a user-private group (the group named after its only
user, as Debian, Ubuntu and Fedora make with umask 002): no other user is in it.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from pathlib import Path

from brisk.engine.api.errors import UnsafeLocation

# Never follow a symlink at the last component; 0 where the platform lacks it (Windows).
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
CHECKS_OWNERS = hasattr(os, "geteuid") and sys.platform != "win32"


def ensure_private_dir(path) -> Path:
    """`path` as a folder only this user can write: created with mode 0700 (and any
    missing parents) when absent, else checked. UnsafeLocation when it is a symlink, not a
    folder, another user's, or writable by others; OSError when it cannot be created."""
    path = Path(path)
    try:
        os.lstat(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # made by another Brisk a moment ago: checked below like any other
    check_private_dir(path)
    return path


def check_private_dir(path) -> None:
    """UnsafeLocation unless `path` is a real folder of ours that no one else can write
    (FileNotFoundError when there is none)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeLocation(
            f"{path} is a symbolic link; Brisk writes its data only into a real folder (use the folder it points to)"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeLocation(f"{path} is not a folder")
    _check_owner_and_mode(path, info, "folder")


def check_owned_file(path) -> os.stat_result | None:
    """What `path` is (None: nothing there), when it is a regular file of ours that no one
    else can write; UnsafeLocation when it is a symlink, not a regular file, another user's,
    or writable by others."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeLocation(f"{path} is a symbolic link; Brisk opens only the real file")
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeLocation(f"{path} is not a regular file")
    _check_owner_and_mode(path, info, "file")
    return info


def _check_owner_and_mode(path, info: os.stat_result, what: str) -> None:
    if not CHECKS_OWNERS:
        return  # Windows: a user's data folder is private by its ACL; mode bits mean nothing there
    if info.st_uid not in (os.geteuid(), 0):
        raise UnsafeLocation(
            f"{path} belongs to another user (uid {info.st_uid}); Brisk keeps your data only in a {what} you own"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IWOTH or (mode & stat.S_IWGRP and not _group_is_owners_alone(info)):
        raise UnsafeLocation(
            f"{path} is writable by other users (mode {mode:o}); Brisk keeps your data only where no one "
            "else can change it: choose a folder of your own"
        )


def _group_is_owners_alone(info: os.stat_result) -> bool:
    """The owner's user-private group: named after the owner, its primary group, no other members."""
    try:
        import grp
        import pwd

        group, owner = grp.getgrgid(info.st_gid), pwd.getpwuid(info.st_uid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == owner.pw_name and owner.pw_gid == info.st_gid and not group.gr_mem


def new_private_file(folder, *, prefix: str, suffix: str) -> Path:
    """A new empty file (mode 0600, created with O_EXCL | O_NOFOLLOW) in the checked private
    `folder`, for writers that take a path (mlx saves by name); rename it into place with
    `os.replace` once complete."""
    folder = ensure_private_dir(folder)
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)  # 0600, O_EXCL, O_NOFOLLOW
    os.close(fd)
    return Path(name)


def write_private_file(path, data: bytes, *, replace: bool = True) -> Path:
    """Write `data` to `path` in its checked private folder: a fresh file under a temporary
    name, renamed into place (atomic: a reader sees the old file or the whole new one).
    With `replace=False` an existing file is kept (FileExistsError), as `os.link` keeps it."""
    path = Path(path)
    temp = new_private_file(path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with open(temp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if replace:
            check_owned_file(path)  # never rename over a planted directory or another user's file
            os.replace(temp, path)
        else:
            os.link(temp, path)  # fails when a file is there: two writers cannot both win
    finally:
        temp.unlink(missing_ok=True)
    return path


def read_private_file(path, *, max_bytes: int) -> bytes:
    """The bytes of a file of ours (checked, opened with O_NOFOLLOW); FileNotFoundError when
    absent, UnsafeLocation when someone else could have written it or it exceeds `max_bytes`."""
    try:
        fd = os.open(path, os.O_RDONLY | O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeLocation(f"{path} is a symbolic link; Brisk opens only the real file") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeLocation(f"{path} is not a regular file")
        _check_owner_and_mode(path, info, "file")
        if info.st_size > max_bytes:
            raise UnsafeLocation(f"{path} holds {info.st_size} bytes, more than the {max_bytes} expected")
        return os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
