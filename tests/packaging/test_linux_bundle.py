"""The Linux bundle (packaging/linux/build.sh) runs on a machine with no Python and no
compiler: unpacked into a clean folder, started with an empty BRISK_HOME and a PATH that
holds neither, it installs the default model, opens its window offscreen, answers, and
uses the prebuilt kernels."""

import os
import subprocess
import sys
import tarfile

import pytest

BUNDLE = os.environ.get("BRISK_BUNDLE")
pytestmark = [
    pytest.mark.skipif(
        not BUNDLE,
        reason="set BRISK_BUNDLE to a tarball from packaging/linux/build.sh (.ci/run builds one and sets it)",
    ),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux bundle runs on Linux"),
]


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    where = tmp_path_factory.mktemp("clean")
    with tarfile.open(BUNDLE) as tar:
        tar.extractall(where, filter="tar")
    (folder,) = where.iterdir()
    return folder


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory):
    """Nothing of this machine's: an empty home and data folder, no Python or compiler on PATH."""
    home = tmp_path_factory.mktemp("home")
    empty_bin = tmp_path_factory.mktemp("bin")
    return {
        "HOME": str(home),
        "PATH": str(empty_bin),
        "LANG": "C.UTF-8",
        "BRISK_HOME": str(home / "brisk"),
        "QT_QPA_PLATFORM": "offscreen",
    }


def run(folder, env, *args):
    done = subprocess.run(
        [str(folder / args[0]), *args[1:]], cwd=folder, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_bundle_holds_the_app_the_cli_link_and_the_desktop_entry(unpacked):
    assert os.access(unpacked / "brisk-app", os.X_OK)
    assert (unpacked / "brisk").is_symlink() and os.readlink(unpacked / "brisk") == "brisk-app"
    entry = (unpacked / "brisk.desktop").read_text()
    assert "Exec=brisk-app" in entry and "Icon=brisk" in entry and (unpacked / "brisk.svg").is_file()


def test_first_run_says_what_it_downloads_then_installs_the_default_and_opens(unpacked, bare_env):
    out = run(unpacked, bare_env, "brisk-app", "--check")
    lines = out.splitlines()
    said = next(i for i, line in enumerate(lines) if "Downloading smollm2-135m-instruct from" in line)
    assert " MiB in 1 file" in lines[said]
    downloading = [i for i, line in enumerate(lines) if "downloading smollm2-135m-instruct" in line]
    assert downloading and said < downloading[0]  # said before it started
    assert "smollm2-135m-instruct loaded" in out and "resources: all found" in out and "window icon: loaded" in out
    assert any(line.startswith("first window after") for line in lines)


def test_the_cli_answers_and_uses_the_prebuilt_kernels(unpacked, bare_env):
    run(unpacked, bare_env, "brisk-app", "--check")  # the default model (installed once)
    info = run(unpacked, bare_env, "brisk", "info")
    assert f"kernels_ctypes: prebuilt ({unpacked}" in info and f"kernels_mlx_ops: prebuilt ({unpacked}" in info
    assert "blas: mkl" in info
    answer = run(
        unpacked,
        bare_env,
        "brisk",
        "run",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "12",
        "--temp",
        "0",
    )
    assert "Paris" in answer
    assert run(unpacked, bare_env, "brisk", "--version").startswith("Brisk ")


def test_only_the_mkl_libraries_mkl_can_load_for_our_calls_are_shipped(unpacked):
    shipped = {p.name for p in (unpacked / "_internal" / "lib").iterdir()}
    assert {"libmkl_rt.so.3", "libmkl_core.so.3", "libmkl_intel_thread.so.3", "libiomp5.so"} <= shipped
    assert not [
        name
        for name in shipped
        if any(cut in name for cut in ("scalapack", "blacs", "omptarget", "sycl", "ilp64", "tbb_thread", "gnu_thread"))
    ]
