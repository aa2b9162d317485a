"""The OpenAI-compatible HTTP API (Starlette, served by uvicorn): `brisk serve`.

Each completion request becomes a job on the one engine thread (scheduler.py); its events
come back through an asyncio queue. A client that goes away cancels its job: the engine
checks the cancel flag between prefill chunks and tokens.

The event loop serves every client, so work that grows with a request (decoding and
checking its body, looking its model up on disk) runs in a worker thread; what stays on the
loop per token is bounded (stops.py). guard.py decides which requests are answered at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from typing import AsyncGenerator, AsyncIterator, Iterable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from brisk.engine.api.events import EngineErrored, TokenEmitted, TurnFinished
from brisk.engine.host.serve.guard import make_middleware
from brisk.engine.host.serve.requests import ApiError, Completion, parse
from brisk.engine.host.serve.scheduler import DONE, EngineQueue, Job
from brisk.engine.host.serve.stops import StopScanner

MAX_BODY_BYTES = 8 << 20  # a long document pasted into a chat fits; a runaway upload does not
READING_BUDGET = 256 << 20  # bodies arriving at once, all clients together (at least 4 x the cap)
POLL_S = 0.05  # how often a waiting request looks for its client having gone
FINISH = {"stop": "stop", "length": "length", "context": "length"}
# Engine error kinds and the HTTP status a client should see for them.
STATUS = {
    "context_overflow": 400,
    "invalid_settings": 400,
    "model_not_found": 404,
    "unsupported_model": 400,
    "chat_template": 400,
    "out_of_memory": 507,
    "download": 502,
}
CODES = {"context_overflow": "context_length_exceeded"}  # OpenAI's own name for it


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


class Server:
    def __init__(
        self,
        queue: EngineQueue,
        *,
        default_model: str,
        api_key: str | None = None,
        max_body: int = MAX_BODY_BYTES,
        reading_budget: int | None = None,
        known_model=None,
        refusal=None,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
    ):
        self.queue, self.default_model, self.api_key, self.max_body = queue, default_model, api_key, max_body
        # Bytes of request bodies held while they arrive, all connections together: up to a
        # thousand connections each one byte short of --max-body held 8 GiB (issue 54 trial).
        self.reading_budget = reading_budget if reading_budget is not None else max(4 * max_body, READING_BUDGET)
        self.reading = 0
        self.allowed_hosts, self.allowed_origins = list(allowed_hosts), list(allowed_origins)
        self.known_model = known_model or installed_or_default
        # why this server cannot run an installed model, or None (ranks: one that does not split)
        self.refusal = refusal or (lambda model_id: None)
        self.started = int(time.time())

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health),
            Route("/v1/models", self.models),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]
        return Starlette(
            routes=routes,
            middleware=make_middleware(allowed_hosts=self.allowed_hosts, allowed_origins=self.allowed_origins),
            exception_handlers={404: _not_found, 405: _not_allowed, Exception: _internal_error},
        )

    # --- small endpoints ----------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        if self.api_key is not None and not self._key_matches(request):
            return JSONResponse({"status": "ok"})  # liveness for anyone; the rest is for key holders
        return JSONResponse({"status": "ok", "model": self.default_model, **self.queue.stats()})

    async def models(self, request: Request) -> Response:
        if (denied := self._denied(request)) is not None:
            return denied
        from brisk.engine.models.store import ModelStore

        def servable():
            return [e for e in ModelStore().list() if self.refusal(e.id) is None]

        entries = await asyncio.to_thread(servable)
        data = [
            {
                "id": e.id,
                "object": "model",
                "created": self.started,
                "owned_by": "brisk",
                "brisk": {"architecture": e.architecture, "context_length": e.context_length, "dtype": e.dtype},
            }
            for e in entries
        ]
        return JSONResponse({"object": "list", "data": data, "brisk": self.queue.stats()})

    # --- completions --------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        try:
            if (denied := self._denied(request)) is not None:
                return denied
            body = await self._body(request)
            completion = await asyncio.to_thread(self._parse, body, chat)
        except ApiError as error:
            return error_response(error)
        except ClientDisconnect:  # it left (or its body was too slow) before sending it all
            return Response(status_code=499)  # nobody reads this
        turn = Turn(self, request, completion, chat=chat)
        return await (turn.stream() if completion.stream else turn.whole())

    def _parse(self, body: bytes, chat: bool) -> Completion:
        """The request, checked (in a worker thread: its cost grows with the body)."""
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"The request body is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise ApiError(400, "The request body is not valid JSON: nested too deeply") from exc
        completion = parse(data, chat=chat, default_model=self.default_model)
        for param, model in (("model", completion.settings.model), ("brisk.draft", completion.settings.draft)):
            if model and not self.known_model(model):
                raise ApiError(
                    404,
                    f"The model '{model}' does not exist (GET /v1/models lists them)",
                    param=param,
                    code="model_not_found",
                )
            if model and (why := self.refusal(model)):
                raise ApiError(400, why, param=param, code="unsupported_model")
        return completion

    async def _body(self, request: Request) -> bytes:
        return await read_capped_body(self, request)

    def _key_matches(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        # Header values arrive decoded as latin-1: encoding back gives the bytes the client sent.
        sent = request.headers.get("authorization", "").encode("latin-1", "replace")
        # Constant time: the time a wrong key takes to refuse must not say how much of it was right.
        return hmac.compare_digest(sent, f"Bearer {self.api_key}".encode())

    def _denied(self, request: Request) -> Response | None:
        if self._key_matches(request):
            return None
        return error_response(
            ApiError(401, "Incorrect or missing API key (send Authorization: Bearer KEY)", code="invalid_api_key")
        )


class Turn:
    """One request on the engine thread, and its answer back to the client."""

    def __init__(self, server: Server, request: Request, completion: Completion, *, chat: bool):
        self.server, self.request, self.completion, self.chat = server, request, completion, chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        client = request.client.host if request.client else "?"
        self.depth_at_submit = server.queue.depth()
        self.submitted = time.perf_counter()
        self.started_at: float | None = None
        self.job = server.queue.submit(
            Job(
                client,
                completion.messages,
                completion.settings,
                lambda event: loop.call_soon_threadsafe(self.events.put_nowait, event),
            )
        )
        self.scanner = StopScanner(completion.stops)
        self.checked = time.perf_counter()  # when the connection was last checked

    async def _next(self):
        """The job's next event; cancels the job (and returns DONE) if the client went away.

        The connection is checked every POLL_S even while tokens keep coming: a client
        waiting for a whole answer sends nothing else, so a steady stream of events must
        not hide that it left."""
        while True:
            if time.perf_counter() - self.checked >= POLL_S:
                self.checked = time.perf_counter()
                if await self.request.is_disconnected():
                    self.job.cancel.cancel()
                    return DONE
            try:
                event = await asyncio.wait_for(self.events.get(), POLL_S)
            except asyncio.TimeoutError:
                continue
            if self.started_at is None:
                self.started_at = time.perf_counter()
            return event

    async def _pieces(self) -> AsyncGenerator[tuple[str, object], None]:
        """("text", str) pieces, then ("done", TurnFinished) or ("error", ApiError)."""
        finished, error = None, None
        while (event := await self._next()) is not DONE:
            if isinstance(event, TokenEmitted):
                text = self.scanner.feed(event.text)
                if self.scanner.stopped:
                    self.job.cancel.cancel()  # the rest of the answer is not wanted
                if text:
                    yield "text", text
            elif isinstance(event, TurnFinished):
                finished = event
            elif isinstance(event, EngineErrored):
                client_side = STATUS.get(event.kind, 500) < 500
                error = ApiError(
                    STATUS.get(event.kind, 500),
                    event.message,
                    code=CODES.get(event.kind, event.kind),
                    kind="invalid_request_error" if client_side else "server_error",
                )
        if tail := self.scanner.flush():
            yield "text", tail
        if error is not None:
            yield "error", error
        elif finished is not None:
            yield "done", finished

    def finish_reason(self, finished: TurnFinished) -> str:
        if self.scanner.stopped:
            return "stop"
        return FINISH.get(finished.metrics.finish_reason, finished.metrics.finish_reason)

    def usage(self, finished: TurnFinished) -> dict:
        m = finished.metrics
        return {
            "prompt_tokens": m.prompt_tokens,
            "completion_tokens": m.generated_tokens,
            "total_tokens": m.prompt_tokens + m.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": m.cached_tokens},
        }

    def brisk(self, finished: TurnFinished) -> dict:
        metrics = finished.metrics.to_dict()
        for bulky in ("sources", "coverage"):
            metrics.pop(bulky, None)
        waited = (self.started_at or self.submitted) - self.submitted
        return {
            "metrics": metrics,
            "controls": self.completion.brisk,
            "queue": {"depth_at_submit": self.depth_at_submit, "waited_s": round(waited, 4)},
            "prompt_cache": {"reused_conversation": self.job.reused_slot},
        }

    # --- whole answers ------------------------------------------------------------------

    async def whole(self) -> Response:
        text: list[str] = []
        # Closed here, not left to the garbage collector: asyncio would close it later on the
        # loop, keeping this turn (and its answer) alive until then.
        async with contextlib.aclosing(self._pieces()) as pieces:
            async for _, value in pieces:
                if isinstance(value, str):
                    text.append(value)
                elif isinstance(value, ApiError):
                    return error_response(value)
                elif isinstance(value, TurnFinished):  # encoded off the loop: an answer can be megabytes
                    return await asyncio.to_thread(JSONResponse, self._whole_body("".join(text), value))
        return Response(status_code=499)  # the client went away: nobody reads this

    def _whole_body(self, text: str, finished: TurnFinished) -> dict:
        reason = self.finish_reason(finished)
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
            if self.chat
            else {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        )
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.completion.settings.model,
            "choices": [choice],
            "usage": self.usage(finished),
            "brisk": self.brisk(finished),
        }

    # --- streaming (server-sent events) -------------------------------------------------

    async def stream(self) -> Response:
        pieces = self._pieces()
        first = await anext(pieces, None)
        if first is not None and isinstance(first[1], ApiError):  # nothing sent yet: a proper HTTP error
            await pieces.aclose()
            return error_response(first[1])
        return StreamingResponse(
            self._events(first, pieces), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    def _chunk(self, text: str | None, reason: str | None = None, *, first: bool = False) -> dict:
        if self.chat:
            delta = (
                {"role": "assistant", "content": text or ""}
                if first
                else ({"content": text} if text is not None else {})
            )
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.completion.settings.model,
            "choices": [choice],
        }

    async def _events(self, first, pieces) -> AsyncIterator[str]:
        try:
            if self.chat:
                yield _sse(self._chunk("", first=True))
            item = first
            while item is not None:
                kind, value = item
                if kind == "text":
                    yield _sse(self._chunk(value))
                elif kind == "error":
                    yield _sse(value.body())
                else:
                    yield _sse(self._chunk(None, self.finish_reason(value)))
                    if self.completion.include_usage:
                        yield _sse(
                            {**self._chunk(None), "choices": [], "usage": self.usage(value), "brisk": self.brisk(value)}
                        )
                item = await anext(pieces, None)
            yield "data: [DONE]\n\n"
        finally:  # the client went away mid-answer (Starlette cancels this generator)
            self.job.cancel.cancel()
            await pieces.aclose()


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _not_found(request: Request, exc) -> Response:
    return error_response(ApiError(404, f"No such endpoint: {request.method} {request.url.path}", code="unknown_url"))


async def _not_allowed(request: Request, exc) -> Response:
    return error_response(
        ApiError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
    )


async def _internal_error(request: Request, exc: Exception) -> Response:
    """Any exception no handler turned into an answer: OpenAI's shape, and no traceback for the
    client (Starlette re-raises it after this response, so the server's log has it)."""
    return error_response(
        ApiError(
            500,
            "The server failed to answer this request (its log says why)",
            code="internal_error",
            kind="server_error",
        )
    )


def installed_or_default(model_id: str) -> bool:
    """Installed, or the embedded default (installed on first use)."""
    from brisk.engine.models.bundled import BUNDLED
    from brisk.engine.models.store import ModelStore

    return ModelStore().has(model_id) or (model_id in BUNDLED and BUNDLED[model_id].default)


async def read_capped_body(server, request: Request) -> bytes:
    """The request's body, refused past the server's `max_body` bytes, or while all connections
    together hold more than its `reading_budget` (its `reading` counts them). Shared by the
    server and the ranks' front (engine/distributed/serve_front.py)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > server.max_body:
        raise ApiError(413, f"The request body is larger than {server.max_body:,} bytes", code="body_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            server.reading += len(chunk)
            if len(body) > server.max_body:
                raise ApiError(413, f"The request body is larger than {server.max_body:,} bytes", code="body_too_large")
            if server.reading > server.reading_budget:
                raise ApiError(503, "The server is receiving too many large requests at once; try again", code="busy")
        return bytes(body)
    finally:
        server.reading -= len(body)
