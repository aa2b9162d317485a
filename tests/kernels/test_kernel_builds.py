"""The kernel sources build for x86-64 and for aarch64, and their portable paths agree with
plain scalar references (tests/kernels/native_check.cpp) on both.

Arm64 has no machine here: the sources are cross-compiled with Debian's
g++-aarch64-linux-gnu and the check program runs under qemu-aarch64 (qemu-user); .ci/run
installs both. None of the x86 paths (AVX2, VNNI, AMX, the tiled layout) exist in that
build, so it is the portable path a Linux arm64 user's CPU takes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from brisk.kernels import ctypes_library, mlx_extension

CHECK = Path(__file__).with_name("native_check.cpp")
# The MLX primitives (primitives.cpp, tiled.cpp) are left out of the linked program: they
# need libmlx, which has no aarch64 build here. They are compiled for aarch64 on their own.
PLAIN_KERNELS = [path for path in mlx_extension.KERNELS if path.parent == ctypes_library.CSRC]
FLAGS = ["-O1", "-std=c++17", "-pthread", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros"]


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (Debian: g++-aarch64-linux-gnu and qemu-user; .ci/run installs them)")
    return found


def test_every_kernel_source_is_a_plain_kernel_or_a_primitive():
    primitives = {mlx_extension.TILED_PRIMITIVES}
    assert set(mlx_extension.KERNELS) == set(PLAIN_KERNELS) | primitives


def _build(cxx: str, flags: list[str], out: Path) -> Path:
    build = subprocess.run(
        [cxx, *FLAGS, *flags, *map(str, PLAIN_KERNELS), str(CHECK), "-ldl", "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return out


def _run(runner: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(runner, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 failed" in done.stdout and done.stdout.count("ok  ") >= 80
    return done.stdout


@pytest.fixture(scope="module")
def host_check(tmp_path_factory) -> Path:
    """The check program built as a local build targets this host (kernels/plan.py)."""
    host_features = [f"-m{feature}" for feature in ctypes_library.cpu_features()]
    return _build(ctypes_library.find_compiler(), host_features, tmp_path_factory.mktemp("host") / "check")


# What each ceiling leaves of the run-time paths (kernels/csrc/isa.h), if this CPU has them.
CEILINGS = {
    "avx2": {"tiled": False, "amx": False, "float_gemm": False},
    "avx512": {"tiled": False, "amx": False, "float_gemm": True},
    "vnni": {"tiled": True, "amx": False, "float_gemm": True},
    "amx": {"tiled": True, "amx": True, "float_gemm": True},
}


@pytest.mark.parametrize("ceiling", [None, *CEILINGS])
def test_the_kernels_agree_with_scalar_references_under_each_isa_ceiling_this_host_has(host_check, ceiling):
    """CI covers every ceiling the host supports; the report names those it skipped."""
    from brisk.kernels.plan import LEVELS, read_cpu

    cpu = read_cpu()
    if ceiling is not None and LEVELS.index(cpu.level) < LEVELS.index(ceiling):
        pytest.skip(f"this CPU ({cpu.name}) is class {cpu.level}: the {ceiling} paths cannot run here")
    env = {k: v for k, v in os.environ.items() if k not in ("BRISK_ISA", "BRISK_KERNELS")}
    if ceiling is not None:
        env["BRISK_ISA"] = ceiling
    out = _run([str(host_check)], env)
    if ceiling is None:
        return
    first = out.splitlines()[0]
    has = {level: LEVELS.index(cpu.level) >= LEVELS.index(level) for level in LEVELS}
    allowed = CEILINGS[ceiling]
    assert f"tiled available: {int(allowed['tiled'] and has['vnni'])}," in first
    assert f"amx available: {int(allowed['amx'] and has['amx'])}," in first
    assert f"float_gemm available: {int(allowed['float_gemm'] and has['avx512'])}" in first


def test_the_portable_build_agrees_with_scalar_references_on_this_host(tmp_path):
    """No SIMD flags and BRISK_KERNELS=portable: the path an arm64 CPU (or BRISK_KERNELS=portable) takes."""
    out = _run(
        [str(_build(ctypes_library.find_compiler(), [], tmp_path / "check"))],
        {**os.environ, "BRISK_KERNELS": "portable"},
    )
    assert "tiled available: 0, amx available: 0, float_gemm available: 0" in out


def test_the_kernels_build_for_aarch64_and_agree_with_the_references_under_qemu(tmp_path):
    cxx, qemu = _tool("aarch64-linux-gnu-g++"), _tool("qemu-aarch64")
    sysroot = Path("/usr/aarch64-linux-gnu")
    out = _run([qemu, "-L", str(sysroot), str(_build(cxx, [], tmp_path / "check-aarch64"))])
    # No x86 path exists there: the tiled layout, AMX and the AVX-512 float GEMM all decline.
    assert "tiled available: 0, amx available: 0, float_gemm available: 0" in out


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
        str(ctypes_library.CSRC / "mlx_primitives" / source),
        "-o",
        str(tmp_path / "out.o"),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
