"""`brisk` commands that other distributions add: `brisk bench ...` is the benchmarks' (bench/,
the `brisk-bench` distribution, issue 57). Brisk's wheel leaves them out and never imports them:
they announce their command under an entry-point group, and without them `brisk bench` says in
one line how to get them (tests/test_layering.py holds Brisk to never importing bench/)."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

GROUP = "brisk.commands"  # an entry point `name = module:add_parser`, add_parser(subparsers)
# The commands Brisk names even when they are missing, and how to get each.
KNOWN = {
    "bench": (
        "benchmarks",
        "from Brisk's source checkout, pip install -e ./bench (brisk-bench is not on PyPI; "
        "where it is published beside Brisk, pip install 'brisk[bench]')",
    ),
}


def add_extension_parsers(sub) -> None:
    """Each installed extension adds its parser; a known one that is missing, or one that does
    not import (a broken install must not take the other commands down), gets a stand-in."""
    found = {entry.name: entry for entry in entry_points(group=GROUP)}  # by name: one per command
    for name in sorted(found):
        try:
            add_parser = found[name].load()
        except ImportError as exc:
            _add_stand_in(sub, name, "does not load", f"brisk {name}: {found[name].value} does not load: {exc}")
            continue
        add_parser(sub)
    for name, (what, how) in KNOWN.items():
        if name not in found:
            _add_stand_in(sub, name, f"{what} (not installed)", f"brisk {name}: the {what} are not installed: {how}")


def _add_stand_in(sub, name: str, summary: str, message: str) -> None:
    """`brisk NAME ...`, whatever follows: the message in one line, exit status 2."""
    # No option characters: `brisk bench doc-qa --help` and the like reach the message instead
    # of argparse's usage errors.
    stand_in = sub.add_parser(name, help=summary, add_help=False, prefix_chars="\0")
    stand_in.add_argument("rest", nargs=argparse.REMAINDER)
    stand_in.set_defaults(func=lambda _args: _refuse(message))


def _refuse(message: str) -> int:
    print(message, file=sys.stderr)
    return 2
