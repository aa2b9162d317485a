"""OpenAI request bodies in, (messages, settings) out, or an ApiError saying what is wrong.

Every field is checked: an unknown one, a wrong type or a value the engine cannot honour
is refused with OpenAI's error shape and the HTTP status a client expects, never ignored.
Brisk's own controls ride in a `brisk` object and become the same ChatSettings the CLI
builds, so they are validated with the CLI's messages.

Before any field is read, the whole body is walked once (`check_values`): nesting, strings
that UTF-8 cannot carry (lone surrogates from `\\ud800` escapes) and non-finite numbers are
refused there, so nothing later (the model store, the tokenizer, the JSON encoder) meets them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from brisk.engine.api.conversation import Message
from brisk.engine.api.errors import BriskError
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.serve.stops import check_stops
from brisk.engine.models.store import validate_model_id

ROLES = ("system", "user", "assistant", "developer")
# A chat request nests 4 deep (body, messages, a message, its content parts); JSON's decoder
# and every later walk recurse per level, so a body nested 100,000 deep is refused here.
MAX_DEPTH = 32
MAX_MESSAGE_CHARS = 1000
PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a key a message may name as it is


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, and the offending parameter."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        if len(message) > MAX_MESSAGE_CHARS:  # a message quoting a client's megabyte value stays readable
            message = message[:MAX_MESSAGE_CHARS] + "..."
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Completion:
    """One parsed request, for either endpoint."""

    messages: list[Message]
    settings: ChatSettings
    stream: bool = False
    include_usage: bool = False
    stops: list[str] = field(default_factory=list)
    brisk: dict = field(default_factory=dict)  # the controls as the client sent them


def _check(condition: object, message: str, param: str) -> None:
    if not condition:
        raise ApiError(400, message, param=param)


def _shown(value: str, limit: int = 40) -> str:
    """A client's string in a one-line message: escaped (newlines too) and cut."""
    return repr(value[:limit]) + ("..." if len(value) > limit else "")


def check_values(body: Any) -> None:
    """The whole body, depth first without recursion: nesting, every string, every number."""
    pending: list[tuple[Any, str, int]] = [(body, "", 1)]
    while pending:
        value, path, depth = pending.pop()
        param = path or None
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                field_name = re.split(r"[.\[]", path, maxsplit=1)[0]
                raise ApiError(
                    400,
                    f"{field_name} nests deeper than {MAX_DEPTH} levels",
                    param=field_name,
                    code="nested_too_deeply",
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_string(key, _key_path(path, key))
                    pending.append((item, _key_path(path, key), depth + 1))
            else:
                pending.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_string(value, path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise ApiError(400, f"{path or 'The body'} must be a finite number (got {value})", param=param)


def _key_path(path: str, key: str) -> str:
    """`path.key`, or `path['odd key']` escaped and cut when a client's key is not a plain name."""
    if not PLAIN_KEY.fullmatch(key):
        return f"{path}[{_shown(key)}]"
    return f"{path}.{key}" if path else key


def _check_string(value: str, path: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer or response can carry it
        raise ApiError(
            400,
            f"{path or 'The body'} holds a lone surrogate (\\u{ord(value[exc.start]):04x} at character "
            f"{exc.start}), which is not text: send characters outside the BMP as a surrogate pair",
            param=path or None,
        ) from None


def _model_id(value: Any, param: str) -> str:
    """A model id by the store's rules (a folder name: no '..', no '/', no uppercase, <= 80)."""
    _check(isinstance(value, str) and value, f"{param} must be a model id (GET /v1/models lists them)", param)
    try:
        return validate_model_id(value)
    except BriskError:
        raise ApiError(
            400,
            f"{param} {_shown(value)} is not a model id: ids are lowercase letters, digits, '.', '_' and '-', "
            "at most 80 (GET /v1/models lists them)",
            param=param,
            code="invalid_model_id",
        ) from None


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    _check(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        f"{name} must be a number",
        name,
    )
    _check(low <= value <= high, f"{name} must be between {low:g} and {high:g} (got {value})", name)
    return float(value)


def _integer(body: dict, name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    _check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer", name)
    _check(low <= value <= high, f"{name} must be between {low} and {high} (got {value})", name)
    return value


# OpenAI fields a client may send that Brisk accepts only at their neutral value.
NEUTRAL = {
    "n": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "parallel_tool_calls": None,
    "echo": False,
    "best_of": 1,
    "suffix": None,
}
COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "user",
    "brisk",
    *NEUTRAL,
}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens"}
COMPLETION_FIELDS = COMMON | {"prompt"}


def _known_fields(body: Any, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        shown = ", ".join(k if PLAIN_KEY.fullmatch(k) else _shown(k) for k in unknown[:8])
        raise ApiError(400, f"Unrecognized request argument supplied: {shown}", param=_key_path("", unknown[0]))
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] not in (neutral, None):
            what = (
                "n must be 1: Brisk makes one answer per request"
                if name == "n"
                else f"{name} is not supported by Brisk (only {neutral!r})"
            )
            raise ApiError(400, what, param=name)
    return body


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or OpenAI's list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            _check(
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str),
                f"{where}.content[{i}] must be a text part (Brisk's models read text only)",
                where,
            )
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts", param=where)


def parse_messages(value: Any) -> tuple[str | None, list[Message]]:
    """(system prompt, the rest): leading system/developer messages become the system prompt."""
    _check(isinstance(value, list) and value, "messages must be a non-empty list", "messages")
    system: list[str] = []
    rest: list[Message] = []
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        _check(isinstance(item, dict), f"{where} must be an object", where)
        role = item.get("role")
        _check(role in ROLES, f"{where}.role must be one of {', '.join(ROLES)}", where)
        text = _content(item.get("content"), where)
        if role in ("system", "developer") and not rest:
            system.append(text)
        else:
            rest.append(Message("system" if role == "developer" else role, text))
    _check(bool(rest) and rest[-1].role == "user", "the last message must be the user's", "messages")
    return ("\n\n".join(system) or None), rest


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    _check(
        isinstance(stops, list) and all(isinstance(s, str) and s for s in stops),
        "stop must be a non-empty string or a list of them",
        "stop",
    )
    try:
        check_stops(stops)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="stop") from None
    return stops


BRISK_FIELDS = {
    "prefill",
    "keep",
    "draft",
    "spec_decode",
    "num_draft",
    "kv_bits",
    "k_bits",
    "v_bits",
    "lookup",
    "top_p_mass",
    "kv_group_size",
}
PREFILL = {
    "auto": ("auto", "auto"),
    "dense": ("off", "off"),
    "off": ("off", "off"),
    "specprefill": ("on", "off"),
    "uniprefill": ("off", "on"),
}


def _brisk_settings(controls: Any, settings: dict) -> dict:
    """Brisk's extra controls onto the settings dict (ChatSettings validates the values)."""
    if controls is None:
        return {}
    _check(isinstance(controls, dict), "brisk must be an object", "brisk")
    unknown = sorted(set(controls) - BRISK_FIELDS)
    _check(
        not unknown,
        f"Unknown brisk control(s): {', '.join(_key_path('', k) for k in unknown[:8])} "
        f"(known: {', '.join(sorted(BRISK_FIELDS))})",
        "brisk",
    )
    if "prefill" in controls:
        prefill = controls["prefill"]  # a list or object cannot be looked up: a 400, not a TypeError
        _check(
            isinstance(prefill, str) and prefill in PREFILL,
            f"brisk.prefill must be one of {', '.join(PREFILL)}",
            "brisk.prefill",
        )
        settings["sparse_prefill"], settings["uniprefill"] = PREFILL[controls["prefill"]]
    renames = {"keep": "sparse_keep", "top_p_mass": "uniprefill_p"}
    for name in (
        "keep",
        "draft",
        "spec_decode",
        "num_draft",
        "k_bits",
        "v_bits",
        "lookup",
        "top_p_mass",
        "kv_group_size",
    ):
        if name in controls:
            value = controls[name]
            if name == "draft" and value not in (None, ""):  # "" or null: no draft
                value = _model_id(value, "brisk.draft")
            settings[renames.get(name, name)] = value
    if "kv_bits" in controls:
        if controls["kv_bits"] == "auto":
            settings["kv_auto"] = True
        else:
            settings["kv_bits"] = controls["kv_bits"]
    return dict(controls)


def parse(body: Any, *, chat: bool, default_model: str) -> Completion:
    check_values(body)
    body = _known_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS)
    model = _model_id(body.get("model", default_model), "model")
    _check(isinstance(body.get("user", ""), str), "user must be a string", "user")
    if chat:
        system, messages = parse_messages(body.get("messages"))
    else:
        prompt = body.get("prompt")
        _check(isinstance(prompt, str) and prompt, "prompt must be a non-empty string", "prompt")
        system, messages = None, [Message("user", prompt)]
    settings: dict[str, Any] = {"model": model, "system_prompt": system, "chat_template": chat}
    plain = _integer(body, "max_tokens", 1, 1 << 20)  # checked even where the other one wins
    limit = _integer(body, "max_completion_tokens", 1, 1 << 20) if chat else None
    limit = limit if limit is not None else plain
    for name, value in (
        ("max_tokens", limit),
        ("temperature", _number(body, "temperature", 0, 2)),
        ("top_p", _number(body, "top_p", 0, 1)),
        ("seed", _integer(body, "seed", 0, 2**63 - 1)),
    ):
        if value is not None:
            settings[name] = value
    if settings.get("top_p") == 0:
        settings["top_p"] = 1e-6  # OpenAI allows 0 (greedy); the engine's range is (0, 1]
    stream = body.get("stream", False)
    _check(isinstance(stream, bool), "stream must be true or false", "stream")
    options = body.get("stream_options")
    options = {} if options is None else options
    _check(
        isinstance(options, dict) and set(options) <= {"include_usage"},
        "stream_options takes include_usage",
        "stream_options",
    )
    _check(
        isinstance(options.get("include_usage", False), bool), "include_usage must be true or false", "stream_options"
    )
    controls = _brisk_settings(body.get("brisk"), settings)
    try:
        validated = ChatSettings(**settings).validate()
    except (BriskError, TypeError) as exc:
        raise ApiError(400, str(exc), param="brisk" if controls else None) from exc
    return Completion(
        messages, validated, stream, bool(options.get("include_usage")), _stops(body.get("stop")), controls
    )
