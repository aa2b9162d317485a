"""Speculation costs measured on this machine, kept across restarts in
BRISK_HOME/speculation_costs.json.

`auto` learns a pair's draft-step and verify costs by scouting and probing, which on a CPU
costs whole target steps (a 16-token scout of Qwen-0.5B took ~0.6 s beside a 0.1 s step of
the 1.5B). Learned once, a pair that cannot pay decodes plainly from the first token of
every later conversation, also after the app restarts. Each cost is stored with how many
cycles measured it (controller.py pools a new turn's with it: one slow cycle moves it a
little). The file is a cache: a damaged one is ignored (and replaced at the next save),
never an error.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from brisk.engine.accel.speculative.controller import PairCosts

log = logging.getLogger(__name__)

FILE_NAME = "speculation_costs.json"
# 2: draft steps timed without the catch-up a proposal used to read first (version 1 files
# could hold a 0.5B draft's step at ~5x its 1.5B target's, and never measure it again)
VERSION = 2


def default_path() -> Path:
    from brisk.engine.models.store import brisk_home

    return brisk_home() / FILE_NAME


class StoredPairCosts(PairCosts):
    """PairCosts read from `path`; `save()` writes them back when they changed."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        super().__init__(_read(self.path))
        self._written = _encode(self.pairs())

    def save(self) -> None:
        encoded = _encode(self.pairs())
        if encoded == self._written:
            return
        staged = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            staged.write_text(encoded)
            os.replace(staged, self.path)  # a crash mid-write never leaves half a file
            self._written = encoded
        except OSError as exc:  # a read-only home: the costs hold for this run only
            log.warning("cannot store speculation costs in %s: %s", self.path, exc)


def _encode(by_pair: dict[tuple, dict]) -> str:
    pairs = [
        {
            "target": target,
            "draft": draft,
            "verify": verify,
            "draft_steps": costs["draft_steps"],
            "verify_steps": {str(m): steps for m, steps in sorted(costs["verify_steps"].items())},
            "draft_samples": costs["draft_samples"],
            "verify_samples": {str(m): n for m, n in sorted(costs["verify_samples"].items())},
        }
        for (target, draft, verify), costs in sorted(by_pair.items(), key=lambda item: repr(item[0]))
    ]
    return json.dumps({"version": VERSION, "pairs": pairs}, indent=1)


def _read(path: Path) -> dict[tuple, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # damaged: measure again rather than trust it
        log.warning("ignoring %s: %s", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("pairs"), list):
        log.warning("ignoring %s: not a version %d speculation costs file", path, VERSION)
        return {}
    by_pair = {}
    for entry in data["pairs"]:
        parsed = _pair(entry)
        if parsed is None:
            log.warning("ignoring a malformed entry in %s: %.200r", path, entry)
            continue
        by_pair[parsed[0]] = parsed[1]
    return by_pair


def _steps(value) -> float | None:
    """A cost in target steps: a finite positive number (bools and strings are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _pair(entry) -> tuple[tuple, dict] | None:
    if not isinstance(entry, dict):
        return None
    target, draft, verify = entry.get("target"), entry.get("draft"), entry.get("verify")
    if not isinstance(target, str) or not (draft is None or isinstance(draft, str)) or not isinstance(verify, str):
        return None
    draft_steps = entry.get("draft_steps")
    if draft_steps is not None and _steps(draft_steps) is None:
        return None
    verify_steps = entry.get("verify_steps")
    if not isinstance(verify_steps, dict):
        return None
    parsed: dict[int, float] = {}
    for m, steps in verify_steps.items():
        if not _length(m) or _steps(steps) is None:
            return None
        parsed[int(m)] = float(steps)
    # how many cycles measured each cost (absent in files written before they were counted)
    draft_samples, verify_samples = entry.get("draft_samples", 0), entry.get("verify_samples", {})
    if not _count(draft_samples) or not isinstance(verify_samples, dict):
        return None
    if not all(_length(m) and int(m) in parsed and _count(n) for m, n in verify_samples.items()):
        return None
    return (target, draft, verify), {
        "draft_steps": _steps(draft_steps),
        "verify_steps": parsed,
        "draft_samples": draft_samples,
        "verify_samples": {int(m): n for m, n in verify_samples.items()},
    }


def _length(m) -> bool:
    """A verify length as the file spells it: "1" to "64"."""
    return isinstance(m, str) and m.isdigit() and 0 < int(m) <= 64


def _count(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0
