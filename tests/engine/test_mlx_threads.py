"""MLX threads end without aborting the process (engine/runtime/mlx_threads.py).

A thread that ran an `mx.compile` trace and ends while Python finalizes aborts the process
(MLX's per-thread compile cache takes the GIL in its destructor). With a plain thread,
join-then-exit aborted 4 runs in 10 here; each run below fails on a plain thread with about
that chance, so six clean runs in a row would be a ~5% fluke."""

import subprocess
import sys
import threading

from brisk.engine.runtime.mlx_threads import MlxThread

EXIT_AFTER_COMPILED_WORK = """
import mlx.core as mx
from brisk.engine.runtime.mlx_threads import MlxThread

double = mx.compile(lambda x: x * 2 + 1)
thread = MlxThread(lambda: mx.eval(double(mx.ones((4,)))), name="compiled")
thread.start()
assert thread.join(30)
"""


def test_a_process_ends_cleanly_after_its_mlx_thread_ran_a_compiled_function():
    for _ in range(6):
        done = subprocess.run([sys.executable, "-c", EXIT_AFTER_COMPILED_WORK], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-400:]
        assert "terminate called" not in done.stderr


def test_join_waits_for_the_work_and_says_when_it_timed_out():
    release, ran = threading.Event(), []
    thread = MlxThread(lambda: (release.wait(10), ran.append(1)), name="waits")
    thread.start()
    assert not thread.join(0.05) and thread.is_alive()
    release.set()
    assert thread.join(10) and ran == [1]
    assert not thread.is_alive()  # done, though the thread itself stays parked


def test_a_failing_target_is_logged_and_still_counts_as_finished(caplog):
    def broken():
        raise RuntimeError("boom")

    thread = MlxThread(broken, name="broken")
    with caplog.at_level("ERROR", logger="brisk.engine.runtime.mlx_threads"):
        thread.start()
        assert thread.join(10)
    assert "broken failed" in caplog.text and "boom" in caplog.text
