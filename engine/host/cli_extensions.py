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
        "pip install 'brisk[bench]' (from a checkout: pip install -e ./bench)",
    ),
}


def add_extension_parsers(sub) -> None:
    """Each installed extension adds its parser; a known one that is missing gets a stand-in."""
    found = {entry.name: entry for entry in entry_points(group=GROUP)}
    for name in sorted(found):
        found[name].load()(sub)
    for name, (what, how) in KNOWN.items():
        if name not in found:
            _add_missing(sub, name, what, how)


def _add_missing(sub, name: str, what: str, how: str) -> None:
    message = f"brisk {name}: the {what} are not installed: {how}"
    # No option characters: `brisk bench doc-qa --help` and the like reach the one-line message
    # instead of argparse's usage errors.
    stand_in = sub.add_parser(name, help=f"{what} (not installed)", add_help=False, prefix_chars="\0")
    stand_in.add_argument("rest", nargs=argparse.REMAINDER)
    stand_in.set_defaults(func=lambda _args: _refuse(message))


def _refuse(message: str) -> int:
    print(message, file=sys.stderr)
    return 2
