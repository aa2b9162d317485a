"""Build and load the native CPU kernels in kernels/csrc/ on first use.

All sources there go into one shared library, compiled once per set of sources, compiler
flags and Python version into Brisk's cache folder (`BRISK_KERNEL_CACHE` overrides it)
with the system C++ compiler (`CXX`, else `c++`), and loaded through ctypes: no MLX
headers, nanobind or build step at install time. When no compiler is found or the build fails, `load()` returns None and
`unavailable_reason()` says why; callers keep MLX's portable paths. `BRISK_NATIVE_KERNELS=0`
turns the native path off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
# Each source's version function and the version this Python side speaks.
SOURCES = {
    CSRC / "packed_attention.cpp": ("brisk_packed_attention_version", 2),
    CSRC / "skinny_matmul.cpp": ("brisk_skinny_matmul_version", 1),
}

_lock = threading.Lock()
_state: dict = {}


def _cpu_flags() -> list[str]:
    """SIMD flags this CPU has (the library is built for the machine that runs it)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []  # arm64: NEON is the baseline
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    have = set(info.split())
    return [f"-m{f}" for f in ("avx2", "fma", "f16c") if f in have]


def compile_command(cxx: str, output: Path, *extra: str) -> list[str]:
    # Associative math lets the compiler vectorize the dot-product sums; infinities stay
    # (they mark masked keys), so no -ffast-math.
    return [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fno-math-errno", "-fassociative-math",
            "-fno-signed-zeros", "-fno-trapping-math", *_cpu_flags(), *extra, *map(str, SOURCES), "-o", str(output)]


def cache_dir() -> Path:
    if os.environ.get("BRISK_KERNEL_CACHE"):
        return Path(os.environ["BRISK_KERNEL_CACHE"])
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("brisk")) / "kernels"


def library_path(cxx: str) -> Path:
    key = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES))
    key.update(" ".join(compile_command(cxx, Path("out"))).encode())
    key.update(f"{sys.implementation.cache_tag}-{platform.machine()}".encode())
    return cache_dir() / f"brisk_kernels-{key.hexdigest()[:16]}{'.dylib' if sys.platform == 'darwin' else '.so'}"


def _build() -> ctypes.CDLL:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found (set CXX or install one)")
    target = library_path(cxx)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            staged = Path(tmp) / target.name
            done = subprocess.run(compile_command(cxx, staged), capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"compiling the kernels in {CSRC} failed: {done.stderr.strip()[-2000:]}")
            os.replace(staged, target)  # atomic: a concurrent build never sees half a file
    return open_library(target)


def open_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, version in SOURCES.values():
        if getattr(lib, name)() != version:
            raise RuntimeError(f"{path}: {name}() is not {version}")
    _declare(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.brisk_packed_attention.restype = ctypes.c_int
    lib.brisk_packed_attention.argtypes = [p, p] + [i] * 10 + [f, i] + [p] * 12
    lib.brisk_skinny_matmul.restype = ctypes.c_int
    lib.brisk_skinny_matmul.argtypes = [p] * 4 + [i] * 4


def load() -> ctypes.CDLL | None:
    """The native library, building it on first use; None when it cannot be had."""
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["reason"] = None, None
            if os.environ.get("BRISK_NATIVE_KERNELS", "1") == "0":
                _state["reason"] = "turned off by BRISK_NATIVE_KERNELS=0"
            else:
                try:
                    _state["lib"] = _build()
                except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                    _state["reason"] = str(error)
        return _state["lib"]


def unavailable_reason() -> str | None:
    load()
    return _state["reason"]
