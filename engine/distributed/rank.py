"""One rank of `brisk run --ranks N` / `--hostfile`: `python -m brisk.engine.distributed.rank
<brisk arguments>`, started by `mlx.launch` on every host.

It joins MLX's ring, then runs the very `brisk` command the user typed (without --ranks):
the loader reads only this rank's shard of the weights (engine/distributed/loading.py) and
every rank takes the same path through the turn (engine/distributed/lockstep.py). Rank 0's
output is the user's; the other ranks' stdout is dropped and their stderr lines say which
rank and host they come from.
"""

from __future__ import annotations

import io
import os
import sys


class PrefixedLines(io.TextIOBase):
    """A text stream writing each line to `target` behind `prefix`."""

    def __init__(self, target, prefix: str):
        self.target, self.prefix, self.at_line_start = target, prefix, True

    def write(self, text: str) -> int:
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                self.target.write(self.prefix)
            self.target.write(piece)
            self.at_line_start = piece.endswith("\n")
        self.target.flush()
        return len(text)

    def flush(self) -> None:
        self.target.flush()


def main(argv: list[str]) -> int:
    from brisk.engine.distributed.group import join, tell
    from brisk.engine.distributed.lockstep import pin_speculation_clock

    rank = join()
    if rank.rank != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (for the process's life)
        sys.stderr = PrefixedLines(sys.__stderr__, f"[rank {rank.rank} on {rank.host}] ")
    pin_speculation_clock(rank)
    from brisk.engine.host.cli import main as brisk_main

    code = brisk_main(argv)
    sys.stdout.flush()
    tell("exit", code)
    return code


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stderr.flush()
    # MLX's ring threads may still hold sockets to ranks that already left: skip the
    # interpreter's teardown, which could wait on them.
    os._exit(code)
