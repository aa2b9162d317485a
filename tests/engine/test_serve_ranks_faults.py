"""Faults a tester found in `brisk serve --ranks N` and `brisk run --ranks N`: models the ranks
cannot split, the rank count's rule, stale scratch folders, a killed launcher, a request
after an idle rank died, and a host that never joins (engine/distributed/)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import Answer
from brisk.engine.models.store import ModelStore
from tests.engine.test_distributed import PROMPT, _rank_pid, ranks_home  # noqa: F401  (a fixture)
from tests.engine.test_serve_ranks import Serving, _running, front_over, get, post, rank0_stand_in  # noqa: F401

# Fault handling around the ranks: no kernel plan changes it, so CI runs it once (the main stage).
pytestmark = pytest.mark.plan_agnostic

# --- a model the ranks cannot split -------------------------------------------------------


ODD_HEADS = {"hidden_size": 96, "num_attention_heads": 3, "num_key_value_heads": 3}


@pytest.fixture(scope="module")
def split_home(tmp_path_factory):
    """`tq` (qwen2, splits 2 ways), `g` (gemma3_text: mlx-lm has no `shard` for it) and `odd`
    (qwen2 with 3 heads and 3 KV heads: no even 2-way split)."""
    from tests.tiny_models import make_tiny_model

    home = tmp_path_factory.mktemp("split-home")
    store = ModelStore(home)
    folders = {
        "tq": make_tiny_model(tmp_path_factory.mktemp("tq") / "tq", "qwen2", hidden_size=128, intermediate_size=256),
        "g": make_tiny_model(tmp_path_factory.mktemp("g") / "g", "gemma3_text"),
        "odd": make_tiny_model(tmp_path_factory.mktemp("odd") / "odd", "qwen2", **ODD_HEADS),
    }
    for model_id, folder in folders.items():
        store.install_folder(folder, model_id=model_id, source="test")
    return home


def test_a_model_the_ranks_cannot_split_is_a_400_and_left_out_of_the_model_list(split_home):
    """It was a 500 ("The server failed to answer this request"), and /v1/models offered it."""
    server = Serving(split_home, "--ranks", "2")
    try:
        answers = {
            (model, stream): server.chat("hi", model=model, max_tokens=2, stream=stream)
            for model in ("g", "odd")
            for stream in (False, True)
        }
        status, listed = get(server.url, "/v1/models")
    finally:
        err = server.stop()
    for model in ("g", "odd"):
        for stream in (False, True):
            status_code, body = answers[model, stream]
            error = json.loads(body)["error"]
            assert status_code == 400 and error["type"] == "invalid_request_error", body
            assert error["param"] == "model" and error["code"] == "unsupported_model"
            assert error["message"].startswith(f"The model '{model}' cannot be served on 2 ranks: ")
            assert "\n" not in error["message"]
    said = {model: json.loads(answers[model, False][1])["error"]["message"] for model in ("g", "odd")}
    assert "gemma3_text models cannot run on several ranks" in said["g"]
    assert "cannot be split 2 ways: attention heads 3, KV heads 3" in said["odd"]
    assert status == 200 and [m["id"] for m in listed["data"]] == ["tq"]
    assert "Traceback" not in err


def test_a_split_refused_while_loading_is_the_clients_fault_not_the_servers():
    """mlx-lm's own shape checks (quantization groups) refuse only when the model loads."""
    from brisk.engine.distributed.shard import ShardingRefused
    from brisk.engine.host.serve.app import STATUS

    assert STATUS.get(ShardingRefused("x").kind, 500) == 400


# --- the rank count's rule -------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "serve"])
def test_ranks_1_is_refused_as_the_message_and_the_help_say(split_home, command):
    """`--ranks 1` ran one process with no ranks while the error for other counts said 2 to 64
    (mlx.launch cannot start a group of one: its rank reads an empty hostfile)."""
    import argparse

    from brisk.engine.distributed.cli import add_rank_args
    from brisk.engine.distributed.hostfile import MAX_RANKS
    from tests.cli_here import brisk_here
    from tests.engine.test_serve_ranks import free_port

    extra = ["--prompt", "hi", "--max-tokens", "1"] if command == "run" else ["--port", str(free_port())]
    out = brisk_here(split_home, command, "--model", "tq", "--ranks", "1", *extra)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    rule = f"--ranks must be between 2 and {MAX_RANKS} (got 1); leave it out to run in one process"
    assert rule in out.stderr and out.stdout == ""
    parser = argparse.ArgumentParser()
    add_rank_args(parser)
    assert f"N from 2 to {MAX_RANKS}" in " ".join(parser.format_help().split())
    assert parser.parse_args([]).ranks is None  # left out: one process


# --- scratch folders a killed brisk left behind -------------------------------------------


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_stale_scratch_folders_are_removed_and_live_or_foreign_ones_kept(tmp_path):
    """A SIGKILLed `brisk serve --ranks` left /tmp/brisk-ranks-* (and its API key file) for good."""
    from brisk.engine.distributed.scratch import remove_stale

    dead = _dead_pid()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    scratch = tmp_path / "tmp"
    folders = {
        "stale": scratch / f"brisk-ranks-{dead}-abc123",
        "stale serve": scratch / f"brisk-serve-ranks-{dead}-k3y",
        "live": scratch / f"brisk-ranks-{os.getpid()}-live1",  # this process: running
        "not ours": scratch / f"brisk-cache-{dead}-x",
        "owner unknown": scratch / "brisk-ranks-14y3ke0n",  # named before the pid was
    }
    for folder in folders.values():
        folder.mkdir(parents=True)
        (folder / "hosts.json").write_text("{}")
    (scratch / f"brisk-ranks-{dead}-lnk").symlink_to(elsewhere)
    if os.getuid() == 0:  # root can make a folder another user's
        folders["another user's"] = scratch / f"brisk-ranks-{dead}-theirs"
        folders["another user's"].mkdir()
        os.chown(folders["another user's"], 12345, 12345)
    removed = remove_stale(scratch)
    assert sorted(removed) == sorted([folders["stale"], folders["stale serve"]])
    assert not folders["stale"].exists() and not folders["stale serve"].exists()
    kept = [name for name, folder in folders.items() if folder.exists()]
    assert sorted(kept) == sorted(set(folders) - {"stale", "stale serve"})
    assert (scratch / f"brisk-ranks-{dead}-lnk").is_symlink() and (elsewhere / "keep").is_dir()


def test_a_launch_removes_stale_scratch_folders_and_names_its_own_after_its_pid(tmp_path, monkeypatch):
    import tempfile

    from brisk.engine.distributed.launch import run_on_ranks

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / f"brisk-ranks-{_dead_pid()}-abc123"
    stale.mkdir()
    seen: dict = {}

    class Launched(Exception):
        pass

    def no_launch(cmd, **kw):
        seen["own"] = Path(cmd[cmd.index("--hostfile") + 1]).parent.name
        seen["stale there"] = stale.exists()
        raise Launched

    monkeypatch.setattr(subprocess, "Popen", no_launch)
    with pytest.raises(Launched):
        run_on_ranks(["run", "--prompt", "hi"], ranks=2, hostfile=None)
    assert seen["stale there"] is False and seen["own"].startswith(f"brisk-ranks-{os.getpid()}-")
    assert list(tmp_path.iterdir()) == []  # its own is gone too once it ended


# --- a killed launcher ---------------------------------------------------------------------


def test_no_result_names_the_launcher_when_it_ended_by_itself():
    from brisk.engine.distributed.launch import no_result

    assert no_result("127.0.0.1", -9, 4321) == (
        "the ranks' launcher (mlx.launch, pid 4321) was killed by signal 9; its ranks were stopped"
    )
    assert no_result("mac1", 2, 4321) == (
        "the ranks' launcher (mlx.launch, pid 4321) exited with status 2 before rank 0 gave a result"
    )
    # mlx.launch exits 0 when its ranks ended (even failing): then rank 0 went without a word
    assert no_result("mac1", 0, 4321) == "rank 0 on host mac1 ended without a result"
    assert no_result("mac1", None, 4321) == "rank 0 on host mac1 ended without a result"


def _launcher_pid(brisk_pid: int) -> int | None:
    """The pid of the mlx.launch that `brisk_pid` started (read from /proc)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == brisk_pid and b"brisk.engine.distributed.quiet_launcher" in cmdline:
            return int(entry.name)
    return None


@pytest.mark.skipif(sys.platform != "linux", reason="finds the launcher through /proc")
def test_a_killed_launcher_is_named_not_blamed_on_rank_0(ranks_home):  # noqa: F811
    """Killing mlx.launch itself mid-answer was reported as 'rank 0 ... ended without a result'."""
    env = dict(os.environ, BRISK_HOME=str(ranks_home))
    # tq-endless never stops by itself: the answer is still running when its first byte comes
    args = ["run", "--model", "tq-endless", "--prompt", PROMPT, "--temp", "0", "--max-tokens", "30000", "--ranks", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "brisk.engine.host.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        launcher, ranks = None, [None, None]
        for _ in range(1200):  # a hang guard: the ranks are found while they start
            launcher = launcher or _launcher_pid(proc.pid)
            ranks = [_rank_pid(launcher, r) for r in (0, 1)] if launcher else ranks
            if None not in ranks or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert launcher is not None and None not in ranks, proc.stderr.read().decode()
        assert proc.stdout.read(1), proc.stderr.read().decode()  # rank 0 is mid-answer now
        for pid in ranks:  # held there while the launcher is killed
            os.kill(pid, signal.SIGSTOP)
        os.kill(launcher, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 1
    assert f"brisk: error: the ranks' launcher (mlx.launch, pid {launcher}) was killed by signal 9" in err, err
    assert "ended without a result" not in err and "Traceback" not in err
    assert not [pid for pid in ranks if _running(pid)]  # its ranks were stopped


# --- a request just after an idle rank died ---------------------------------------------------


def rank0_lost_its_peer():
    """Rank 0 as it answers once its ring lost a peer: a 500 naming MLX's ring error (the
    front then asks the launcher which rank failed)."""

    async def chat(request):
        message = "The ranks could not run this request: [ring] Socket closed"
        return JSONResponse({"error": {"message": message, "type": "server_error"}}, status_code=500)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, then closed: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WHY = "rank 1 on host 127.0.0.1 was killed by signal 9 while running (after joining the ring)"


def _says_regrouping(status: int, body: bytes) -> None:
    error = json.loads(body)["error"]
    assert status == 503 and error["code"] == "ranks_unavailable", body
    assert error["message"] == f"The ranks are regrouping after a failure ({WHY}); try again shortly"


def test_a_request_after_an_idle_rank_died_is_told_the_ranks_are_regrouping_not_cut_off(front_over):  # noqa: F811
    """The group still said 'ready' for a moment: the request reached a rank 0 that was gone,
    or one whose ring had lost its peer, and was told its answer 'was cut off'."""
    front, group = front_over(rank0_lost_its_peer(), why=WHY)
    _says_regrouping(*post(front.url, {"messages": []}))
    group.port = closed_port()  # rank 0 already stopped by the launcher
    _says_regrouping(*post(front.url, {"messages": []}))
    _says_regrouping(*post(front.url, {"messages": [], "stream": True}))


def test_a_stream_lost_before_its_first_event_is_told_the_ranks_are_regrouping(front_over):  # noqa: F811
    front, _ = front_over(rank0_stand_in(cut_after=0), why=WHY)
    status, body = post(front.url, {"stream": True, "messages": []})
    events = [e for e in body.decode().split("\n\n") if e]
    assert status == 200 and len(events) == 2 and events[1] == "data: [DONE]"
    error = json.loads(events[0].removeprefix("data: "))["error"]
    assert error["message"] == f"The ranks are regrouping after a failure ({WHY}); try again shortly"


def test_rank_0_says_a_lost_peer_instead_of_leaving_the_request_unanswered(monkeypatch):
    """Its ring's error escaped to the queue, which ended the request with no event: the
    client got a bare 499, or an empty stream."""
    from brisk.engine.api.events import EngineErrored
    from brisk.engine.distributed import serve_lockstep

    def lost(rank, payload=b""):
        raise RuntimeError("[ring] Socket 5 was closed by the peer")

    monkeypatch.setattr(serve_lockstep, "share_bytes", lost)
    delivered: list = []
    command = Answer(-1, ChatSettings(model="tq"), [Message("user", "hi")])
    serve_lockstep.leader_execute(object(), object())(command, CancelToken(), delivered.append)
    assert len(delivered) == 1 and isinstance(delivered[0], EngineErrored)
    assert "[ring] Socket 5 was closed by the peer" in delivered[0].message and delivered[0].kind == "internal"


# --- a host that never joins ------------------------------------------------------------------


def test_a_slow_join_says_which_hosts_it_waits_for_every_interval():
    """A host that accepts TCP but never completes ssh kept `brisk` silent for the whole
    --join-timeout (120 s)."""
    from brisk.engine.distributed.hostfile import parse_hosts
    from brisk.engine.distributed.launch import JOIN_PROGRESS_S, RankWatch
    from tests.engine.test_distributed import FakeClock

    hosts = parse_hosts([{"ssh": name, "ips": [f"10.0.0.{i + 1}"]} for i, name in enumerate("abc")], "h")
    clock = FakeClock()
    watch = RankWatch(hosts, clock=clock)
    watch.read_line("@brisk-rank 0 joined\n")
    watch.read_line("@brisk-rank 1 started\n")
    said = []
    for now in (1.0, JOIN_PROGRESS_S - 0.5, JOIN_PROGRESS_S, JOIN_PROGRESS_S + 5, 2 * JOIN_PROGRESS_S):
        clock.now = now
        said.append(watch.join_progress(0.0, 120.0))
    waiting = "brisk: waiting for hosts b (rank 1), c (rank 2, not started yet) to join"
    first, second = (f"{waiting} ({n * JOIN_PROGRESS_S:.0f} s of 120 s)" for n in (1, 2))
    assert said == [None, None, first, None, second]
    watch.read_line("@brisk-rank 1 joined\n")
    clock.now = 5.5 * JOIN_PROGRESS_S  # a long stall: one line, not one per interval missed
    late = f"brisk: waiting for host c (rank 2, not started yet) to join ({5.5 * JOIN_PROGRESS_S:.0f} s of 120 s)"
    assert watch.join_progress(0.0, 120.0) == late
    assert watch.join_progress(0.0, 120.0) is None
    watch.read_line("@brisk-rank 2 joined\n")
    clock.now = 10 * JOIN_PROGRESS_S
    assert watch.join_progress(0.0, 120.0) is None  # all joined: nothing more to say


def test_a_follower_sleeps_after_each_idle_tick_and_runs_the_commands_between(monkeypatch):
    """Between requests rank 0 sends empty ticks (MLX's ring waits by polling: an idle
    follower kept a core busy); a follower sleeps after each, runs what comes, stops on STOP."""
    from brisk.engine.distributed import serve_lockstep

    forget = serve_lockstep.encode(serve_lockstep.ForgetConversation(-4))
    payloads = iter([b"", b"", forget, b"", serve_lockstep.encode(serve_lockstep.STOP)])
    seen = []
    monkeypatch.setattr(serve_lockstep, "share_bytes", lambda rank, payload=b"": next(payloads))
    monkeypatch.setattr(serve_lockstep, "time", SimpleNamespace(sleep=lambda s: seen.append(("sleep", s))))
    monkeypatch.setattr(serve_lockstep, "AgreedCancel", lambda rank, local: None)
    monkeypatch.setattr(
        serve_lockstep, "run_command", lambda rank, worker, command, cancel, deliver: seen.append(command)
    )
    assert serve_lockstep.follow(object(), object()) == 0
    nap = ("sleep", serve_lockstep.FOLLOWER_SLEEP_S)
    assert seen == [nap, nap, serve_lockstep.ForgetConversation(-4), nap]
    assert 0 < serve_lockstep.FOLLOWER_SLEEP_S < serve_lockstep.IDLE_TICK_S  # back before rank 0's next tick


def test_rank_0s_idle_tick_sends_an_empty_payload_and_stops_once_the_ring_broke(monkeypatch):
    from brisk.engine.distributed import serve_lockstep

    sent = []

    def share(rank, payload=b""):
        sent.append(payload)
        if len(sent) == 2:
            raise RuntimeError("[ring] lost a peer")
        return payload

    monkeypatch.setattr(serve_lockstep, "share_bytes", share)
    tick = serve_lockstep.leader_idle(object())
    for _ in range(4):
        tick()
    assert sent == [b"", b""]  # the broken ring is not polled again; the next request reports it
