"""The `brisk serve` command."""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from brisk.engine.api.errors import BriskError
from brisk.engine.api.settings import DEFAULT_MODEL_ID

API_KEY_ENV = "BRISK_API_KEY"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_serve_parser(sub) -> None:
    from brisk.engine.host.serve.app import MAX_BODY_BYTES
    from brisk.engine.host.serve.scheduler import DEFAULT_CACHE_BYTES

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP API on this machine")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless an API key is set)")
    serve.add_argument("--port", type=int, default=8088)
    serve.add_argument("--model", default=DEFAULT_MODEL_ID, help="model for requests that name none")
    serve.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` (needed to bind beyond loopback); other users can read "
        f"a command line: prefer --api-key-file or ${API_KEY_ENV}",
    )
    serve.add_argument(
        "--api-key-file",
        type=Path,
        metavar="PATH",
        help="read the API key from this file (only its owner may read it: chmod 600)",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients may use besides loopback names and IP addresses (repeatable)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page origin (https://app.example) whose scripts may call the API (repeatable); "
        "pages are refused otherwise",
    )
    serve.add_argument("--max-body", type=int, default=MAX_BODY_BYTES, help="largest request body in bytes")
    serve.add_argument(
        "--cache-bytes",
        type=int,
        default=DEFAULT_CACHE_BYTES,
        help="prompt caches kept across requests, in bytes (least recently used dropped)",
    )
    from brisk.engine.distributed.cli import add_rank_args

    add_rank_args(serve)  # rank 0 serves, the others follow (engine/distributed/serve_front.py)
    # the seed every rank shares, set by the launcher (requests without one get one from rank 0)
    serve.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    serve.set_defaults(func=cmd_serve)


def read_key_file(path: Path) -> str:
    try:
        info = path.stat()
        if os.name == "posix" and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise BriskError(f"{path} can be read or changed by other users: `chmod 600 {path}`, then try again")
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise BriskError(f"Cannot read the API key file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise BriskError(f"The API key file {path} is not UTF-8 text") from exc
    if not key:
        raise BriskError(f"The API key file {path} is empty")
    return key


def resolve_api_key(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key from --api-key, --api-key-file or $BRISK_API_KEY (at most one of the options)."""
    key_file = getattr(args, "api_key_file", None)
    if args.api_key is not None and key_file is not None:
        raise BriskError("Give the API key once: --api-key or --api-key-file, not both")
    if key_file is not None:
        return read_key_file(key_file)
    if args.api_key is not None:
        if not args.api_key.strip():
            raise BriskError("--api-key is empty")
        return args.api_key
    return environ.get(API_KEY_ENV, "").strip() or None


def check_binding(args: argparse.Namespace) -> None:
    if not is_loopback(args.host) and not args.api_key:
        raise BriskError(
            f"Binding to {args.host} lets other machines use this one's models: "
            f"give an API key (--api-key-file PATH or ${API_KEY_ENV}; clients send `Authorization: Bearer KEY`), "
            "or keep the default 127.0.0.1"
        )
    from brisk.engine.host.serve.guard import parse_origin  # here: Starlette loads only for `brisk serve`

    try:
        args.allowed_origin = [parse_origin(o) for o in getattr(args, "allowed_origin", [])]
    except ValueError as exc:
        raise BriskError(str(exc)) from exc
    if "*" in args.allowed_origin and not args.api_key:
        raise BriskError("--allowed-origin '*' lets every web page use this server: it needs an API key")
    if getattr(args, "max_body", 1) < 1:
        raise BriskError(f"--max-body must be a positive number of bytes (got {args.max_body})")
    if getattr(args, "cache_bytes", 0) < 0:
        raise BriskError(f"--cache-bytes must be 0 or more (got {args.cache_bytes})")
    if not 0 < args.port < 65536:
        raise BriskError(f"--port must be between 1 and 65535 (got {args.port})")


def check_can_serve(args: argparse.Namespace) -> None:
    """What would otherwise fail after the banner: a default model that is not installed (every
    request would get a 404) and a port this machine cannot listen on (uvicorn's raw error)."""
    import socket

    from brisk.engine.host.serve.app import installed_or_default
    from brisk.engine.models.store import ModelStore

    if not installed_or_default(args.model):
        ModelStore().get(args.model)  # ModelNotFound, naming what is installed
    try:
        family, kind, proto, _, address = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise BriskError(f"Cannot listen on {args.host}:{args.port} ({why}): pick another --host or --port") from exc


def cmd_serve(args) -> int:
    import uvicorn

    from brisk.engine.distributed import cli as ranks
    from brisk.engine.distributed.group import current
    from brisk.engine.host.serve.app import Server
    from brisk.engine.host.serve.connections import make_config
    from brisk.engine.host.serve.scheduler import EngineQueue

    args.api_key = resolve_api_key(args)
    check_binding(args)
    if current() is None:  # the process users start (a rank's port is the front's to choose)
        check_can_serve(args)
    if ranks.wants_ranks(args):  # this brisk is the front; each rank runs this command
        from brisk.engine.distributed.serve_front import serve_on_ranks

        return serve_on_ranks(args)
    rank, refusal, on_ranks = current(), None, {}
    if rank is not None:
        from brisk.engine.distributed import serve_lockstep

        worker = serve_lockstep.rank_worker()
        if rank.rank != 0:
            return serve_lockstep.follow(rank, worker)
        on_ranks = {
            "execute": serve_lockstep.leader_execute(rank, worker),
            "idle": serve_lockstep.leader_idle(rank),
            "idle_every_s": serve_lockstep.IDLE_TICK_S,
        }
        refusal = functools.partial(ranks.split_refusal, size=rank.size)
    queue = EngineQueue(cache_bytes=args.cache_bytes, **on_ranks)
    server = Server(
        queue,
        default_model=args.model,
        api_key=args.api_key,
        max_body=args.max_body,
        refusal=refusal,
        allowed_hosts=[args.host, *args.allowed_host],
        allowed_origins=args.allowed_origin,
    )
    where = f"http://{args.host}:{args.port}/v1"
    print(
        f"Brisk serves {args.model} at {where} (OpenAI-compatible"
        + (", API key required)" if args.api_key else ", loopback only)"),
        flush=True,
    )
    try:
        uvicorn.Server(make_config(server.app(), host=args.host, port=args.port)).run()
    finally:
        queue.close()
        if rank is not None:
            from brisk.engine.distributed.serve_lockstep import stop_followers

            stop_followers(rank)
    return 0
