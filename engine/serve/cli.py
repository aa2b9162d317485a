"""The `brisk serve` command."""

from __future__ import annotations

import argparse
import ipaddress

from engine.errors import BriskError
from engine.settings import DEFAULT_MODEL_ID


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_serve_parser(sub) -> None:
    from engine.serve.app import MAX_BODY_BYTES
    from engine.serve.scheduler import DEFAULT_CACHE_BYTES

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP API on this machine")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless --api-key is set)")
    serve.add_argument("--port", type=int, default=8088)
    serve.add_argument("--model", default=DEFAULT_MODEL_ID, help="model for requests that name none")
    serve.add_argument("--api-key", help="require `Authorization: Bearer KEY` (needed to bind beyond loopback)")
    serve.add_argument("--max-body", type=int, default=MAX_BODY_BYTES, help="largest request body in bytes")
    serve.add_argument(
        "--cache-bytes",
        type=int,
        default=DEFAULT_CACHE_BYTES,
        help="prompt caches kept across requests, in bytes (least recently used dropped)",
    )
    serve.set_defaults(func=cmd_serve)


def check_binding(args: argparse.Namespace) -> None:
    if not is_loopback(args.host) and not args.api_key:
        raise BriskError(
            f"Binding to {args.host} lets other machines use this one's models: "
            "give --api-key KEY (clients send `Authorization: Bearer KEY`), or keep the default "
            "127.0.0.1"
        )
    if not 0 < args.port < 65536:
        raise BriskError(f"--port must be between 1 and 65535 (got {args.port})")


def cmd_serve(args) -> int:
    import uvicorn

    from engine.serve.app import Server
    from engine.serve.scheduler import EngineQueue

    check_binding(args)
    queue = EngineQueue(cache_bytes=args.cache_bytes)
    server = Server(queue, default_model=args.model, api_key=args.api_key, max_body=args.max_body)
    where = f"http://{args.host}:{args.port}/v1"
    print(
        f"Brisk serves {args.model} at {where} (OpenAI-compatible"
        + (", API key required)" if args.api_key else ", loopback only)"),
        flush=True,
    )
    try:
        uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")
    finally:
        queue.close()
    return 0
