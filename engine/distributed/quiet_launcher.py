"""`mlx.launch`, without its relay threads spinning: what Brisk starts its ranks with.

mlx.launch relays each rank's stdin from a thread that select()s on the rank's stdin pipe
for writing every turn, with or without anything to write. A pipe is nearly always
writable, so each thread loops without sleeping: an idle `brisk serve --ranks 2` burned
~44% of a core. Brisk writes to its ranks' stdin only for a chat (`brisk chat --ranks`;
otherwise it holds mlx.launch's own open and silent, engine/distributed/launch.py), so
here that select never waits on writing; for a chat it waits up to RELAY_POLL_S on reading
before it looks whether the rank's pipe takes what the user typed.
"""

from __future__ import annotations

import os
import sys

from brisk.engine.api.errors import BriskError
from brisk.engine.runtime.mlx_hooks import check_hooks_of

STDIN_ENV = "BRISK_LAUNCH_STDIN"  # "relay": a chat, whose ranks read what the user types
RELAY_POLL_S = 0.05


def main() -> int:
    try:
        check_hooks_of("brisk.engine.distributed.quiet_launcher")
    except BriskError as exc:
        print(f"brisk: error: {exc}", file=sys.stderr)
        return 1
    from mlx._distributed_utils import launch

    select = launch.select
    relay = os.environ.get(STDIN_ENV) == "relay"

    def select_never_writing(rlist, wlist, xlist, timeout=None):
        if relay and wlist:  # a chat: typed lines reach the rank within RELAY_POLL_S
            wait = RELAY_POLL_S if timeout is None else min(timeout, RELAY_POLL_S)
            readable, _, errors = select(rlist, [], xlist, wait)
            return readable, select([], wlist, [], 0)[1], errors
        readable, _, errors = select(rlist, [], xlist, timeout)
        return readable, [], errors

    launch.select = select_never_writing  # engine/runtime/mlx_hooks.py lists it
    launch.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
