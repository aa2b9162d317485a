"""The launching side of `brisk run --ranks N` / `--hostfile hosts.json`.

Brisk starts its ranks through `mlx.launch` (ring backend; loopback for --ranks), relays
rank 0's output as its own, and watches the ranks, because neither MLX's ring nor
mlx.launch bounds a wait: a ring whose peer never comes waits to join for good, and
mlx.launch exits 0 even when a rank failed. The watch:

- join: every rank says `started` when its Python runs and `joined` once the ring is up;
  one that has not joined within --join-timeout is named with its host;
- during the run: every rank says `alive` each second; one silent for --rank-timeout
  (killed, stopped, its host or link gone) is named, and the group is stopped instead of
  waiting forever on a collective it will never complete;
- a rank that exits with an error or a signal is named, with what it printed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from brisk.engine.api.errors import BriskError
from brisk.engine.distributed.chat_input import ANSWERING, relay_user_input, send_cancel, take_markers
from brisk.engine.distributed.group import HOSTS_ENV, MARKER
from brisk.engine.distributed.hostfile import Host, check_reachable, loopback, read_hostfile, to_launch_json
from brisk.engine.distributed.lockstep import PROBE_ENV
from brisk.engine.distributed.quiet_launcher import STDIN_ENV
from brisk.engine.distributed.scratch import RUN_PREFIX, private_folder
from brisk.engine.runtime.python_argv import module_argv

JOIN_TIMEOUT_S = 120.0
RANK_TIMEOUT_S = 30.0
DEATH_GRACE_S = 3.0  # after a rank died, how long the survivors get to end by themselves
# a join this slow is worth a word (an ssh login that never completes is silent otherwise);
# more often would flood a slow but healthy start
JOIN_PROGRESS_S = 10.0
DOUBLE_INTERRUPT_S = 1.0  # a chat's Ctrl-C twice within this many seconds ends the chat
RANK_ARGS = {"--ranks": True, "--hostfile": True, "--join-timeout": True, "--rank-timeout": True}
_LAUNCHER_EXIT = re.compile(r"Node with rank (\d+) exited with code (-?\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RankFailed(BriskError):
    """A rank died, stopped answering or never joined: the group was stopped."""


def launcher_argv() -> list[str]:
    """mlx.launch from this Python's environment, its relay kept from spinning."""
    return module_argv("brisk.engine.distributed.quiet_launcher")


def rank_argv(argv: list[str]) -> list[str]:
    """The user's brisk arguments without the ones that start ranks, with a seed that every
    rank shares (each would otherwise draw its own and sample different tokens)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in RANK_ARGS:
            skip = "=" not in arg and RANK_ARGS[name]
            continue
        out.append(arg)
    if not any(a == "--seed" or a.startswith("--seed=") for a in out):
        out += ["--seed", str(random.SystemRandom().randrange(2**31))]
    return out


def free_port_run(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports free on `host` (checked by binding them)."""
    rng = random.SystemRandom()
    for _ in range(50):
        base = rng.randrange(20000, 60000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind((host, port))
            return base
        except OSError:
            continue
    raise BriskError("No free ports for the ranks' ring on this machine")


@dataclass
class RankState:
    host: str
    started: bool = False
    joined: bool = False
    last_seen: float = 0.0
    exit_code: int | None = None  # from the rank's own `exit` marker
    died_with: int | None = None  # from mlx.launch: the process's status
    said: list[str] = field(default_factory=list)  # its last stderr lines (errors)


class RankWatch:
    """What the ranks told the launcher, read from mlx.launch's merged stderr."""

    def __init__(self, hosts: list[Host], clock=time.monotonic, *, hold_errors: bool = True):
        self.clock = clock
        self.hold_errors = hold_errors  # False for a server: its log is read as it runs
        self.ranks = [RankState(h.ssh, last_seen=clock()) for h in hosts]
        self.lock = threading.Lock()
        self.first_death: int | None = None
        self.death_seen_at = 0.0
        # A rank's error lines wait until the group ends: when a peer died, a survivor's
        # "connection to a peer was lost" is a consequence, and the cause is said instead.
        self.held_errors: list[tuple[int, str]] = []  # (rank, line)
        self.progress_due = JOIN_PROGRESS_S  # seconds into the join when the next progress line is due
        self.answering = False  # a chat's rank 0 is answering (its Ctrl-C stops the answer)

    def read_line(self, line: str) -> str | None:
        """Note a marker or a launcher report; return the line if the user should see it."""
        plain = _ANSI.sub("", line).strip()
        with self.lock:
            if plain.startswith(MARKER):
                parts = plain.split()
                if len(parts) >= 3 and parts[1].isdigit() and int(parts[1]) < len(self.ranks):
                    state = self.ranks[int(parts[1])]
                    state.last_seen = self.clock()
                    if parts[2] == "started":
                        state.started = True
                    elif parts[2] == "joined":
                        state.joined = True
                    elif parts[2] == "exit" and len(parts) > 3:
                        state.exit_code = int(parts[3])
                return None
            match = _LAUNCHER_EXIT.search(plain)
            if match:
                rank, code = int(match.group(1)), int(match.group(2))
                if rank < len(self.ranks):
                    self.ranks[rank].died_with = code
                    # the launcher stops the others with SIGTERM once one fails
                    if code != -signal.SIGTERM:
                        first = self.first_death
                        if first is None:
                            self.first_death, self.death_seen_at = rank, self.clock()
                        elif code < 0 and (self.ranks[first].died_with or 0) > 0:
                            # one killed by a signal is the cause over one that exited with an
                            # error after it (its ring lost the peer): mlx.launch may report
                            # the two in either order
                            self.first_death = rank
                return None
            if plain.startswith("[ring]"):
                return None  # the survivors' socket errors once a peer is gone: the cause is said below
            found = re.match(r"\[rank (\d+) on ", plain)
            if found and int(found.group(1)) < len(self.ranks):
                self.ranks[int(found.group(1))].said = (self.ranks[int(found.group(1))].said + [plain])[-3:]
            said = plain[found.end() :].split("] ", 1)[-1] if found else plain
            if self.hold_errors and said.startswith(("ERROR ", "brisk: error:")):
                self.held_errors.append((int(found.group(1)) if found else 0, line))
                return None
        return line

    def errors_to_show(self) -> list[str]:
        """The held error lines, once the group ended: all of them when no rank failed; the
        failing rank's own when it said why itself; none when it died without a word (the
        others' lines are what they saw of it, and failure() names the cause)."""
        with self.lock:
            culprit = self.first_death
            if culprit is None:
                culprit = next((i for i, r in enumerate(self.ranks) if r.exit_code not in (None, 0)), None)
            if culprit is None:
                return [line for _, line in self.held_errors]
            if self.ranks[culprit].exit_code not in (None, 0):
                return [line for rank, line in self.held_errors if rank == culprit]
            return []

    def join_progress(self, started_at: float, join_timeout: float) -> str | None:
        """A line naming the ranks the group still waits for, every JOIN_PROGRESS_S while
        some have not joined; None between lines and once all have."""
        waited = self.clock() - started_at
        with self.lock:
            missing = [(i, r) for i, r in enumerate(self.ranks) if not r.joined]
            if not missing or waited < self.progress_due:
                return None
            self.progress_due = (waited // JOIN_PROGRESS_S + 1) * JOIN_PROGRESS_S  # one line after a long stall
            names = ", ".join(f"{r.host} (rank {i}{'' if r.started else ', not started yet'})" for i, r in missing)
        hosts = "host" if len(missing) == 1 else "hosts"
        return f"brisk: waiting for {hosts} {names} to join ({waited:.0f} s of {join_timeout:.0f} s)"

    def problem(self, started_at: float, join_timeout: float, rank_timeout: float) -> str | None:
        """Why the group must be stopped now, or None."""
        now = self.clock()
        with self.lock:
            # A rank died and the group has not ended on its own: mlx.launch waits for the
            # survivors, and one may wait on its dead peer (or finish a request) for good.
            if self.first_death is not None and now - self.death_seen_at > DEATH_GRACE_S:
                r = self.ranks[self.first_death]
                return f"rank {self.first_death} on host {r.host} {_how_it_ended(r)}"
            missing = [i for i, r in enumerate(self.ranks) if not r.joined]
            if missing and now - started_at > join_timeout:
                return (
                    "; ".join(
                        f"rank {i} on host {self.ranks[i].host} "
                        + ("did not join the ring" if self.ranks[i].started else "never started")
                        for i in missing
                    )
                    + f" within {join_timeout:.0f} s"
                )
            for i, r in enumerate(self.ranks):
                if r.joined and r.exit_code is None and r.died_with is None and now - r.last_seen > rank_timeout:
                    return (
                        f"rank {i} on host {r.host} stopped answering (no sign of life for {rank_timeout:.0f} s: "
                        "its process is stopped, or its host or link is gone)"
                    )
        return None

    def failure(self) -> str | None:
        """After the launcher ended: the rank that failed first, said plainly, or None."""
        with self.lock:
            culprit = self.first_death
            if culprit is None:
                culprit = next((i for i, r in enumerate(self.ranks) if r.exit_code not in (None, 0)), None)
            if culprit is None:
                return None
            r = self.ranks[culprit]
            if r.exit_code not in (None, 0):  # it said why itself, on stderr
                return None if culprit == 0 else f"rank {culprit} on host {r.host} failed; the other ranks were stopped"
            return f"rank {culprit} on host {r.host} {_how_it_ended(r)}; the other ranks were stopped"


def _how_it_ended(r: RankState) -> str:
    code = r.died_with
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
    return how + (" while running (after joining the ring)" if r.joined else " before joining the ring")


def run_on_ranks(
    argv: list[str],
    *,
    ranks: int | None,
    hostfile: str | None,
    join_timeout: float = JOIN_TIMEOUT_S,
    rank_timeout: float = RANK_TIMEOUT_S,
    stdout=None,
    stderr=None,
    stop: threading.Event | None = None,
    hold_errors: bool = True,
    relay_input: bool = False,
) -> int:
    """Run `brisk <argv>` on the ranks; rank 0's output becomes this process's. Returns rank
    0's status; raises RankFailed naming the rank and host that failed. Setting `stop` ends
    the group (`brisk serve --ranks` closing). `relay_input` (a chat): this process's stdin
    reaches every rank, and Ctrl-C stops the answer rather than the group (twice within
    DOUBLE_INTERRUPT_S: the group)."""
    hosts = read_hostfile(hostfile) if hostfile else loopback(ranks or 0)
    check_reachable(hosts)
    out = stdout or sys.stdout.buffer
    err = stderr or sys.stderr
    with private_folder(RUN_PREFIX) as tmp:  # removes those a killed brisk left
        hostfile_path = Path(tmp) / "hosts.json"
        hostfile_path.write_text(to_launch_json(hosts))

        # brisk re-executes itself with malloc tunables (engine/host/cli.py); the ranks get the same
        forwarded = ("GLIBC_TUNABLES", PROBE_ENV, "BRISK_KERNELS", "BRISK_ISA", "BRISK_KERNEL_THREADS")
        tunables = [f"{name}={os.environ[name]}" for name in forwarded if name in os.environ]

        cmd = [
            *launcher_argv(),
            "--backend",
            "ring",
            "--hostfile",
            str(hostfile_path),
            "--starting-port",
            str(free_port_run(len(hosts))),
            "--env",
            f"{HOSTS_ENV}={','.join(h.ssh for h in hosts)}",
            *[arg for env in tunables for arg in ("--env", env)],
            "--",
            *module_argv("brisk.engine.distributed.rank", *rank_argv(argv)),
        ]
        watch = RankWatch(hosts, hold_errors=hold_errors)
        # stdin is a pipe held open: mlx.launch copies it to every rank; only a chat writes it
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the terminal's Ctrl-C reaches this brisk alone
            preexec_fn=_die_with_launcher if sys.platform == "linux" else None,
            env={**os.environ, STDIN_ENV: "relay"} if relay_input else None,
        )
        tail = [b""]  # the last byte of rank 0's output
        relays = [
            threading.Thread(target=_copy, args=(proc.stdout, out, tail, watch if relay_input else None), daemon=True),
            threading.Thread(target=_watch_lines, args=(proc.stderr, watch, err), daemon=True),
        ]
        for t in relays:
            t.start()
        if relay_input:  # not joined: it waits on the user's next line
            threading.Thread(target=relay_user_input, args=(sys.stdin, proc.stdin), daemon=True).start()
            default_interrupt = signal.signal(signal.SIGINT, _CancelOnInterrupt(proc.stdin, watch))
        started_at = watch.clock()
        problem = None
        launcher_status = None  # mlx.launch's status when it ended by itself (not stopped here)
        try:
            while proc.poll() is None:
                problem = watch.problem(started_at, join_timeout, rank_timeout)
                if problem:
                    _stop(proc)
                    break
                if (progress := watch.join_progress(started_at, join_timeout)) is not None:
                    err.write(progress + "\n")
                    err.flush()
                if stop is not None and stop.wait(0.2):
                    _stop(proc)
                    break
                if stop is None:
                    time.sleep(0.2)
            else:
                launcher_status = proc.returncode
                if launcher_status:  # killed or failed: its local ranks go now, not at their next heartbeat
                    _stop(proc)
        except BaseException:  # Ctrl-C included: no rank outlives its launcher
            _stop(proc)
            _end_line(out, tail)
            raise
        finally:
            if relay_input:
                signal.signal(signal.SIGINT, default_interrupt)
            for t in relays:
                t.join(timeout=5)
            if proc.stdin:
                proc.stdin.close()
        if not problem:
            shown = watch.errors_to_show()
            if shown:
                _end_line(out, tail)
            for line in shown:
                err.write(line)
            err.flush()
        if problem:
            _end_line(out, tail)
            raise RankFailed(problem + "; the group was stopped")
        failed = watch.failure()
        if failed:
            _end_line(out, tail)
            raise RankFailed(failed)
        code = watch.ranks[0].exit_code
        if code is None:
            _end_line(out, tail)
            raise RankFailed(no_result(hosts[0].ssh, launcher_status, proc.pid))
        return code


class _CancelOnInterrupt:
    """A chat's Ctrl-C, as in one process: during an answer it stops the answer on every
    rank and the chat goes on; elsewhere (loading, at the prompt), or twice within
    DOUBLE_INTERRUPT_S, it raises KeyboardInterrupt, which ends the chat and its ranks."""

    def __init__(self, sink, watch: RankWatch):
        self.sink, self.watch, self.last = sink, watch, -DOUBLE_INTERRUPT_S

    def __call__(self, signum, frame) -> None:
        now = time.monotonic()
        if not self.watch.answering or now - self.last < DOUBLE_INTERRUPT_S:
            raise KeyboardInterrupt
        self.last = now
        send_cancel(self.sink)


def no_result(host0: str, launcher_status: int | None, launcher_pid: int) -> str:
    """Why rank 0 gave no result when no rank was seen failing: mlx.launch itself ended
    (killed, or failed by itself: its ranks' reports went with it), or rank 0 went silently."""
    launcher = f"the ranks' launcher (mlx.launch, pid {launcher_pid})"
    if launcher_status is not None and launcher_status < 0:
        return f"{launcher} was killed by signal {-launcher_status}; its ranks were stopped"
    if launcher_status:
        return f"{launcher} exited with status {launcher_status} before rank 0 gave a result"
    return f"rank 0 on host {host0} ended without a result"


def _copy(source, target, tail: list[bytes], watch: RankWatch | None = None) -> None:
    """Rank 0's output to `target`; with `watch` (a chat), its answer markers to the watch."""
    held = b""

    def on_mark(marker: bytes) -> None:
        if watch is not None:
            watch.answering = marker == ANSWERING

    for chunk in iter(lambda: source.read1(8192), b""):
        shown, held = take_markers(held + chunk, on_mark) if watch is not None else (chunk, b"")
        if shown:
            target.write(shown)
            target.flush()
            tail[0] = shown[-1:]


def _end_line(target, tail: list[bytes]) -> None:
    """A line break after rank 0's last output, so an error line starts on a line of its own."""
    if tail[0] not in (b"", b"\n"):
        target.write(b"\n")
        target.flush()


def _watch_lines(source, watch: RankWatch, target) -> None:
    for raw in iter(source.readline, b""):
        line = watch.read_line(raw.decode("utf-8", errors="replace"))
        if line is not None:
            target.write(line)
            target.flush()


def _die_with_launcher() -> None:
    """In mlx.launch, before it runs (Linux): killed when this thread's process dies, even
    by SIGKILL. Its ranks then lose their stderr pipe, and leave (group.py's heartbeat)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _stop(proc: subprocess.Popen) -> None:
    """Stop mlx.launch and every local rank (one process group); remote ranks lose their ssh.
    The group is killed even once mlx.launch has left: a rank that waits on SIGTERM (a server
    finishing a request stuck in a collective) would outlive it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=3.0)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=3.0)
    except subprocess.TimeoutExpired:
        pass
