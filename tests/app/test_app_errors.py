"""`brisk-app` never shows a Python traceback: unusable databases are refused in a sentence,
and a bug in the window is one status-bar line with the log file's path."""

import os
import subprocess
import sys


def brisk_app(tmp_path, *args):
    env = dict(os.environ, BRISK_HOME=str(tmp_path / "home"), QT_QPA_PLATFORM="offscreen")
    return subprocess.run(
        [sys.executable, "-m", "brisk.app.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_folder_as_database_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "Documents"
    folder.mkdir()
    (folder / "thesis.txt").write_text("years of work")
    out = brisk_app(tmp_path, "--database", str(folder), "--check")
    assert out.returncode == 1 and "is a folder" in out.stderr and "Traceback" not in out.stderr
    assert (folder / "thesis.txt").read_text() == "years of work" and sorted(tmp_path.iterdir()) == [folder]


def test_a_bug_in_a_slot_is_a_status_line_and_a_log_entry(qtbot, make_window, monkeypatch, tmp_path):
    from brisk.app.main import _report_bug
    from brisk.engine.runtime.crash_log import log_path

    monkeypatch.setenv("BRISK_HOME", str(tmp_path))
    w = make_window()
    try:
        raise ZeroDivisionError("a bug")
    except ZeroDivisionError as exc:
        _report_bug(w, exc)
    line = w.statusBar().currentMessage()
    assert "ZeroDivisionError: a bug" in line and str(log_path()) in line
    assert "Traceback" in log_path().read_text() and "Traceback" not in line
    assert oct(log_path().stat().st_mode & 0o777) == "0o600"


# `--check` with a load that ends before the window is shown: the worker says what it
# downloads and that it loaded, and the window's show() waits until it has (the race a
# loaded CI machine lost: the first line went unprinted; a fast load's end would hang).
FAST_LOAD = r"""
import sys, threading
from brisk.app import main as app_main
from brisk.app.window import MainWindow
from brisk.engine.api.events import ModelLoaded, ModelLoadProgressed
from brisk.engine.host.worker import LoadModel

said = threading.Event()

class FastLoad:
    def handle(self, command, cancel):
        if isinstance(command, LoadModel):
            yield ModelLoadProgressed(command.model_id, "Downloading tiny from a loopback index: 1 MiB in 1 file")
            yield ModelLoaded(command.model_id, {"architecture": "llama", "context_length": 2048})
            said.set()

real_build, real_show = app_main.build_window, MainWindow.show
app_main.build_window = lambda **kw: real_build(**kw, worker=FastLoad(), models=[])

def late_show(self):
    said.wait(30)
    real_show(self)

MainWindow.show = late_show
sys.exit(app_main.main(["--check", "--model", "tiny", "--database", sys.argv[1]]))
"""


def test_check_prints_what_the_engine_said_before_the_window_showed_and_ends(tmp_path):
    env = dict(os.environ, BRISK_HOME=str(tmp_path / "home"), QT_QPA_PLATFORM="offscreen")
    out = subprocess.run(
        [sys.executable, "-c", FAST_LOAD, str(tmp_path / "brisk.db")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "tiny: Downloading tiny from a loopback index" in out.stdout, out.stdout + out.stderr
    assert "first window after" in out.stdout and "Traceback" not in out.stderr
