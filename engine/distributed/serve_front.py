"""`brisk serve --ranks N` / `--hostfile hosts.json`: the public server in front of the ranks.

Rank 0 runs Brisk's ordinary server (engine/host/serve/) on a loopback port of this machine and
leads the other ranks (serve_lockstep.py). This process holds the public port and forwards
each request to rank 0 unchanged, so the API and its security are the server's own: the
guard (Host, Origin, Content-Type) and the API key are checked here and again by rank 0.

It exists because a rank cannot outlive its group (serve_group.py): when a rank dies, this
process is what stays up. A request the failure cut off gets an error naming the rank and
host (a JSON error, or a final error event in a stream); later requests get 503 with the
same reason until the group is back, and /health says `regrouping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http.client
import json
import signal
import socket
from pathlib import Path
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from brisk.engine.api.errors import BriskError
from brisk.engine.distributed.scratch import SERVE_PREFIX, private_folder
from brisk.engine.distributed.serve_group import RankGroup
from brisk.engine.host.serve.app import READING_BUDGET, read_capped_body
from brisk.engine.host.serve.guard import make_middleware
from brisk.engine.host.serve.requests import ApiError

# Headers a proxy must not pass on (RFC 9110 7.6.1), and CORS headers this server sets itself.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
KEPT_FROM_RANK0 = {"content-type", "cache-control", "retry-after"}
# A stream that ends without this lost rank 0 on the way.
STREAM_END = b"data: [DONE]"


def unavailable(message: str) -> JSONResponse:
    return JSONResponse(
        ApiError(503, message, code="ranks_unavailable", kind="server_error").body(),
        status_code=503,
        headers={"Retry-After": "5"},
    )


class Front:
    def __init__(self, group: RankGroup, *, api_key: str | None, max_body: int, allowed_hosts, allowed_origins):
        self.group, self.api_key, self.max_body = group, api_key, max_body
        # bodies held while they arrive, all connections together (the server's own budget, app.py)
        self.reading, self.reading_budget = 0, max(4 * max_body, READING_BUDGET)
        self.allowed_hosts, self.allowed_origins = list(allowed_hosts), list(allowed_origins)
        # how long a request that lost rank 0 waits for the launcher to name the failed rank
        self.blame_wait_s = group.rank_timeout + 10.0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self.health),
                Route("/{path:path}", self.forward, methods=["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH"]),
            ],
            middleware=make_middleware(allowed_hosts=self.allowed_hosts, allowed_origins=self.allowed_origins),
        )

    def _key_matches(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        sent = request.headers.get("authorization", "").encode("latin-1", "replace")
        return hmac.compare_digest(sent, f"Bearer {self.api_key}".encode())

    def _refusal(self) -> JSONResponse:
        state = self.group.state
        why = f" ({self.group.error})" if self.group.error else ""
        if state == "regrouping":
            return unavailable(f"The ranks are regrouping after a failure{why}; try again shortly")
        return unavailable(f"The ranks are not serving (state: {state}){why}")

    # --- /health ---------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        ready = self.group.ready()
        status = 200 if ready else 503
        if not self._key_matches(request):
            return JSONResponse({"status": "ok" if ready else self.group.state}, status_code=status)
        body: dict = {"status": "ok" if ready else self.group.state}
        if ready:
            try:
                got = await asyncio.to_thread(self._ask_rank0_health, request.headers.get("authorization"))
                body.update({k: v for k, v in got.items() if k != "status"})
            except (OSError, ValueError, http.client.HTTPException):
                pass  # rank 0 went in between: the group's state says so next time
        body["ranks"] = self.group.describe()
        return JSONResponse(body, status_code=status)

    def _ask_rank0_health(self, authorization: str | None) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.group.port, timeout=5)
        try:
            conn.request("GET", "/health", headers={"Authorization": authorization} if authorization else {})
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    # --- everything else: forwarded to rank 0 ----------------------------------------------

    async def forward(self, request: Request) -> Response:
        if not self._key_matches(request):
            return JSONResponse(
                ApiError(
                    401, "Incorrect or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key"
                ).body(),
                status_code=401,
            )
        if not self.group.ready():
            return self._refusal()
        generation, port = self.group.generation, self.group.port
        try:
            body = await self._body(request)
        except ApiError as error:
            return JSONResponse(error.body(), status_code=error.status)
        except ClientDisconnect:
            return Response(status_code=499)
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
        conn = http.client.HTTPConnection("127.0.0.1", port)  # no timeout: a long answer is fine,
        # and the launcher's heartbeat watch ends a group that stops answering
        try:
            upstream = await self._unless_client_leaves(request, conn, _send, conn, request.method, path, body, headers)
        except (OSError, http.client.HTTPException):
            conn.close()
            return await self._lost(generation)
        if upstream is None:
            return Response(status_code=499)  # the client went away: nobody reads this
        kept = {k: v for k, v in upstream.getheaders() if k.lower() in KEPT_FROM_RANK0}
        if upstream.getheader("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(
                self._relay_stream(request, conn, upstream, generation), status_code=upstream.status, headers=kept
            )
        try:
            content = await self._unless_client_leaves(request, conn, upstream.read)
        except (OSError, http.client.HTTPException):
            return await self._lost(generation)
        finally:
            conn.close()
        if content is None:
            return Response(status_code=499)  # the client went away: nobody reads this
        if upstream.status >= 500 and b"[ring]" in content:  # rank 0 saw its peer go: name the cause
            return await self._lost(generation)
        return Response(content, status_code=upstream.status, headers=kept)

    async def _body(self, request: Request) -> bytes:
        return await read_capped_body(self, request)

    async def _why(self, generation: int) -> str:
        why = await asyncio.to_thread(self.group.why_ended, generation, self.blame_wait_s)
        return why or "rank 0 lost a peer rank"

    async def _lost(self, generation: int) -> JSONResponse:
        """Rank 0 was lost before any of the answer reached the client (perhaps before the request
        reached it: a rank that died idle leaves the group 'ready' for a moment)."""
        why = await self._why(generation)
        return unavailable(f"The ranks are regrouping after a failure ({why}); try again shortly")

    async def _unless_client_leaves(self, request: Request, conn, work, *args):
        """`work(*args)` in a thread (rank 0's headers, or its whole answer); None if the
        client left first, and then the connection to rank 0 is closed, which stops the answer."""
        running = asyncio.ensure_future(asyncio.to_thread(work, *args))
        while True:
            done, _ = await asyncio.wait({running}, timeout=0.1)
            if done:
                return running.result()
            if await request.is_disconnected():
                _abort(conn)
                with contextlib.suppress(Exception):
                    await running
                return None

    async def _relay_stream(self, request: Request, conn, upstream, generation: int) -> AsyncIterator[bytes]:
        """Rank 0's events as they come; a stream cut off (or ended by rank 0's ring error)
        ends here with an error event naming the rank that failed."""
        pending, ended, relayed = b"", False, False
        try:
            while True:
                try:
                    chunk = await asyncio.to_thread(upstream.read1, 65536)
                except (OSError, http.client.HTTPException):
                    chunk = b""
                if not chunk:
                    break
                pending += chunk
                while b"\n\n" in pending:
                    event, pending = pending.split(b"\n\n", 1)
                    if event.startswith(STREAM_END):
                        ended = True
                    elif event.startswith(b'data: {"error"') and b"[ring]" in event:
                        break  # rank 0's view of a lost peer: the launcher names the cause below
                    yield event + b"\n\n"
                    relayed = True
                else:
                    continue
                break
            if not ended:
                why = await self._why(generation)
                error = ApiError(
                    503,
                    f"The answer was cut off: {why}. The server is regrouping; try again shortly"
                    if relayed
                    else f"The ranks are regrouping after a failure ({why}); try again shortly",
                    code="ranks_unavailable",
                    kind="server_error",
                )
                yield f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
        finally:  # also when the client went away: closing tells rank 0, which stops the answer
            _abort(conn)


def _send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes, headers: dict):
    conn.request(method, path, body=body or None, headers=headers)
    return conn.getresponse()


def _abort(conn: http.client.HTTPConnection) -> None:
    """Close at once, waking a thread blocked reading it."""
    if conn.sock is not None:
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


# --- the command ---------------------------------------------------------------------------


def check_rank0_is_here(hosts) -> None:
    """Rank 0 serves on this machine's loopback, so the hostfile's first host must be this
    machine: one of its addresses must be one of ours."""
    for ip in hosts[0].ips:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family) as s:
            try:
                s.bind((ip, 0))
                return
            except OSError:
                continue
    raise BriskError(
        f"brisk serve --hostfile runs rank 0 here: the hostfile's first host ({hosts[0].ssh}, "
        f"{', '.join(hosts[0].ips)}) must be this machine"
    )


def serve_on_ranks(args) -> int:
    import uvicorn

    from brisk.engine.distributed.cli import check_model_splits
    from brisk.engine.distributed.hostfile import check_reachable, loopback, read_hostfile
    from brisk.engine.host.serve.connections import make_config

    if args.hostfile and args.ranks is not None:
        raise BriskError("Give --ranks (local ranks) or --hostfile (hosts), not both")
    if not (args.join_timeout > 0 and args.rank_timeout > 0):  # nan too: it would never time out
        raise BriskError("--join-timeout and --rank-timeout must be positive")
    hosts = read_hostfile(args.hostfile) if args.hostfile else loopback(args.ranks)  # both check the count
    if args.hostfile:
        check_rank0_is_here(hosts)
    check_reachable(hosts)
    check_model_splits(args.model, len(hosts))
    with private_folder(SERVE_PREFIX) as private:  # 0700; removes those a killed brisk left
        argv = list(args.argv)
        if args.api_key and "--api-key" not in argv and not any(a.startswith("--api-key") for a in argv):
            # the key came from $BRISK_API_KEY, which does not cross ssh: rank 0 reads it from a file
            key_file = Path(private) / "api-key"
            key_file.touch(mode=0o600)
            key_file.write_text(args.api_key, encoding="utf-8")
            argv += ["--api-key-file", str(key_file)]
        # rank 0 listens on loopback; clients' Host headers name the public address
        argv += ["--host", "127.0.0.1", "--allowed-host", args.host]
        group = RankGroup(
            lambda port: [*argv, "--port", str(port)],
            ranks=None if args.hostfile else args.ranks,
            hostfile=args.hostfile,
            hosts=[h.ssh for h in hosts],
            join_timeout=args.join_timeout,
            rank_timeout=args.rank_timeout,
        )
        # uvicorn raises SIGTERM again once it has stopped; its default action would end this
        # process before `finally` stops the ranks
        signal.signal(signal.SIGTERM, _exit_on_signal)
        group.start()
        try:
            group.wait_first()
            front = Front(
                group,
                api_key=args.api_key,
                max_body=args.max_body,
                allowed_hosts=[args.host, *args.allowed_host],
                allowed_origins=args.allowed_origin,
            )
            print(
                f"Brisk serves {args.model} at http://{args.host}:{args.port}/v1 on {len(hosts)} ranks "
                + ("(OpenAI-compatible, API key required)" if args.api_key else "(OpenAI-compatible, loopback only)"),
                flush=True,
            )
            config = make_config(front.app(), host=args.host, port=args.port, timeout_graceful_shutdown=5)
            uvicorn.Server(config).run()
        finally:
            group.close()
    return 0


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)
