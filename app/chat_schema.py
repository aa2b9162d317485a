"""What a saved chat may hold, field by field: the types and ranges the app reads.

One set of rules, two uses. A JSON import is refused at its first bad value, with the field
named ("messages[3].metrics.ttft_s must be a number, not '0.4s'"). A database row that holds
a bad value anyway (an older Brisk, an edit with sqlite3) is read with that value replaced
and a note saying so: an infinite decode speed once reached the dashboard's chart, whose
paintEvent raised with its QPainter still open, and Qt crashed (SIGSEGV) at every start.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, fields
from functools import lru_cache
from typing import Callable

from brisk.engine.api.errors import BriskError, InvalidSettings
from brisk.engine.api.literal_types import FINISH_REASONS, SPARSE_OUTCOMES
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.api.settings import FIELD_TYPES, ChatSettings
from brisk.engine.models.store import validate_model_id

ROLES = ("system", "user", "assistant")
# Counts, bytes, seconds and rates: 2**53 holds 8 PiB, stays exact as a float, and keeps the
# dashboard's arithmetic far from float overflow (a 400-digit kv_bytes raised OverflowError).
MAX_NUMBER = 2**53
# Qt's spin boxes hold 32-bit ints: a larger max_tokens raised OverflowError in the settings panel.
MAX_INT_SETTING = 2**31 - 1
# A user message carries its attached documents (engine/turn/documents.py: 8M characters each).
MAX_CONTENT_CHARS = 64 * 2**20
MAX_TITLE_CHARS = 1000
MAX_NOTE_CHARS = 100_000  # a metric's words (kv_check, spec_decode ...) and a setting's text
MAX_LAYERS = 4096  # rows of a coverage map: one per drop layer (ChatSettings bounds them likewise)
MAX_DEPTH = 8  # nesting of the free-form `extra` metrics
SOURCES = ("", "draft", "lookup")

Problem = str | None  # what is wrong with a value, worded to follow its name; None: nothing


class UnreadableText(str):
    """Text from a database column that was not valid UTF-8, decoded with U+FFFD in its place."""


def decode_text(raw: bytes) -> str:
    """sqlite3's text_factory: one bad byte sequence in a row must not fail the whole query."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return UnreadableText(raw.decode("utf-8", "replace"))


# --- single values ----------------------------------------------------------------------


def shown(value) -> str:
    """A value as an error names it: JSON's words for containers, a short repr for the rest."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    if isinstance(value, str) and len(value) > 40:
        return repr(value[:40]) + "…"
    return repr(value)


def text_problem(value, *, max_chars: int = MAX_NOTE_CHARS) -> Problem:
    if not isinstance(value, str):
        return f"must be text, not {shown(value)}"
    if isinstance(value, UnreadableText):
        return "is not valid UTF-8"
    if len(value) > max_chars:
        return f"must be at most {max_chars:,} characters (it has {len(value):,})"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: SQLite cannot store it
        return f"holds {value[exc.start]!r} at character {exc.start}, which is not a character (UTF-8 cannot hold it)"
    return None


def number_problem(value, *, whole: bool = False, low: float = 0, high: float = MAX_NUMBER) -> Problem:
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return f"must be {kind}, not {shown(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, not {value}"
    if not low <= value <= high:
        return f"must be {kind} from {low:,} to {high:,}, not {shown(value)}"
    return None


def at(path: str, problem: str) -> str:
    """A problem under `path`: "messages[3].metrics" + ".ttft_s must be ..." or + " must be ..."."""
    return path + (problem if problem.startswith(("[", ".")) else " " + problem)


def one_of(choices: tuple) -> Callable[[object], Problem]:
    def check(value) -> Problem:
        return None if isinstance(value, str) and value in choices else f"must be one of {choices}, not {shown(value)}"

    return check


def list_of(item: Callable[[object], Problem], *, length: int | None = None) -> Callable[[object], Problem]:
    def check(value) -> Problem:
        if not isinstance(value, list) or length is not None and len(value) != length:
            return f"must be a list{f' of {length}' if length else ''}, not {shown(value)}"
        for i, v in enumerate(value):
            problem = item(v)
            if problem:
                return at(f"[{i}]", problem)
        return None

    return check


def object_problem(value) -> Problem:
    return plain_json_problem(value) if isinstance(value, dict) else f"must be an object, not {shown(value)}"


def plain_json_problem(value, depth: int = 0) -> Problem:
    """Free-form data (metrics' `extra`): JSON values the app can save and read back."""
    if depth > MAX_DEPTH:
        return f"nests deeper than {MAX_DEPTH} levels"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return number_problem(value, low=-MAX_NUMBER)
    if isinstance(value, str):
        return text_problem(value)
    if not isinstance(value, (dict, list)):
        return f"must be JSON data, not {shown(value)}"
    for key, v in value.items() if isinstance(value, dict) else enumerate(value):
        problem = text_problem(key) if isinstance(value, dict) else None
        if problem:
            return f"has a key that {problem}"
        problem = plain_json_problem(v, depth + 1)
        if problem:
            return at(f"[{key!r}]", problem)
    return None


# --- turn metrics (engine/api/metrics.py's TurnMetrics.to_dict()) ---------------------------


def count_problem(value) -> Problem:
    return number_problem(value, whole=True)


def counts(length: int) -> Callable[[object], Problem]:
    """[a, b, ...] of `length` counts. Checked in one pass first: a chat's history is read at
    every turn, and item by item its coverage runs cost 10x the JSON parsing."""
    slow = list_of(count_problem, length=length)

    def check(value) -> Problem:
        if (
            isinstance(value, list)
            and len(value) == length
            and all(type(v) is int and 0 <= v <= MAX_NUMBER for v in value)
        ):
            return None
        return slow(value)

    return check


def sources_problem(value) -> Problem:
    """Who proposed each answer token: one entry per token, so checked as a set first."""
    try:
        if isinstance(value, list) and set(value) <= set(SOURCES):
            return None
    except TypeError:  # an unhashable entry: the slow check names it
        pass
    return list_of(one_of(SOURCES))(value)


def coverage_problem(value) -> Problem:
    """engine/accel/coverage.py's map; {} for a turn without sparse prefill."""
    if not isinstance(value, dict):
        return f"must be an object, not {shown(value)}"
    checks = {
        "new_tokens": count_problem,
        "read_share": lambda v: number_problem(v, high=1),
        "layers": _layers_problem,
        "skipped": list_of(_skipped_problem),
    }
    for key, v in value.items():
        problem = checks[key](v) if key in checks else plain_json_problem(v)
        if problem:
            return at(f".{key}", problem)
    return None


RUNS = list_of(counts(2))  # [start, end) of the tokens a layer read


def _layers_problem(value) -> Problem:
    """[[layer, [[start, end], ...]], ...]: -1 for SpecPrefill's whole model."""
    if isinstance(value, list) and len(value) > MAX_LAYERS:
        return f"must hold at most {MAX_LAYERS} layers (it has {len(value):,})"
    return list_of(_layer_row_problem)(value)


def _layer_row_problem(row) -> Problem:
    if not isinstance(row, list) or len(row) != 2:
        return f"must be [layer, runs], not {shown(row)}"
    layer = number_problem(row[0], whole=True, low=-1, high=MAX_LAYERS)
    if layer:
        return at("[0]", layer)
    runs = RUNS(row[1])
    return at("[1]", runs) if runs else None


def _skipped_problem(item) -> Problem:
    if not isinstance(item, list) or len(item) != 3:
        return f"must be [start, end, text], not {shown(item)}"
    for i, check in enumerate((count_problem, count_problem, text_problem)):
        problem = check(item[i])
        if problem:
            return at(f"[{i}]", problem)
    return None


SPECIAL_METRICS: dict[str, Callable[[object], Problem]] = {
    "finish_reason": one_of(("", *FINISH_REASONS)),
    "sparse_outcome": one_of(SPARSE_OUTCOMES),
    "drops": list_of(counts(3)),  # [layer, tokens in, tokens kept]
    "coverage": coverage_problem,
    "sources": sources_problem,
    "extra": object_problem,
}
BY_DEFAULT_TYPE: dict[type, Callable[[object], Problem]] = {
    # Seconds, rates and shares may be a rounding error below 0 (flops_saved = 1 - sparse / dense);
    # a real negative one would be drawn far below the speed chart.
    float: lambda v: number_problem(v, low=-1),
    int: count_problem,
    str: text_problem,
    list: lambda v: plain_json_problem(v) if isinstance(v, list) else f"must be a list, not {shown(v)}",
    dict: object_problem,
}
METRIC_DEFAULTS = {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(TurnMetrics)}
# Every field TurnMetrics has, checked by what it holds (a new field is checked without an edit here).
METRIC_CHECKS = {name: SPECIAL_METRICS.get(name) or BY_DEFAULT_TYPE[type(d)] for name, d in METRIC_DEFAULTS.items()}


def metrics_problems(metrics: dict) -> dict[str, str]:
    """Field -> what is wrong, for the known fields (unknown ones are not read, and not kept)."""
    problems = {}
    for name, value in metrics.items():
        check = METRIC_CHECKS.get(name)
        problem = check(value) if check else None
        if problem:
            problems[name] = problem
    return problems


# --- chat settings: engine/api/settings.py's rules, and what the window can show --------------


def settings_problems(settings: dict) -> dict[str, str]:
    """Setting -> what is wrong, for the settings ChatSettings knows (it ignores the rest)."""
    known = {k: v for k, v in settings.items() if k in FIELD_TYPES}
    problems = {}
    try:
        ChatSettings.from_dict(known)  # the common case: all good, checked once
    except (InvalidSettings, ValueError):  # ValueError: a message naming an int of over 4300 digits
        for key, value in known.items():  # each alone, to name the one that is wrong
            try:
                ChatSettings.from_dict({key: value})
            except InvalidSettings as exc:
                reason = str(exc).removeprefix("Invalid chat settings: ")
                problems[key] = reason.removeprefix(f"{key} ")
            except ValueError:
                problems[key] = f"cannot be {shown(value)}"
    for key, value in known.items():
        if key in problems or value is None:
            continue
        problem = _window_problem(key, value)
        if problem:
            problems[key] = problem
    return problems


def remote_engine_id(value: str) -> str:
    """'remote:NAME', NAME as app/remote_client.py allows it (a chat's model on a server elsewhere)."""
    import re

    if not re.fullmatch(r"remote:[A-Za-z0-9][A-Za-z0-9._-]{0,39}", value):
        raise BriskError(f"Invalid remote engine id {shown(value)}")
    return value


def _window_problem(key: str, value) -> Problem:
    """What the engine's own checks allow but a model path, SQLite or a spin box cannot take."""
    if key in ("model", "draft"):
        try:
            if key == "model" and isinstance(value, str) and value.startswith("remote:"):
                remote_engine_id(value)  # a Brisk server elsewhere (app/remote_client.py)
            else:
                validate_model_id(value)
        except BriskError:
            return f"must be an installed model's id (lowercase letters, digits, '.', '_', '-'), not {shown(value)}"
    elif isinstance(value, str):
        return text_problem(value, max_chars=MAX_CONTENT_CHARS)
    elif FIELD_TYPES[key] is int and key != "seed":
        return number_problem(value, whole=True, low=-MAX_INT_SETTING, high=MAX_INT_SETTING)
    return None


# --- database rows (app/store.py), read so that the app only ever sees valid values -------


@dataclass
class Conversation:
    id: int
    title: str
    updated: float
    settings: dict


@dataclass
class StoredMessage:
    id: int
    role: str
    content: str
    finish_reason: str | None
    metrics: dict | None
    # What this row held that could not be read, in words for the user ("" when all is well).
    note: str = ""
    # False when its role or text could not be read: shown, but never sent to the model.
    sent: bool = True


def read_json_object(text) -> tuple[dict | None, bool]:
    """A stored JSON object, and whether the column held something unreadable instead."""
    if text is None or text == "":
        return None, False
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        value = None
    return (value, False) if isinstance(value, dict) else (None, True)


def read_text(value, default: str) -> tuple[str, bool]:
    """A text column, and whether it had to be repaired (bytes, a number, bad UTF-8)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace"), True
    if isinstance(value, UnreadableText):
        return str(value), True
    if isinstance(value, str):
        return value, False
    return (default if value is None else str(value)), True


def read_number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def read_settings(text) -> tuple[dict, list[str]]:
    """Saved settings without the ones that cannot be used, and their names."""
    if not isinstance(text, str):
        return {}, [] if text is None else ["all"]
    settings, problems = _read_settings_text(text)
    return json.loads(settings), list(problems)


@lru_cache(maxsize=1024)
def _read_settings_text(text: str) -> tuple[str, tuple[str, ...]]:
    """Cached by the row's text (the sidebar reads every chat's settings at each refresh: 1000
    chats took 0.2 s), as JSON so that no caller can change what the cache holds."""
    settings, unreadable = read_json_object(text)
    if settings is None:
        return "{}", ("all",) if unreadable else ()
    problems = settings_problems(settings)
    return json.dumps({k: v for k, v in settings.items() if k not in problems}), tuple(sorted(problems))


def read_metrics(text) -> tuple[dict | None, list[str]]:
    """A row's turn metrics, whole, and the names of the fields replaced by their defaults
    (["all"]: the column held no JSON object)."""
    if not isinstance(text, str):
        return None, [] if text is None else ["all"]
    cleaned, bad = _read_metrics_text(text)
    return (None if cleaned is None else json.loads(cleaned)), list(bad)


@lru_cache(maxsize=2048)
def _read_metrics_text(text: str) -> tuple[str | None, tuple[str, ...]]:
    """Cached by the row's text: a chat's whole history is read at every turn, and checking
    400 messages took 0.2 s. JSON, so that no caller can change what the cache holds."""
    metrics, unreadable = read_json_object(text)
    if not metrics:
        return None, ("all",) if unreadable else ()
    bad = metrics_problems(metrics)
    # Whole, as TurnMetrics.to_dict() gives it: the dashboard reads accepted_tokens wherever
    # draft_tokens is set, and rows from older Brisks (or imports) may lack either.
    usable = {k: v for k, v in metrics.items() if k in METRIC_CHECKS and k not in bad}
    return json.dumps({**METRIC_DEFAULTS, **usable}), tuple(bad)


def read_message(row: tuple) -> tuple[StoredMessage, list[str]]:
    """A messages row as the app's message, and what could not be read (also in its note)."""
    message_id, role, content, finish_reason, metrics_text = row
    unread: list[str] = []
    if role not in ROLES:
        unread.append(f"role {shown(role)}")
    content, repaired = read_text(content, "")
    if repaired:
        unread.append("text (shown as far as it could be decoded)")
    if finish_reason is not None and finish_reason not in FINISH_REASONS:
        unread.append(f"finish reason {shown(finish_reason)}")
        finish_reason = None
    metrics, bad = read_metrics(metrics_text)
    if bad:
        unread.append(" ".join(("turn metrics", ", ".join(n for n in bad if n != "all"))).strip())
    sent = role in ROLES and not repaired
    note = ""
    if unread:
        note = f"Could not be read from the chat database: {'; '.join(unread)}." + (
            "" if sent else " Shown here, but not sent to the model."
        )
    shown_role = role if role in ROLES else "assistant"
    return StoredMessage(message_id, shown_role, content, finish_reason, metrics, note, sent), unread
