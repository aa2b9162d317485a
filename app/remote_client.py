"""A Brisk server elsewhere, as a chat's engine (issue 59): its address and key, kept in an
owner-only file, and one turn streamed over the server's OpenAI-compatible API
(`POST /v1/chat/completions` with `stream_options.include_usage`, whose last chunk carries
the `brisk` object: the turn's metrics and, when the server runs ranks, each rank's memory).

No Qt here: app/remote_engine.py runs `stream_turn` on a worker thread. http.client (the
stdlib) rather than urllib: it follows no redirect (the key never goes to another host) and
its socket can be shut from the GUI thread to stop a read that waits on the server.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from brisk.engine.host.serve.cli import is_loopback

REMOTE_PREFIX = "remote:"  # a chat's model id naming a remote engine: "remote:studio"
REMOTES_FILE = "remote_engines.json"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,39}")
CONNECT_TIMEOUT_S = 10.0
# The server answers a stream's headers only with its first token: a first request may load
# the model (or wait behind other clients) first, so a read waits this long before giving up.
READ_TIMEOUT_S = 300.0
MAX_LINE_BYTES = 1 << 20  # one SSE line (a chunk, or the last one with the metrics)
MAX_ERROR_CHARS = 300  # a server's error message, shown in one line


class RemoteError(Exception):
    """A remote turn that could not go on, in one line for the chat (no traceback)."""


def is_remote(model_id: str | None) -> bool:
    return bool(model_id) and str(model_id).startswith(REMOTE_PREFIX)


@dataclass(frozen=True)
class RemoteServer:
    name: str
    url: str  # http(s)://host:port, without /v1
    model: str = ""  # the server's model id; "": the server's default
    key: str = field(default="", repr=False)  # never in a repr, a log or a message

    @property
    def id(self) -> str:
        return REMOTE_PREFIX + self.name

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def where(self) -> str:
        """host:port, for messages and the dashboard."""
        parts = urlsplit(self.url)
        return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"

    def to_dict(self) -> dict:
        return {"name": self.name, "url": self.url, "model": self.model, "key": self.key}


def masked(key: str) -> str:
    """A key as shown: its last 4 characters at most, and only of a long key."""
    return "none" if not key else ("••••" + key[-4:] if len(key) >= 16 else "••••")


def make_remote(name: str, url: str, key: str = "", model: str = "") -> RemoteServer:
    """A checked RemoteServer, or ValueError saying in one line what is wrong."""
    name, url, key, model = name.strip(), url.strip().rstrip("/"), key.strip(), model.strip()
    if not NAME.fullmatch(name):
        raise ValueError("A name is 1 to 40 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"The address is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("The address must be http://host:port or https://host:port")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError("The address takes a host and port only (the key goes in its own box)")
    if port is None and parts.scheme == "http":
        url += ":8088"  # brisk serve's default port
    if not key and not is_loopback(parts.hostname):
        raise ValueError(
            f"{parts.hostname} is not this machine: its server needs an API key (brisk serve --api-key-file)"
        )
    if any(ord(c) < 33 or ord(c) > 126 for c in key):
        raise ValueError("The API key holds spaces or characters a header cannot carry")
    if model and not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,79}", model):
        raise ValueError("The model is a server's model id (lowercase letters, digits, '.', '_', '-'), or empty")
    return RemoteServer(name, url, model, key)


# --- kept across launches -------------------------------------------------------------------


def remotes_path():
    from brisk.engine.models.store import brisk_home

    return brisk_home() / REMOTES_FILE


def load_remotes() -> dict[str, RemoteServer]:
    """The saved remote engines by id; a damaged or unsafe file gives none (never raises)."""
    from brisk.engine.api.errors import BriskError
    from brisk.engine.runtime.private_files import read_private_file

    try:
        data = json.loads(read_private_file(remotes_path(), max_bytes=1 << 20))
    except (OSError, ValueError, BriskError):  # BriskError: a file someone else could have written
        return {}
    found = {}
    for item in data if isinstance(data, list) else []:
        try:
            server = make_remote(item["name"], item["url"], item.get("key", ""), item.get("model", ""))
        except (TypeError, KeyError, ValueError, AttributeError):
            continue
        found[server.id] = server
    return found


def save_remotes(servers) -> None:
    """Written owner-only (0600, in Brisk's private folder): the file holds API keys."""
    from brisk.engine.runtime.private_files import write_private_file

    data = json.dumps([s.to_dict() for s in servers], indent=1).encode()
    write_private_file(remotes_path(), data)


# --- one turn --------------------------------------------------------------------------------


def request_body(server: RemoteServer, messages: list, settings) -> dict:
    """The chat's messages and the settings the server's API takes. Settings it does not
    take (top-k, min-p, repetition penalty, a local draft) are left out: the panel disables them."""
    system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt else []
    body: dict = {
        "messages": system + [{"role": m.role, "content": m.content} for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
    }
    if settings.seed is not None:
        body["seed"] = settings.seed
    if server.model:
        body["model"] = server.model
    prefill = {"off": "dense", "on": "uniprefill", "auto": "auto"}[settings.uniprefill]
    brisk: dict = {"prefill": prefill, "spec_decode": settings.spec_decode, "lookup": settings.lookup}
    if settings.uniprefill_p is not None:
        brisk["top_p_mass"] = settings.uniprefill_p
    if not settings.kv_auto:  # auto: the server's own choice
        k_bits, v_bits = settings.kv_precision()
        brisk.update(kv_bits=min(k_bits, v_bits), k_bits=k_bits, v_bits=v_bits)
    body["brisk"] = brisk
    return body


class Stream:
    """One streamed turn. `pieces()` yields ("text", str) and then ("done", last chunk with
    usage and brisk); `close()` (from any thread) ends a read that waits on the server."""

    def __init__(self, server: RemoteServer):
        self.server = server
        self.conn: http.client.HTTPConnection | None = None
        self.closed = False

    def close(self) -> None:
        self.closed = True
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the worker's blocked read at once
            except OSError:
                pass

    def pieces(self, body: dict):
        s = self.server
        if self.closed:  # stopped before the request went out
            return
        parts = urlsplit(s.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.conn = kind(parts.hostname, parts.port, timeout=CONNECT_TIMEOUT_S)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if s.key:
            headers["Authorization"] = f"Bearer {s.key}"
        try:
            try:
                self.conn.connect()
                self.conn.sock.settimeout(READ_TIMEOUT_S)
                self.conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(), headers)
                response = self.conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                if self.closed:
                    return
                raise RemoteError(f"Cannot reach the remote engine {s.name} at {s.where}: {_reason(exc)}") from None
            if response.status != 200:
                raise RemoteError(_refusal(s, response.status, _error_text(response)))
            yield from self._events(response)
        finally:
            self.conn.close()

    def _events(self, response):
        s = self.server
        while True:
            try:
                line = response.readline(MAX_LINE_BYTES)
            except (OSError, http.client.HTTPException) as exc:
                if self.closed:
                    return
                raise RemoteError(f"The connection to {s.name} ({s.where}) broke mid-answer: {_reason(exc)}") from None
            if not line:
                if self.closed:
                    return
                raise RemoteError(
                    f"The connection to {s.name} ({s.where}) broke mid-answer: the server stopped sending"
                )
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # the blank line between events, or an SSE comment
            data = line[len(b"data:") :].strip()
            if data == b"[DONE]":
                return
            try:
                chunk = json.loads(data)
            except ValueError:
                raise RemoteError(f"{s.name} sent something that is not an answer chunk") from None
            if not isinstance(chunk, dict):
                raise RemoteError(f"{s.name} sent something that is not an answer chunk")
            if "error" in chunk:
                raise RemoteError(f"{s.name} stopped the answer: {_message(chunk)}")
            if "brisk" in chunk or "usage" in chunk:
                yield "done", chunk
                continue
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") if isinstance(choice, dict) else None
                if isinstance(text, str) and text:
                    yield "text", text


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "nothing is listening there (is brisk serve running?)"
    if isinstance(exc, socket.gaierror):
        return "no such host"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def _error_text(response) -> str:
    try:
        return _message(json.loads(response.read(64 << 10)))
    except (OSError, ValueError, http.client.HTTPException):
        return response.reason or ""


def _message(body) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    text = error.get("message") if isinstance(error, dict) else None
    text = " ".join(str(text or "").split())
    return text[:MAX_ERROR_CHARS] + ("…" if len(text) > MAX_ERROR_CHARS else "")


def _refusal(server: RemoteServer, status: int, message: str) -> str:
    said = f": {message}" if message else ""
    if status == 401:
        return (
            f"The remote engine {server.name} ({server.where}) refused the API key (401): "
            "check it in Models… > Remote engines"
        )
    if status == 503:
        later = "" if "try again" in message.lower() else "; try again shortly"
        return f"The remote engine {server.name} is not taking turns now (503){said}{later}"
    return f"The remote engine {server.name} answered {status}{said}"
