"""The kernel sources build for x86-64 and for aarch64, and their portable paths agree with
plain scalar references (tests/kernels/native_check.cpp) on both.

Arm64 has no machine here: the sources are cross-compiled with Debian's
g++-aarch64-linux-gnu and the check program runs under qemu-aarch64 (qemu-user); .ci/run
installs both. None of the x86 paths (AVX2, VNNI, AMX, the tiled layout) exist in that
build, so it is the portable path a Linux arm64 user's CPU takes.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from kernels import mlx_extension, native

CHECK = Path(__file__).with_name("native_check.cpp")
# The MLX primitives (primitives.cpp, tiled.cpp) are left out of the linked program: they
# need libmlx, which has no aarch64 build here. They are compiled for aarch64 on their own.
PLAIN_KERNELS = [path for path in mlx_extension.KERNELS if path.parent == native.CSRC]
FLAGS = ["-O2", "-std=c++17", "-pthread", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros"]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (Debian: g++-aarch64-linux-gnu and qemu-user; .ci/run installs them)")
    return found


def _build_and_run(cxx: str, flags: list[str], out: Path, runner: list[str]) -> str:
    build = subprocess.run(
        [cxx, *FLAGS, *flags, *map(str, PLAIN_KERNELS), str(CHECK), "-ldl", "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    done = subprocess.run([*runner, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 failed" in done.stdout
    return done.stdout


def test_every_kernel_source_is_a_plain_kernel_or_a_primitive():
    primitives = {mlx_extension.TILED_PRIMITIVES}
    assert set(mlx_extension.KERNELS) == set(PLAIN_KERNELS) | primitives


def test_the_kernels_agree_with_scalar_references_on_this_host(tmp_path):
    cxx = native.find_compiler()
    host_features = [f"-m{feature}" for feature in native.cpu_features()]  # as a local build targets
    out = _build_and_run(cxx, host_features, tmp_path / "check", [])
    assert out.count("ok  ") >= 80


def test_the_kernels_build_for_aarch64_and_agree_with_the_references_under_qemu(tmp_path):
    cxx, qemu = _tool("aarch64-linux-gnu-g++"), _tool("qemu-aarch64")
    sysroot = Path("/usr/aarch64-linux-gnu")
    out = _build_and_run(cxx, [], tmp_path / "check-aarch64", [qemu, "-L", str(sysroot)])
    # No x86 path exists there: the tiled layout, AMX and the AVX-512 float GEMM all decline.
    assert "tiled available: 0, amx available: 0, float_gemm available: 0" in out
    assert out.count("ok  ") >= 80


@pytest.mark.parametrize("source", ["primitives.cpp", "tiled.cpp"])
def test_the_mlx_primitives_compile_for_aarch64(tmp_path, source):
    cxx = _tool("aarch64-linux-gnu-g++")
    mlx_dir, nb_dir = mlx_extension._package_dir("mlx"), mlx_extension._package_dir("nanobind")
    command = [
        cxx,
        "-O1",
        "-std=c++20",
        "-fPIC",
        "-c",
        "-DNB_DOMAIN=mlx",
        "-DNDEBUG",
        f"-I{mlx_dir / 'include'}",
        f"-I{nb_dir / 'include'}",
        f"-I{nb_dir / 'ext' / 'robin_map' / 'include'}",
        f"-I{sysconfig.get_paths()['include']}",
        str(native.CSRC / "mlx_primitives" / source),
        "-o",
        str(tmp_path / "out.o"),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
