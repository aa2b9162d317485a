"""`brisk` run in a folder holding packages named like Brisk's must still run Brisk's code.

Issue 54 item 18: the console script re-executes itself (for glibc's malloc tunables) and
used `python -m brisk.engine.host.cli`, which puts the current folder first on sys.path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from brisk.engine.runtime.python_argv import module_argv

HIJACK = "import pathlib; pathlib.Path({marker!r}).write_text('ran'); raise SystemExit('hijacked')\n"


def _hostile_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A folder whose `brisk`, `engine`, `kernels`, `app` and `mlx` packages each leave a marker when imported."""
    folder, marker = tmp_path / "clone", tmp_path / "marker"
    for name in ("brisk", "engine", "kernels", "app", "mlx"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(HIJACK.format(marker=str(marker)))
    return folder, marker


def _brisk_script() -> Path:
    script = Path(sys.executable).parent / "brisk"
    if not script.is_file():
        pytest.skip(f"no installed `brisk` console script beside {sys.executable} (run from an installed venv)")
    return script


def test_the_console_script_ignores_packages_in_the_current_folder(tmp_path):
    folder, marker = _hostile_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "PYTHONPATH", "PYTHONSAFEPATH")}
    env["BRISK_HOME"] = str(tmp_path / "home")
    out = subprocess.run(
        [str(_brisk_script()), "--version"], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )
    assert not marker.exists(), "the current folder's package was imported"
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Brisk "), out.stdout


def test_module_argv_runs_brisk_modules_with_the_current_folder_off_the_path(tmp_path):
    folder, marker = _hostile_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    probe = "brisk.engine.version"
    out = subprocess.run(module_argv(probe), cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert not marker.exists(), "the current folder's package was imported"
    assert out.returncode == 0, out.stderr
