"""The private scratch folders of the ranks' launchers, and those a killed `brisk` left behind.

`brisk run --ranks` and `brisk serve --ranks` write the ranks' hostfile (and a server's API
key file) in a 0700 folder under the temp directory. Killed outright (SIGKILL) they run no
`finally`, and the folder stays. Its name carries the owner's pid, so each start removes the
folders whose owner is gone: only these names, only this user's, never a live process's.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

RUN_PREFIX = "brisk-ranks-"
SERVE_PREFIX = "brisk-serve-ranks-"
# prefix, owner pid, tempfile's random part (which has no '-': folders named before the pid
# was, whose owner cannot be known, never match)
_OURS = re.compile(r"(?:brisk-ranks|brisk-serve-ranks)-(\d+)-[a-z0-9_]+")


def private_folder(prefix: str, *, where: str | None = None) -> tempfile.TemporaryDirectory:
    """A new 0700 folder named after this process (`prefix` + pid), once the stale ones are gone."""
    remove_stale(where)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-", dir=where)


def remove_stale(where: str | Path | None = None) -> list[Path]:
    """Remove the scratch folders under `where` (the temp directory) whose owner process is
    gone; the ones removed."""
    folder = Path(where or tempfile.gettempdir())
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    removed = []
    for entry in entries:
        match = _OURS.fullmatch(entry.name)
        if match is None:
            continue
        try:
            info = entry.lstat()  # a link is not ours to follow
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or _alive(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)  # another start may be removing it too
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    """True unless no process has this pid (another user's process counts as alive)."""
    if pid <= 0:
        return True  # kill(0 or -n) would signal groups: never ask that way
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True
