"""Which requests the API answers at all: the defence against web pages (DNS rebinding and
cross-site requests) in front of the routes.

- Host: a page on attacker.example whose name is re-pointed at 127.0.0.1 (DNS rebinding)
  reaches the server with `Host: attacker.example`. Only loopback names, IP literals (a
  rebinding needs a name the attacker's DNS answers for), the bound host and the configured
  names are served.
- Origin: a browser names the page that sent a request. A page not on the allow-list gets
  403 before anything runs; allowed pages get CORS headers (Starlette's CORSMiddleware).
- Content-Type: a cross-site `text/plain` POST needs no preflight, so every POST must say
  `application/json` (415 otherwise); a browser sends that only after a preflight.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost",)
JSON_TYPE = "application/json"


def parse_origin(value: str) -> str:
    """An --allowed-origin as browsers send it (`scheme://host[:port]`, no path), or `*` for
    every page; ValueError for anything else, so no spelling of `*` gets past the key check."""
    text = value.strip().rstrip("/")
    if text == "*":
        return "*"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query or parts.fragment:
        raise ValueError(f"--allowed-origin {value!r} is not a web page's origin (like https://app.example:8443) or *")
    if "*" in parts.netloc or "@" in parts.netloc:
        raise ValueError(f"--allowed-origin {value!r}: an origin names one host, with no wildcard or user")
    return f"{parts.scheme}://{parts.netloc.lower()}"


def host_name(host_header: str) -> str | None:
    """The name in a Host header, without port or IPv6 brackets (None: not a host)."""
    try:
        parts = urlsplit(f"//{host_header}")
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return None
    return parts.hostname  # lower-cased by urlsplit


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _error(status: int, message: str, code: str) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


class RequestGuard:
    """ASGI middleware: refuses foreign Host names, foreign browser Origins and non-JSON POSTs."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()):
        self.app = app
        names = (host_name(h) or h.lower() for h in allowed_hosts)
        self.allowed_hosts = {*LOOPBACK_NAMES, *names}
        self.allowed_origins = {parse_origin(o) for o in allowed_origins}
        self.any_origin = "*" in self.allowed_origins

    def host_allowed(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without Host: not a browser (browsers always send it)
            return True
        name = host_name(header)
        return name is not None and (name in self.allowed_hosts or is_ip_literal(name))

    def origin_allowed(self, origin: str) -> bool:
        return self.any_origin or origin.rstrip("/") in self.allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = None
        if not self.host_allowed(headers.get("host")):
            refusal = _error(
                400,
                f"This server does not answer for the host {headers.get('host')!r} "
                "(brisk serve --allowed-host NAME adds one)",
                "host_not_allowed",
            )
        elif (origin := headers.get("origin")) is not None and not self.origin_allowed(origin):
            refusal = _error(
                403,
                f"Requests from web pages at {origin!r} are not allowed (brisk serve --allowed-origin ORIGIN adds one)",
                "origin_not_allowed",
            )
        elif scope["method"] == "POST" and _media_type(headers.get("content-type", "")) != JSON_TYPE:
            refusal = _error(
                415,
                f"The request body must be sent as Content-Type: {JSON_TYPE}",
                "unsupported_media_type",
            )
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def make_middleware(*, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()) -> list[Middleware]:
    """The guard, then CORS answers (preflights too) for the allowed origins."""
    origins = sorted({parse_origin(o) for o in allowed_origins})
    return [
        Middleware(RequestGuard, allowed_hosts=list(allowed_hosts), allowed_origins=origins),
        Middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["*"],  # the operator trusts these pages; the openai SDKs send x-stainless-* headers
            allow_private_network=True,  # Chrome asks before a public page may call a local address
            max_age=600,
        ),
    ]
