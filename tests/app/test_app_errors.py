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
