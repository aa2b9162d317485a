"""`mlx.launch`, without its relay threads spinning: what Brisk starts its ranks with.

mlx.launch relays each rank's stdin from a thread that select()s on the rank's stdin pipe
for writing every turn, with or without anything to write. A pipe is nearly always
writable, so each thread loops without sleeping: an idle `brisk serve --ranks 2` burned
~44% of a core. Brisk never writes to its ranks' stdin (it holds mlx.launch's own open
and silent, engine/distributed/launch.py), so here that select never waits on writing.
"""

from __future__ import annotations

from mlx._distributed_utils import launch

_select = launch.select


def _select_never_writing(rlist, wlist, xlist, timeout=None):
    readable, _, errors = _select(rlist, [], xlist, timeout)
    return readable, [], errors


def main() -> None:
    launch.select = _select_never_writing  # see engine/runtime/mlx_hooks.py
    launch.main()


if __name__ == "__main__":
    main()
