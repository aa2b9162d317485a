"""`brisk serve` against hostile clients (issue 54 items 2, 6, 7, 17): stop sequences that
cost quadratic time, web pages (DNS rebinding, cross-site POSTs), half-sent requests
(slowloris) and log floods, and an API key kept off the command line."""

import asyncio
import json
import logging
import resource
import socket
import threading

import httpx2 as httpx  # the HTTP client the openai package itself uses
import pytest

openai = pytest.importorskip("openai", reason="the server tests drive it with the openai client (the test extra)")
uvicorn = pytest.importorskip("uvicorn", reason="brisk serve runs on uvicorn (a dependency)")

from brisk.engine.api.errors import BriskError  # noqa: E402
from brisk.engine.api.events import TokenEmitted, TurnFinished  # noqa: E402
from brisk.engine.api.metrics import TurnMetrics  # noqa: E402
from brisk.engine.host.serve.app import Server  # noqa: E402
from brisk.engine.host.serve.connections import ConnectionLimits, RateLimitedLog, connection_cap, limit_log_floods  # noqa: E402
from brisk.engine.host.serve.scheduler import EngineQueue  # noqa: E402
from brisk.engine.host.serve.stops import MAX_STOP_CHARS, MAX_STOPS, StopScanner, check_stops  # noqa: E402
from brisk.engine.host.worker import Answer  # noqa: E402
from tests.engine.test_serve import Live, raw  # noqa: E402

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent

HANG_GUARD_S = 120  # only so that a broken server fails the test instead of hanging it


def held_engine(release: threading.Event, tokens: int = 50):
    """An engine (no model: these tests are about the HTTP side) that answers `tokens` words,
    then waits for `release` before finishing."""

    def execute(command, cancel, deliver):
        if not isinstance(command, Answer):
            return
        for i in range(tokens):
            deliver(TokenEmitted("word ", i))
        release.wait(HANG_GUARD_S)
        deliver(
            TurnFinished(
                "word " * tokens, list(range(tokens)), TurnMetrics(generated_tokens=tokens, finish_reason="length")
            )
        )

    return execute


def quick_engine():
    done = threading.Event()
    done.set()
    return held_engine(done, tokens=2)


def fake_server(limits: ConnectionLimits | None = None, **server_options) -> Live:
    queue = EngineQueue(execute=quick_engine())
    server = Server(queue, default_model="tiny", known_model=lambda model: True, **server_options)
    live = Live(server.app(), limits=limits)
    live.queue = queue
    return live


@pytest.fixture(scope="module")
def served():
    live = fake_server(allowed_hosts=["box.lan"], allowed_origins=["https://ok.example"])
    yield live
    live.stop()
    live.queue.close()


def chat(content="hi", **extra):
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2, **extra}


# --- item 2: stop sequences ------------------------------------------------------------------


class OldScanner:
    """The scanner before the fix, kept as the reference for what the output must be."""

    def __init__(self, stops):
        self.stops, self._held, self.stopped = stops, "", False

    def feed(self, piece):
        if self.stopped:
            return ""
        text = self._held + piece
        hits = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[: min(hits)]
        keep = max((n for stop in self.stops for n in range(1, len(stop)) if text.endswith(stop[:n])), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self):
        held, self._held = self._held, ""
        return "" if self.stopped else held


def test_the_linear_scanner_releases_exactly_what_the_old_one_did():
    import random

    rng = random.Random(54)
    for trial in range(3000):
        alphabet = "ab" if trial % 2 else "abc"
        stops = ["".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(rng.randint(0, 4))]
        pieces = ["".join(rng.choices(alphabet, k=rng.randint(0, 5))) for _ in range(rng.randint(0, 8))]
        old, new = OldScanner(stops), StopScanner(stops)
        for piece in pieces:
            assert new.feed(piece) == old.feed(piece) and new.stopped == old.stopped, (stops, pieces)
        assert new.flush() == old.flush()


def test_scanning_work_grows_with_the_text_not_with_the_stops_length_squared():
    """The worst case for prefix matching: a text of 'a's against stops of 'a's ending in 'b'
    holds back a stop's length and revisits it at every token."""
    stops = ["a" * (MAX_STOP_CHARS - 1) + "b", "a" * (MAX_STOP_CHARS // 2) + "c", "ab" * (MAX_STOP_CHARS // 2), "b"]
    stops[-1] = "z"
    scanner = StopScanner(stops)
    fed = 0
    for i in range(4000):
        piece = "a" * (1 + i % 3)
        scanner.feed(piece)
        fed += len(piece)
    # Knuth-Morris-Pratt: at most two transitions per character and stop.
    assert scanner.steps <= 2 * fed * len(stops)
    assert not scanner.stopped and len(scanner.flush()) == MAX_STOP_CHARS - 1
    more = StopScanner(stops)
    for i in range(8000):
        more.feed("a" * (1 + i % 3))
    assert more.steps <= 2.05 * scanner.steps  # twice the text: twice the work, whatever the stops


def test_stop_bounds():
    check_stops(["x" * MAX_STOP_CHARS] * MAX_STOPS)
    with pytest.raises(ValueError, match=f"at most {MAX_STOPS}"):
        check_stops(["x"] * (MAX_STOPS + 1))
    with pytest.raises(ValueError, match="1,000,000 characters"):
        check_stops(["x", "y" * 1_000_000])


@pytest.mark.parametrize("stops", [["s" * 1_000_000], ["s" * 2_000_000] * 4], ids=["one-1M", "four-2M"])
def test_a_huge_stop_sequence_is_refused_before_anything_runs(served, stops):
    served_before = served.queue.stats()["served"]
    response = raw(served, "/v1/chat/completions", chat(stop=stops))
    assert response.status_code == 400, response.text[:200]
    assert response.json()["error"]["param"] == "stop"
    assert served.queue.stats()["served"] == served_before
    assert httpx.get(f"{served.url}/health", timeout=HANG_GUARD_S).status_code == 200


def test_health_answers_while_an_answer_with_the_longest_stops_streams():
    release = threading.Event()
    queue = EngineQueue(execute=held_engine(release))
    live = Live(Server(queue, default_model="tiny", known_model=lambda model: True).app())
    stops = ["\u2603" * MAX_STOP_CHARS] * MAX_STOPS  # never in the answer: every token is scanned
    try:
        with httpx.stream(
            "POST", f"{live.url}/v1/chat/completions", json=chat(stream=True, stop=stops), timeout=HANG_GUARD_S
        ) as response:
            lines = (line for line in response.iter_lines() if line.startswith("data: "))
            next(lines)
            health = httpx.get(f"{live.url}/health", timeout=HANG_GUARD_S).json()
            release.set()
            rest = list(lines)
    finally:
        release.set()
        live.stop()
        queue.close()
    assert health["running"] is True  # answered while the request was still being served
    assert rest[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:])["choices"][0] for line in rest[:-1]]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "word " * 50
    assert chunks[-1]["finish_reason"] == "length"


def test_too_deeply_nested_json_is_a_400_not_a_server_error(served):
    response = raw(served, "/v1/chat/completions", b"[" * 100_000)
    assert response.status_code == 400 and "nested too deeply" in response.json()["error"]["message"]


# --- item 6: which requests are answered -----------------------------------------------------


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8088", "localhost.attacker.example", ""])
def test_a_rebound_host_name_is_refused(served, host):
    served_before = served.queue.stats()["served"]
    response = raw(served, "/v1/chat/completions", chat(), headers={"Host": host})
    assert response.status_code == 400 and response.json()["error"]["code"] == "host_not_allowed"
    assert served.queue.stats()["served"] == served_before
    assert httpx.get(f"{served.url}/v1/models", headers={"Host": host}, timeout=HANG_GUARD_S).status_code == 400


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1", "127.0.0.1:9", "[::1]:8088", "192.168.1.5", "box.lan:80"])
def test_loopback_names_ip_addresses_and_configured_hosts_are_served(served, host):
    assert httpx.get(f"{served.url}/health", headers={"Host": host}, timeout=HANG_GUARD_S).status_code == 200


def test_a_page_from_another_site_is_refused_before_anything_runs(served):
    served_before = served.queue.stats()["served"]
    response = raw(served, "/v1/chat/completions", chat(), headers={"Origin": "https://evil.example"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "origin_not_allowed"
    for origin in ("null", f"{served.url}"):  # sandboxed frames; pages this server never serves
        assert raw(served, "/v1/chat/completions", chat(), headers={"Origin": origin}).status_code == 403
    preflight = httpx.options(
        f"{served.url}/v1/chat/completions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        timeout=HANG_GUARD_S,
    )
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    assert served.queue.stats()["served"] == served_before


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_post_that_is_not_json_is_refused_before_anything_runs(served, content_type):
    """A cross-site text/plain POST needs no preflight: it used to run."""
    served_before = served.queue.stats()["served"]
    headers = {} if content_type is None else {"Content-Type": content_type}
    request = httpx.Request("POST", f"{served.url}/v1/chat/completions", content=json.dumps(chat()), headers=headers)
    assert ("content-type" in request.headers) == (content_type is not None)
    response = httpx.Client(timeout=HANG_GUARD_S).send(request)
    assert response.status_code == 415 and "application/json" in response.json()["error"]["message"]
    assert served.queue.stats()["served"] == served_before


def test_an_allowed_page_gets_cors_answers(served):
    origin = "https://ok.example"
    preflight = httpx.options(
        f"{served.url}/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
        },
        timeout=HANG_GUARD_S,
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "x-stainless-os" in preflight.headers["access-control-allow-headers"]
    response = raw(served, "/v1/chat/completions", chat(), headers={"Origin": origin})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == origin
    assert response.json()["choices"][0]["message"]["content"] is not None


# --- item 7: slowloris and log floods --------------------------------------------------------


def half_sent(live) -> socket.socket:
    sock = socket.create_connection(live.sock.getsockname()[:2], timeout=HANG_GUARD_S)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applicat")
    return sock


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes (socket.timeout if it never does)."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_a_half_sent_request_is_closed_at_its_deadline():
    live = fake_server(ConnectionLimits(head_timeout_s=0.2, body_timeout_s=0.2, max_connections=64))
    protocol = live.uvicorn.config.http_protocol_class
    try:
        head = half_sent(live)
        assert read_all(head).startswith(b"HTTP/1.1 408")
        body = socket.create_connection(live.sock.getsockname()[:2], timeout=HANG_GUARD_S)
        body.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model": '
        )
        read_all(body)  # closed, whatever it said
        assert protocol.closed_for_time == 2
    finally:
        live.stop()
        live.queue.close()


def closed_by_server(sock: socket.socket) -> bool:
    """True if the server closed it without a word; False if it is open with nothing to read."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:  # closed before it read what was sent: the kernel resets
        return True
    except BlockingIOError:
        return False


def test_half_sent_requests_at_the_cap_do_not_keep_a_good_client_out():
    """Deadlines far away: only the cap's choice of whom to close lets the good clients in."""
    cap = 6
    live = fake_server(ConnectionLimits(head_timeout_s=3600, body_timeout_s=3600, max_connections=cap))
    protocol = live.uvicorn.config.http_protocol_class
    attackers = [half_sent(live) for _ in range(cap + 4)]
    try:
        for _ in range(3):
            attackers.append(half_sent(live))  # the cap is full again
            with httpx.Client(timeout=HANG_GUARD_S) as client:
                response = client.post(f"{live.url}/v1/chat/completions", json=chat())
            assert response.status_code == 200, response.text
        closed = [closed_by_server(sock) for sock in attackers]
        assert closed == sorted(closed, reverse=True)  # the oldest half-sent requests went first
        assert closed.count(True) == protocol.closed_for_cap >= 4 + 1 + 3  # the last ones came at a full cap
        assert protocol.closed_for_time == 0
    finally:
        for sock in attackers:
            sock.close()
        live.stop()
        live.queue.close()


def test_the_connection_cap_stays_below_the_open_file_limit():
    assert connection_cap(2048) < 2048 - 128  # mlx-lm's limit: room for the process
    assert connection_cap(256) >= 8 and connection_cap(1 << 20) == 1024
    assert connection_cap() < resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_the_log_filter_lets_one_of_a_kind_through_per_interval():
    now = [0.0]
    limiter = RateLimitedLog(60, clock=lambda: now[0])

    def record(msg, *args):
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, args, None)

    passed = [limiter.filter(record(f"socket.accept() out of system resource\nsocket: fd={i}")) for i in range(1000)]
    assert passed.count(True) == 1
    assert limiter.filter(record("another message %s", 1))  # other kinds are not held back
    now[0] = 61.0
    again = record("socket.accept() out of system resource")
    assert limiter.filter(again) and "999 more" in again.getMessage()


def test_asyncios_accept_errors_are_rate_limited(caplog):
    """The message asyncio logs for each accept that fails with EMFILE, as the loop logs it."""
    limit_log_floods()
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for _ in range(500):
                loop.call_exception_handler(
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                    }
                )
    finally:
        loop.close()
    assert len([r for r in caplog.records if "socket.accept()" in r.getMessage()]) <= 1


# --- item 17: the API key -----------------------------------------------------------------


def serve_args(tmp_path, *argv):
    import argparse as ap

    from brisk.engine.host.serve.cli import add_serve_parser

    parser = ap.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_the_key_comes_from_a_private_file_or_the_environment(tmp_path):
    from brisk.engine.host.serve.cli import check_binding, resolve_api_key

    key_file = tmp_path / "key"
    key_file.write_text("sesame\n")
    key_file.chmod(0o600)
    args = serve_args(tmp_path, "--host", "0.0.0.0", "--api-key-file", str(key_file))
    args.api_key = resolve_api_key(args, {})
    assert args.api_key == "sesame"
    check_binding(args)
    assert resolve_api_key(serve_args(tmp_path), {"BRISK_API_KEY": " env-key "}) == "env-key"
    assert resolve_api_key(serve_args(tmp_path), {}) is None
    key_file.chmod(0o644)
    with pytest.raises(BriskError, match="chmod 600"):
        resolve_api_key(serve_args(tmp_path, "--api-key-file", str(key_file)), {})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(BriskError, match="empty"):
        resolve_api_key(serve_args(tmp_path, "--api-key-file", str(empty)), {})
    with pytest.raises(BriskError, match="Cannot read"):
        resolve_api_key(serve_args(tmp_path, "--api-key-file", str(tmp_path / "missing")), {})
    with pytest.raises(BriskError, match="not both"):
        resolve_api_key(serve_args(tmp_path, "--api-key", "a", "--api-key-file", str(empty)), {})
    with pytest.raises(BriskError, match="API key"):
        check_binding(serve_args(tmp_path, "--allowed-origin", "*"))


@pytest.mark.parametrize("spelling", ["*/", " * ", "*//"])
def test_no_spelling_of_every_origin_gets_past_the_key_check(tmp_path, spelling):
    """'*/' was stripped to '*' by the guard after the check had compared it with '*'."""
    from brisk.engine.host.serve.cli import check_binding

    with pytest.raises(BriskError, match="needs an API key"):
        check_binding(serve_args(tmp_path, "--allowed-origin", spelling))


@pytest.mark.parametrize(
    "origin", ["app.example", "ftp://app.example", "https://app.example/path", "https://*.example", "https://u@a.b"]
)
def test_an_allowed_origin_must_be_a_pages_origin(tmp_path, origin):
    from brisk.engine.host.serve.cli import check_binding

    with pytest.raises(BriskError, match="allowed-origin"):
        check_binding(serve_args(tmp_path, "--allowed-origin", origin))


def test_allowed_origins_are_kept_as_browsers_send_them(tmp_path):
    from brisk.engine.host.serve.cli import check_binding

    args = serve_args(tmp_path, "--allowed-origin", "https://App.Example:8443/")
    check_binding(args)
    assert args.allowed_origin == ["https://app.example:8443"]


@pytest.mark.parametrize("flags", [["--max-body", "-1"], ["--max-body", "0"], ["--cache-bytes", "-5"]])
def test_sizes_that_could_never_work_are_refused_at_start(tmp_path, flags):
    from brisk.engine.host.serve.cli import check_binding

    with pytest.raises(BriskError, match="must be"):
        check_binding(serve_args(tmp_path, *flags))


def test_with_a_key_health_tells_only_liveness_and_keys_are_compared_in_constant_time(monkeypatch):
    import brisk.engine.host.serve.app as app_module

    compared = []
    real = app_module.hmac.compare_digest
    monkeypatch.setattr(app_module.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or real(a, b))
    live = fake_server(api_key="sésame")
    try:
        assert httpx.get(f"{live.url}/health", timeout=HANG_GUARD_S).json() == {"status": "ok"}
        wrong = {"Authorization": "Bearer s\xe9same".encode("latin-1")}  # not the UTF-8 the key is
        assert httpx.get(f"{live.url}/health", headers=wrong, timeout=HANG_GUARD_S).json() == {"status": "ok"}
        assert httpx.get(f"{live.url}/v1/models", headers=wrong, timeout=HANG_GUARD_S).status_code == 401
        right = {"Authorization": "Bearer sésame".encode()}
        full = httpx.get(f"{live.url}/health", headers=right, timeout=HANG_GUARD_S).json()
        assert full["model"] == "tiny" and "queued" in full
        assert httpx.get(f"{live.url}/v1/models", headers=right, timeout=HANG_GUARD_S).status_code == 200
        assert (b"Bearer s\xe9same", "Bearer sésame".encode()) in compared
    finally:
        live.stop()
        live.queue.close()


class Captured(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_a_client_that_leaves_mid_body_is_no_server_error(served):
    errors = logging.getLogger("uvicorn.error")
    captured = Captured()
    errors.addHandler(captured)
    dropped_before = sum(sum(f.dropped.values()) for f in errors.filters if isinstance(f, RateLimitedLog))
    try:
        sock = socket.create_connection(served.sock.getsockname()[:2], timeout=HANG_GUARD_S)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n" + b" " * 50_000
        )
        state = served.uvicorn.server_state
        for _ in range(HANG_GUARD_S * 100):  # until the app has the request and waits for the rest of its body
            if state.tasks:
                break
            threading.Event().wait(0.01)
        sock.close()
        for task in list(state.tasks):
            asyncio.run_coroutine_threadsafe(asyncio.wait([task]), task.get_loop()).result(HANG_GUARD_S)
    finally:
        errors.removeHandler(captured)
    assert not [r for r in captured.records if r.levelno >= logging.ERROR]
    dropped = sum(sum(f.dropped.values()) for f in errors.filters if isinstance(f, RateLimitedLog))
    assert dropped == dropped_before  # and none held back by the log limiter


def test_bodies_arriving_at_once_are_held_within_one_budget():
    """A thousand connections each one byte short of --max-body held 8 GiB; past the budget a
    body is refused (503) and its bytes let go, and the server goes on answering."""
    live = fake_server(max_body=1000, reading_budget=2500)
    try:
        address = live.sock.getsockname()[:2]
        slow = []
        for _ in range(3):  # 3 x 900 bytes held: the third passes the budget of 2,500
            sock = socket.create_connection(address, timeout=HANG_GUARD_S)
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n" + b" " * 900
            )
            slow.append(sock)
        refused = read_all(slow[2])
        assert refused.startswith(b"HTTP/1.1 503") and b'"busy"' in refused
        assert httpx.post(f"{live.url}/v1/chat/completions", json=chat()).status_code == 200
        for sock in slow[:2]:
            sock.close()
    finally:
        live.stop()
        live.queue.close()
