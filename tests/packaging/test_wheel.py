"""The wheel carries everything: built with `python -m build`, installed with its
dependencies into a fresh virtualenv outside the source tree, beside another distribution
whose top-level packages are named `engine` and `app`, the app finds its icons and stylesheet
and `brisk info` runs; the kernel sources in it are the ones the tests compiled. The benchmarks are not
in it: `brisk bench` says how to get them, and their own wheel (bench/) adds the command."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*cmd, **kwargs):
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT)  # the sdist, then the wheel built from it
    return out


@pytest.fixture(scope="module")
def wheel(dist):
    (found,) = dist.glob("brisk-*.whl")
    return found


def test_build_makes_an_sdist_and_a_wheel(dist):
    assert len(list(dist.glob("brisk-*.tar.gz"))) == 1
    assert len(list(dist.glob("brisk-*-py3-none-any.whl"))) == 1


def test_the_wheel_holds_the_package_data_and_kernel_sources(wheel):
    import brisk.resources as resources

    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"brisk/resources/icons/{icon}.svg" for icon in resources.ICON_NAMES}
    wanted |= {f"brisk/resources/styles/{style}" for style in resources.STYLES}
    wanted |= {
        "brisk/resources/text/kv_selftest.txt",
        "brisk/kernels/csrc/packed_attention.cpp",
        "brisk/kernels/csrc/mlx_primitives/primitives.cpp",
    }
    assert wanted <= names
    assert not [n for n in names if "screenshots" in n]  # README material, not the app's


def test_the_wheel_carries_every_kernel_source_byte_for_byte(wheel):
    """What the installed Brisk compiles its kernels from: the very files the engine and
    kernel tests compiled and checked. (Compiling them from an installed, non-editable Brisk
    is what the Linux bundle's build does: packaging/build_kernels.py, in CI's bundle stage.)"""
    csrc = ROOT / "kernels" / "csrc"
    with zipfile.ZipFile(wheel) as archive:
        carried = {n.removeprefix("brisk/kernels/csrc/"): archive.read(n) for n in archive.namelist() if "/csrc/" in n}
    tree = {str(p.relative_to(csrc)): p.read_bytes() for p in csrc.rglob("*") if p.suffix in (".cpp", ".h")}
    assert carried == tree


def test_the_wheel_holds_every_python_module_of_the_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = ("engine", "kernels", "app", "resources")
    tree = {f"brisk/{p.relative_to(ROOT)}" for top in packages for p in (ROOT / top).rglob("*.py")}
    assert tree - names == set()
    # Nothing at the top of site-packages but `brisk/` and the wheel's metadata.
    assert {n.split("/")[0] for n in names} - {"brisk"} == {n.split("/")[0] for n in names if ".dist-info/" in n}


def test_the_wheel_leaves_the_benchmarks_out(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "brisk/engine/host/cli.py" in names
    assert [n for n in names if n.startswith("brisk/bench") or "/bench/" in n] == []


@pytest.fixture(scope="module")
def bench_wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT / "bench")  # from its sdist, as above
    (found,) = out.glob("brisk_bench-*-py3-none-any.whl")
    return found


def test_the_benchmarks_wheel_holds_brisk_bench_only_at_brisks_version(bench_wheel):
    from brisk.engine.version import __version__

    with zipfile.ZipFile(bench_wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    modules = {n.removeprefix("brisk/bench/") for n in names if not n.startswith("brisk_bench-")}
    assert modules == {p.name for p in (ROOT / "bench").glob("*.py")} - {"setup.py"}
    assert f"Version: {__version__}" in lines and f"Requires-Dist: brisk=={__version__}" in lines


def collider(folder: Path) -> Path:
    """A distribution of someone else's, with top-level packages named `engine` and `app`."""
    for package in ("engine", "app"):
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text(f"WHOSE = 'collider {package}'\n")
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "engine-collider"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["engine", "app"]\n'
    )
    return folder


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fresh") / "venv"
    run(sys.executable, "-m", "venv", folder)
    python = folder / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", f"{wheel}[gui]")
    # Installed after Brisk, so that a collision would overwrite Brisk's files: the tests below
    # then run beside it.
    source = collider(tmp_path_factory.mktemp("collider"))
    run(python, "-m", "pip", "install", "-q", source)
    return folder


def clean_env(home: Path) -> dict:
    """No path back into the source tree: only the venv's own site-packages count. No kernels
    either: compiling both libraries again (~50 CPU-s) would check no more than the byte-for-byte
    test of the sources above and the bundle's build do."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "BRISK_KERNEL_CACHE")}
    return dict(env, BRISK_HOME=str(home), QT_QPA_PLATFORM="offscreen", BRISK_KERNELS="off")


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny_llama_dir):
    """One data folder for the installed commands, with the tiny model installed."""
    from brisk.engine.models.store import ModelStore

    home = tmp_path_factory.mktemp("wheel-home") / "home"
    ModelStore(home).install_folder(tiny_llama_dir, model_id="tiny", source="test")
    return home


def test_the_installed_app_finds_its_icons_and_stylesheet(venv, home, tmp_path):
    done = run(venv / "bin" / "brisk-app", "--check", "--model", "tiny", cwd=tmp_path, env=clean_env(home))
    lines = done.stdout.splitlines()
    assert "resources: all found" in done.stdout, done.stdout
    assert str(venv) in next(line for line in lines if line.startswith("resources:"))  # the wheel's, not ours
    stylesheet = int(next(line for line in lines if line.startswith("stylesheet:")).split()[1])
    assert stylesheet == len((ROOT / "resources" / "styles" / "light.qss").read_text())
    assert "window icon: loaded" in lines


def test_brisk_installs_under_its_own_name_beside_a_colliding_engine_package(venv, tmp_path):
    python = venv / "bin" / "python"
    code = "import engine, app, brisk.engine, brisk.app.main; print(engine.WHOSE, app.WHOSE, brisk.engine.__file__)"
    done = run(python, "-c", code, cwd=tmp_path, env=clean_env(tmp_path / "home"))
    assert done.stdout.startswith("collider engine collider app "), done.stdout
    assert done.stdout.split()[-1].endswith("site-packages/brisk/engine/__init__.py"), done.stdout


def test_the_installed_brisk_info_runs_from_the_installed_package(venv, home, tmp_path):
    done = run(venv / "bin" / "brisk", "info", "--json", cwd=tmp_path, env=clean_env(home))
    info = json.loads(done.stdout)
    assert info["compute_dtype"] == "stored" and info["kernels_mlx_ops"].startswith("off"), info
    assert info["backend"].startswith("mlx ") and info["brisk_home"] == str(home), info
    version = run(venv / "bin" / "brisk", "--version", cwd=tmp_path, env=clean_env(home))
    from brisk.engine.version import __version__

    assert version.stdout.startswith(f"Brisk {__version__}")


def test_the_installed_brisk_bench_says_in_one_line_how_to_get_the_benchmarks(venv, tmp_path):
    done = subprocess.run(
        [venv / "bin" / "brisk", "bench", "doc-qa", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=clean_env(tmp_path / "home"),
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines() == [
        "brisk bench: the benchmarks are not installed: "
        "from Brisk's source checkout, pip install -e ./bench (brisk-bench is not on PyPI; "
        "where it is published beside Brisk, pip install 'brisk[bench]')"
    ]


def test_the_benchmarks_wheel_adds_brisk_bench_beside_the_installed_brisk(venv, bench_wheel, tmp_path):
    """Installed into a folder of its own (the shared venv stays without it), on PYTHONPATH: its
    `brisk/bench/` joins the venv's `brisk` namespace and its entry point adds the command."""
    target = tmp_path / "bench-site"
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--target", target, bench_wheel)
    env = dict(clean_env(tmp_path / "home"), PYTHONPATH=str(target))
    done = run(venv / "bin" / "brisk", "bench", "doc-qa", "--help", cwd=tmp_path, env=env)
    assert "--target" in done.stdout and "not installed" not in done.stderr
