"""Where unexpected failures are written, so users see a sentence and a path, never a
Python traceback (the traceback is in the file, for a bug report)."""

from __future__ import annotations

import logging
import os
import stat
import time
import traceback
from pathlib import Path

LOG_NAME = "brisk-errors.log"
# The log is kept short: the newest failures are the ones a bug report needs.
MAX_LOG_BYTES = 2 * 2**20


def log_path() -> Path:
    from brisk.engine.models.store import brisk_home

    return brisk_home() / "logs" / LOG_NAME


def record_failure(exc: BaseException, *, context: str = "", detail: str = "") -> Path | None:
    """Append the traceback of `exc` (or `detail`) to the log; its path, or None if it cannot be written."""
    path = log_path()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > MAX_LOG_BYTES:
            os.replace(path, path.with_suffix(".log.1"))
        text = detail or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        # Never through a planted link, and never waiting on a FIFO; only a file that is ours.
        flags = os.O_CREAT | os.O_APPEND | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags, 0o600)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            os.close(fd)
            raise OSError(f"{path} is not a file of this user's; the error log is not written there")
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {context}\n{text}\n")
    except OSError:
        logging.getLogger(__name__).exception("could not write the error log")
        return None
    return path


def user_message(exc: BaseException, *, context: str = "", detail: str = "") -> str:
    """One line for the user: what failed, and where the details are."""
    path = record_failure(exc, context=context, detail=detail)
    where = f" (details in {path})" if path else ""
    return f"{context or 'Brisk'} failed unexpectedly: {type(exc).__name__}: {exc}{where}"


class _NoTracebacks(logging.Formatter):
    """Console lines without tracebacks: those are written to the error log instead."""

    def formatException(self, ei) -> str:  # noqa: N802 (logging's name)
        return ""

    def format(self, record: logging.LogRecord) -> str:
        record.exc_text = ""
        return super().format(record).rstrip()


def configure_console_logging(*, verbose: bool = False) -> None:
    """One stderr handler: warnings (info with --verbose), one line each; --verbose keeps tracebacks."""
    handler = logging.StreamHandler()
    fmt = "%(levelname)s %(message)s"
    handler.setFormatter(logging.Formatter(fmt) if verbose else _NoTracebacks(fmt))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler], force=True)
