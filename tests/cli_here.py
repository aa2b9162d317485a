"""`brisk ...` run in this process, answering as a subprocess would (exit status, stdout,
stderr): for checks of what the command refuses or reports without a turn to run.

Why: each `python -m brisk.engine.host.cli` a test starts is a fresh interpreter importing mlx,
transformers and the engine, ~2.5 CPU-seconds before it reads its first argument, and CI runs
the engine's tests twice (once per kernel plan). The tests that need a fresh process (a whole
turn as a user runs it, the exit paths, import-time checks, the console script) still start one.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from unittest import mock


@dataclass
class Done:
    """What subprocess.run would have returned, in the fields the tests read."""

    returncode: int
    stdout: str
    stderr: str


def brisk_here(home: Path, *args: str) -> Done:
    """`brisk ARGS` with BRISK_HOME=home, through the entry point `python -m brisk.engine.host.cli` runs
    (brisk.engine.host.cli.main_interruptible): its exit status, and what it printed on each stream."""
    from brisk.engine.host import cli
    from brisk.kernels import compile_notice

    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # the CLI sets up its own console logging
    try:
        with (
            mock.patch.dict(os.environ, {"BRISK_HOME": str(home)}),
            # the CLI's process-wide compile listener would outlive this call here
            mock.patch.object(compile_notice, "listen_always", lambda listener: None),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                status = cli.main_interruptible(list(args))
            except SystemExit as exit_:  # argparse's usage errors, as sys.exit ends a process
                code = exit_.code
                if isinstance(code, str):
                    print(code, file=err)
                status = 1 if isinstance(code, str) else int(code or 0)
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
    return Done(status, out.getvalue(), err.getvalue())
