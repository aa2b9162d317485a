"""`brisk serve --ranks N`: rank 0 serves and leads, the front stays up when a rank fails
(engine/distributed/serve_front.py, serve_group.py, serve_lockstep.py)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.settings import ChatSettings
from brisk.engine.distributed.hostfile import loopback
from brisk.engine.distributed.launch import DEATH_GRACE_S, RankWatch
from brisk.engine.distributed.serve_front import Front
from brisk.engine.distributed.serve_lockstep import STOP, decode, encode, with_shared_seed
from brisk.engine.host.serve.local import LocalServer
from brisk.engine.host.worker import Answer, ForgetConversation
from tests.engine.test_distributed import PROMPT, FakeClock, _rank_pid, ranks_home  # noqa: F401  (a fixture)

# --- what travels to the followers ------------------------------------------------------


def test_commands_travel_as_json_and_come_back_equal():
    settings = ChatSettings(model="tq", temperature=0.0, seed=5, max_tokens=7)
    answer = Answer(-3, settings, [Message("system", "be brief"), Message("user", "hi\u2028\x00 there")])
    assert decode(encode(answer)) == answer
    assert decode(encode(ForgetConversation(-9))) == ForgetConversation(-9)
    assert decode(encode(STOP)) is None
    assert b"pickle" not in encode(answer) and json.loads(encode(answer))  # plain JSON


def test_a_request_without_a_seed_gets_one_every_rank_shares():
    unseeded = Answer(-1, ChatSettings(model="tq", temperature=0.8), [Message("user", "hi")])
    seeded = with_shared_seed(unseeded)
    assert seeded.settings.seed is not None and decode(encode(seeded)).settings.seed == seeded.settings.seed
    given = Answer(-1, ChatSettings(model="tq", temperature=0.8, seed=11), [Message("user", "hi")])
    assert with_shared_seed(given).settings.seed == 11


def test_a_dead_rank_ends_the_group_after_a_grace_not_after_the_rank_timeout():
    """A survivor that waits on its dead peer (a server finishing a request) kept the group,
    and the front's answer to the user, waiting for the 30 s heartbeat timeout."""
    clock = FakeClock()
    watch = RankWatch(loopback(2), clock=clock)
    for rank in (0, 1):
        watch.read_line(f"@brisk-rank {rank} joined\n")
    watch.read_line("\x1b[33m[WARN] Node with rank 1 exited with code -9 \x1b[0m\n")
    assert watch.problem(0.0, 120.0, 30.0) is None  # the survivors get a moment to end by themselves
    clock.now += DEATH_GRACE_S + 0.5
    watch.read_line("@brisk-rank 0 alive\n")  # rank 0 still alive: not the one to blame
    assert watch.problem(0.0, 120.0, 30.0) == (
        "rank 1 on host 127.0.0.1 was killed by signal 9 while running (after joining the ring)"
    )


# --- the front, with a stand-in for rank 0 and its group --------------------------------


class StandInGroup:
    """What Front asks of RankGroup."""

    def __init__(self, port: int, state: str = "ready", error: str | None = None, why: str | None = None):
        self.port, self.state, self.error, self.why = port, state, error, why
        self.generation, self.rank_timeout = 1, 1.0

    def ready(self) -> bool:
        return self.state == "ready"

    def why_ended(self, generation: int, timeout: float) -> str | None:
        return self.why

    def describe(self) -> dict:
        return {"state": self.state, "last_error": self.error}


def rank0_stand_in(cut_after: int):
    """A rank 0 that streams `cut_after` events and then loses its connection (its process
    killed with the group), or answers a whole request."""

    async def chat(request):
        body = await request.json()
        if not body.get("stream"):
            return JSONResponse(
                {"choices": [{"message": {"content": "whole"}}], "auth": request.headers.get("authorization")}
            )

        async def events():
            for i in range(cut_after):
                yield f"data: {json.dumps({'n': i})}\n\n"
            raise RuntimeError("rank 0 killed")  # uvicorn drops the connection mid-stream

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json", **(headers or {})}
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get(url: str, path: str, headers: dict | None = None) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.fixture
def front_over():
    servers = []

    def make(rank0_app, **group_state):
        rank0 = LocalServer(rank0_app)
        group = StandInGroup(int(rank0.url.rsplit(":", 1)[1]), **group_state)
        front = LocalServer(Front(group, api_key=None, max_body=1 << 20, allowed_hosts=[], allowed_origins=[]).app())
        servers.extend([rank0, front])
        return front, group

    yield make
    for server in servers:
        server.stop()


def test_a_stream_cut_off_by_a_lost_rank_ends_with_an_error_event_naming_it(front_over):
    front, _ = front_over(rank0_stand_in(cut_after=2), why="rank 1 on host 10.0.0.2 was killed by signal 9")
    status, body = post(front.url, {"stream": True, "messages": []})
    events = [e for e in body.decode().split("\n\n") if e]
    assert status == 200 and events[:2] == ['data: {"n": 0}', 'data: {"n": 1}']  # what rank 0 sent, as sent
    error = json.loads(events[2].removeprefix("data: "))["error"]
    assert "rank 1 on host 10.0.0.2 was killed by signal 9" in error["message"] and "regrouping" in error["message"]
    assert error["code"] == "ranks_unavailable" and events[3] == "data: [DONE]"
    assert "Traceback" not in body.decode()


def test_a_whole_answer_is_forwarded_with_the_clients_headers(front_over):
    front, _ = front_over(rank0_stand_in(cut_after=0))
    status, body = post(front.url, {"messages": []}, {"Authorization": "Bearer k"})
    assert status == 200 and json.loads(body) == {"choices": [{"message": {"content": "whole"}}], "auth": "Bearer k"}


def test_while_regrouping_turns_get_503_and_health_says_so(front_over):
    why = "rank 1 on host 127.0.0.1 was killed by signal 9 while running"
    front, group = front_over(rank0_stand_in(cut_after=0), state="regrouping", error=why)
    status, body = post(front.url, {"messages": []})
    error = json.loads(body)["error"]
    assert status == 503 and why in error["message"] and "regrouping" in error["message"]
    status, health = get(front.url, "/health")
    assert status == 503 and health["status"] == "regrouping" and health["ranks"]["last_error"] == why
    group.state = "ready"  # back: served again
    assert post(front.url, {"messages": []})[0] == 200


def test_with_an_api_key_the_front_refuses_before_forwarding(front_over):
    front, group = front_over(rank0_stand_in(cut_after=0))
    front_app = Front(group, api_key="s3cret", max_body=1 << 20, allowed_hosts=[], allowed_origins=[]).app()
    keyed = LocalServer(front_app)
    try:
        status, body = post(keyed.url, {"messages": []})
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        assert get(keyed.url, "/health") == (200, {"status": "ok"})  # liveness only, no hosts or errors
        assert post(keyed.url, {"messages": []}, {"Authorization": "Bearer s3cret"})[0] == 200
    finally:
        keyed.stop()


# --- two loopback ranks through mlx.launch ---------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serving:
    def __init__(self, home, *extra, regroup_delay: str = "1"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, BRISK_HOME=str(home), BRISK_REGROUP_DELAY_S=regroup_delay)
        args = ["serve", "--model", "tq", "--port", str(self.port), *extra]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "brisk.engine.host.cli", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.wait_healthy()

    def wait_healthy(self, attempts: int = 600) -> dict:
        for _ in range(attempts):  # a hang guard: model loads happen at the first request
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            try:
                status, health = get(self.url, "/health")
                if status == 200:
                    return health
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError("the server did not come up")

    def chat(self, content: str, **extra) -> tuple[int, bytes]:
        body = {"model": "tq", "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}
        return post(self.url, body)

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode()


@pytest.mark.plan_agnostic  # the server's plumbing around the ranks; their numerics: test_distributed.py
def test_two_loopback_ranks_serve_the_same_greedy_answer_as_one_process(ranks_home):  # noqa: F811
    one = Serving(ranks_home)
    try:
        status, body = one.chat(PROMPT, max_tokens=24)
        assert status == 200, body
        alone = json.loads(body)
    finally:
        one.stop()
    two = Serving(ranks_home, "--ranks", "2")
    try:
        status, body = two.chat(PROMPT, max_tokens=24)
        assert status == 200, body
        ranked = json.loads(body)
        status, health = get(two.url, "/health")
    finally:
        err = two.stop()
    assert ranked["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
    assert ranked["usage"]["completion_tokens"] == alone["usage"]["completion_tokens"] == 24
    extra = ranked["brisk"]["metrics"]["extra"]
    assert extra["parallel"] == "tensor" and [r["rank"] for r in extra["ranks"]] == [0, 1]
    for r in extra["ranks"]:
        assert r["host"] == "127.0.0.1" and 0 < r["weight_share"] <= 0.55
        assert r["kv_bytes"] == alone["brisk"]["metrics"]["kv_bytes"] // 2  # half the KV heads each
    assert health["ranks"]["state"] == "ready" and health["ranks"]["size"] == 2
    assert "Traceback" not in err


@pytest.mark.plan_agnostic  # the server's plumbing around the ranks; their numerics: test_distributed.py
def test_a_rank_killed_mid_answer_is_named_and_the_server_refuses_then_serves_again(ranks_home):  # noqa: F811
    server = Serving(ranks_home, "--ranks", "2", regroup_delay="20")
    try:
        status, body = server.chat("Hello there", max_tokens=12)
        assert status == 200, body
        before = json.loads(body)["choices"][0]["message"]["content"]
        received: list[bytes] = []

        def stream():
            host_port = ("127.0.0.1", server.port)
            conn = http.client.HTTPConnection(*host_port, timeout=300)
            body = {  # tq-endless: never stops by itself, so the kill lands mid-answer however loaded
                "model": "tq-endless",
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 30000,
                "stream": True,
            }
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            while chunk := response.read1(4096):
                received.append(chunk)

        victim = _rank_pid(server.proc.pid, 1)
        assert victim is not None
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        for _ in range(3000):  # hang guard: until rank 0 has streamed some of the answer
            if b"".join(received).count(b"data: ") >= 3:
                break
            time.sleep(0.02)
        os.kill(victim, signal.SIGKILL)
        reader.join(timeout=180)
        assert not reader.is_alive()
        events = [e for e in b"".join(received).decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert "rank 1 on host 127.0.0.1 was killed by signal 9" in error["message"]
        assert "[ring]" not in error["message"] and "Traceback" not in b"".join(received).decode()

        status, health = get(server.url, "/health")  # the server is up, and says why it refuses
        assert status == 503 and health["status"] == "regrouping"
        assert "rank 1 on host 127.0.0.1 was killed by signal 9" in health["ranks"]["last_error"]
        status, body = server.chat("Hello there", max_tokens=12)
        assert status == 503 and "regrouping" in json.loads(body)["error"]["message"]

        health = server.wait_healthy()  # regrouped: a fresh group answers as the first did
        # relaunched (a relaunch whose ranks fail to join is retried: 3 launches once, loaded)
        assert health["ranks"]["launches"] >= 2
        status, body = server.chat("Hello there", max_tokens=12)
        assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == before
    finally:
        err = server.stop()
    assert "Traceback" not in err


def test_kv_bits_auto_is_refused_on_ranks_before_anything_reaches_them():
    """Each machine keeps its own packed-KV self-test result: ranks could choose differently."""
    from brisk.engine.api.events import EngineErrored
    from brisk.engine.distributed.serve_lockstep import leader_execute

    class NoRing:  # any collective would fail the test
        def __getattr__(self, name):
            raise AssertionError(f"the ring was used ({name})")

    delivered: list = []
    command = Answer(-1, ChatSettings(model="tq", kv_auto=True), [Message("user", "hi")])
    leader_execute(NoRing(), NoRing())(command, CancelToken(), delivered.append)
    assert len(delivered) == 1 and isinstance(delivered[0], EngineErrored)
    assert delivered[0].kind == "invalid_settings" and "auto" in delivered[0].message


# --- the group behind the front ---------------------------------------------------------


def test_a_first_group_that_never_comes_up_ends_serve_with_its_error_and_no_retry():
    from brisk.engine.api.errors import BriskError
    from brisk.engine.distributed.launch import RankFailed
    from brisk.engine.distributed.serve_group import RankGroup

    launches: list[list[str]] = []

    def never_joins(argv, **kw):
        launches.append(argv)
        raise RankFailed("rank 1 on host mac2 did not join the ring within 5 s; the group was stopped")

    group = RankGroup(
        lambda port: ["serve", "--port", str(port)],
        ranks=None,
        hostfile="h.json",
        hosts=["mac1", "mac2"],
        join_timeout=5,
        rank_timeout=5,
        launch=never_joins,
    )
    group.start()
    with pytest.raises(BriskError, match="rank 1 on host mac2 did not join the ring within 5 s"):
        group.wait_first()
    group.close()
    assert len(launches) == 1 and group.state == "failed"


def test_a_group_that_served_and_failed_is_launched_again_on_a_new_port(monkeypatch):
    """A rank of the lost group may linger on the old port (a server finishing a request)."""
    from brisk.engine.distributed import serve_group
    from brisk.engine.distributed.launch import RankFailed

    monkeypatch.setenv(serve_group.DELAY_ENV, "0")
    ports: list[int] = []
    second_up = threading.Event()

    def launch(argv, *, stop, **kw):
        port = int(argv[-1])
        ports.append(port)
        rank0 = LocalServer(Starlette(routes=[Route("/health", lambda r: JSONResponse({"status": "ok"}))]), port=port)
        try:
            if len(ports) == 1:
                for _ in range(600):  # hang guard: until the front has seen rank 0 answer
                    if group.ready():
                        break
                    time.sleep(0.05)
                raise RankFailed("rank 1 on host 127.0.0.1 was killed by signal 9 while running")
            second_up.set()
            stop.wait(60)
            return 0
        finally:
            rank0.stop()

    group = serve_group.RankGroup(
        lambda port: ["serve", "--port", str(port)],
        ranks=2,
        hostfile=None,
        hosts=["127.0.0.1", "127.0.0.1"],
        join_timeout=5,
        rank_timeout=5,
        launch=launch,
    )
    group.start()
    try:
        group.wait_first()
        assert second_up.wait(60)
        for _ in range(600):  # hang guard
            if group.ready():
                break
            time.sleep(0.05)
        described = group.describe()
        assert described["state"] == "ready" and described["launches"] == 2 and described["failures"] == 1
        assert "killed by signal 9" in described["last_error"] and ports[0] != ports[1]
    finally:
        group.close()
    assert group.state == "stopped"


def test_a_hostfile_whose_first_host_is_not_this_machine_is_refused_before_launch():
    from brisk.engine.api.errors import BriskError
    from brisk.engine.distributed.hostfile import Host
    from brisk.engine.distributed.serve_front import check_rank0_is_here

    check_rank0_is_here([Host("127.0.0.1", ("127.0.0.1",))])
    with pytest.raises(BriskError, match=r"first host \(mac9, 192\.0\.2\.7\) must be this machine"):
        check_rank0_is_here([Host("mac9", ("192.0.2.7",))])


def test_a_servers_rank_errors_are_shown_as_they_come_not_held_until_the_group_ends():
    """`brisk run` holds them to blame the right rank at its end; a server's group may run
    for weeks, and its operator reads its log while it runs."""
    held = RankWatch(loopback(2))
    live = RankWatch(loopback(2), hold_errors=False)
    line = "[rank 1 on 127.0.0.1] ERROR the model could not be loaded\n"
    assert held.read_line(line) is None
    assert live.read_line(line) == line and live.held_errors == []


def test_a_model_missing_on_one_host_is_named_and_no_rank_starts_the_answer(tmp_path, monkeypatch):
    """A rank that failed alone would wait for the next command while the others wait in
    the forward's collectives, for good."""
    import mlx.core as mx

    from brisk.engine.distributed.group import Rank
    from brisk.engine.distributed.serve_lockstep import run_command

    monkeypatch.setenv("BRISK_HOME", str(tmp_path))  # an empty store: the model is missing here

    class NoWorker:
        def handle(self, command, cancel):
            raise AssertionError("the answer started")

    delivered: list = []
    rank = Rank(mx.distributed.init(), ["mac2"])  # a group of one: the gather is this rank's own flag
    command = Answer(-1, ChatSettings(model="nope"), [Message("user", "hi")])
    run_command(rank, NoWorker(), command, CancelToken(), delivered.append)
    assert [(e.kind, e.message) for e in delivered] == [
        ("model_not_found", "nope is not installed on mac2: install it there under the same id")
    ]


def test_the_front_caps_a_body_and_the_bodies_arriving_at_once(front_over):
    """The front holds each body before rank 0 sees it: the server's own caps apply here too."""
    _, group = front_over(rank0_stand_in(cut_after=0))
    front = Front(group, api_key=None, max_body=64, allowed_hosts=[], allowed_origins=[])
    served = LocalServer(front.app())
    try:
        status, body = post(served.url, {"messages": [], "pad": "x" * 100})
        assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"
        front.reading = front.reading_budget  # other connections' bodies, still arriving
        status, body = post(served.url, {"messages": []})
        assert status == 503 and json.loads(body)["error"]["code"] == "busy"
        front.reading = 0
        assert post(served.url, {"messages": []})[0] == 200
    finally:
        served.stop()


@pytest.mark.plan_agnostic
@pytest.mark.skipif(sys.platform != "linux", reason="the launcher dies with brisk through Linux's PR_SET_PDEATHSIG")
def test_ranks_do_not_outlive_a_front_killed_outright(ranks_home):  # noqa: F811
    """SIGKILL leaves no `finally`: mlx.launch dies with the front, and the ranks, their
    relay pipe gone, leave (an orphaned rank 0 went on serving on loopback, holding the model)."""
    server = Serving(ranks_home, "--ranks", "2")
    ranks = [_rank_pid(server.proc.pid, r) for r in (0, 1)]
    assert None not in ranks
    server.proc.kill()
    server.proc.wait(timeout=60)
    for _ in range(600):  # hang guard: the ranks notice within a heartbeat or two
        alive = [pid for pid in ranks if os.path.exists(f"/proc/{pid}") and _running(pid)]
        if not alive:
            break
        time.sleep(0.1)
    assert not alive


def _running(pid: int) -> bool:
    """Not a zombie (an exited child its parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
