"""Build and load the native CPU kernels in kernels/csrc/ on first use.

All sources there go into one shared library, compiled once per set of sources, compiler
flags and Python version into Brisk's cache folder (`BRISK_KERNEL_CACHE` overrides it)
with the system C++ compiler (`CXX`, else `c++`), and loaded through ctypes: no MLX
headers, nanobind or build step at install time. A bundle ships the library prebuilt (kernels/prebuilt.py), used
first when it fits. When no compiler is found or the build fails, `load()` returns None
and `unavailable_reason()` says why; callers keep MLX's portable paths. Nothing is built or
loaded where the kernel plan (kernels/plan.py) puts no work on the CPU.

Loading a shared library runs its constructors, so the cache is guarded: the folder is
created private (0700), a folder or file others can write is refused, and the sha256 of
each library Brisk builds is recorded beside it and checked before every load. A file
that does not match (replaced, truncated, garbage) is rebuilt, and the log says so once.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from brisk.kernels import compile_notice, plan, prebuilt

CSRC = Path(__file__).with_name("csrc")
# Each source's version function and the version this Python side speaks.
SOURCES = {
    CSRC / "packed_attention.cpp": ("brisk_packed_attention_version", 4),
    CSRC / "skinny_matmul.cpp": ("brisk_skinny_matmul_version", 1),
    CSRC / "quantized_matmul.cpp": ("brisk_quantized_matmul_version", 7),
    CSRC / "amx_matmul.cpp": ("brisk_amx_matmul_version", 1),
}
# Included by the sources: part of the build's key.
HEADERS = [CSRC / "half.h", CSRC / "sgemm.h", CSRC / "isa.h", CSRC / "thread_pool.h"]


def all_sources() -> list[Path]:
    return [*SOURCES, *HEADERS]


log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict = {}


def cpu_features() -> list[str]:
    """The SIMD features a local build targets (kernels/plan.py: the CPU's, under BRISK_ISA
    and BRISK_KERNELS=portable); a prebuilt library records those it was built with."""
    return list(plan.current().build_features)


def _cpu_flags() -> list[str]:
    return [f"-m{feature}" for feature in cpu_features()]


def compiler_flags(standard: str = "c++17") -> list[str]:
    # Associative math lets the compiler vectorize the dot-product sums; infinities stay
    # (they mark masked keys), so no -ffast-math.
    return [
        "-O3",
        f"-std={standard}",
        "-shared",
        "-fPIC",
        "-pthread",
        "-fno-math-errno",
        "-fassociative-math",
        "-fno-signed-zeros",
        "-fno-trapping-math",
        *_cpu_flags(),
    ]


def link_flags() -> list[str]:
    return ["-ldl"] if sys.platform.startswith("linux") else []


def compile_command(cxx: str, output: Path, *extra: str) -> list[str]:
    return [cxx, *compiler_flags(), *extra, *map(str, SOURCES), *link_flags(), "-o", str(output)]


def find_compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        raise RuntimeError("no C++ compiler found (set CXX or install one)")
    if not shutil.which(cxx):
        raise RuntimeError(f"the C++ compiler CXX={cxx} is not an executable program")
    return cxx


def cache_dir() -> Path:
    if os.environ.get("BRISK_KERNEL_CACHE"):
        return Path(os.environ["BRISK_KERNEL_CACHE"])
    if os.environ.get("BRISK_HOME"):
        return Path(os.environ["BRISK_HOME"]).expanduser() / "cache" / "kernels"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("brisk")) / "kernels"


class UnsafeCache(RuntimeError):
    """The cache folder or library could be written by someone else: never load from it."""


def check_private(path: Path) -> None:
    """UnsafeCache unless `path` is owned by this user and writable by nobody else."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeCache(f"{path} is a symbolic link; the kernel cache must be a real folder and files")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise UnsafeCache(f"{path} belongs to another user; Brisk loads kernels only from its own files")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCache(
            f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}); "
            "Brisk will not load kernels from it. Run `chmod go-w` on it or remove it."
        )


def private_cache_dir() -> Path:
    folder = cache_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private(folder)
    return folder


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def verified(library: Path) -> bool:
    """True when `library` is the very file Brisk built (its recorded sha256 matches)."""
    record = digest_path(library)
    if not (library.exists() and record.exists()):
        return False
    check_private(library)
    check_private(record)
    return record.read_text().strip() == file_sha256(library)


def library_path(cxx: str) -> Path:
    key = hashlib.sha256(b"".join(source.read_bytes() for source in all_sources()))
    key.update(" ".join(compile_command(cxx, Path("out"))).encode())
    key.update(f"{sys.implementation.cache_tag}-{platform.machine()}".encode())
    return cache_dir() / f"brisk_kernels-{key.hexdigest()[:16]}{'.dylib' if sys.platform == 'darwin' else '.so'}"


def build_verified(target: Path, command: list[str], what: str) -> None:
    """Compile `command` (its output path last) into `target` unless the file there is the
    very one Brisk built: staged in the private cache, hash recorded, moved in atomically."""
    private_cache_dir()
    if verified(target):
        return
    if target.exists() or digest_path(target).exists():
        log.warning("native kernel library %s does not match the one Brisk built; rebuilding it", target)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp) / target.name
        with compile_notice.compiling(what):  # the one slow first step: whoever shows progress says so
            done = subprocess.run([*command[:-1], str(staged)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"compiling {what} failed: {done.stderr.strip()[-2000:]}")
        os.chmod(staged, 0o700)
        record = Path(tmp) / digest_path(target).name
        record.write_text(file_sha256(staged))
        os.chmod(record, 0o600)
        # atomic: a concurrent build never sees half a file; the record goes last
        os.replace(staged, target)
        os.replace(record, digest_path(target))
    if not verified(target):
        raise RuntimeError(f"{target} changed while it was being installed; not loading it")


def _build() -> tuple[ctypes.CDLL, Path]:
    cxx = find_compiler()
    target = library_path(cxx)
    build_verified(target, compile_command(cxx, target), "the native kernels")
    return open_library(target), target


def open_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, version in SOURCES.values():
        if getattr(lib, name)() != version:
            raise RuntimeError(f"{path}: {name}() is not {version}")
    _declare(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    p: type = ctypes.c_void_p
    i: type = ctypes.c_int
    f: type = ctypes.c_float
    lib.brisk_kv_attention.restype = ctypes.c_int
    lib.brisk_kv_attention.argtypes = [p, p] + [i] * 7 + [f, i, p, p]
    lib.brisk_skinny_matmul.restype = ctypes.c_int
    lib.brisk_skinny_matmul.argtypes = [p] * 4 + [i] * 4
    lib.brisk_quantized_matmul_rows.restype = ctypes.c_int
    lib.brisk_quantized_matmul_rows.argtypes = [p] * 4 + [i, p, p] + [i] * 7
    lib.brisk_quantized_matmul_has_integer_x.restype = ctypes.c_int
    lib.brisk_quantized_matmul_has_integer_x.argtypes = []
    lib.brisk_quantized_matmul_has_vnni.restype = ctypes.c_int
    lib.brisk_quantized_matmul_has_vnni.argtypes = []
    lib.brisk_quantized_matmul_dense.restype = ctypes.c_int
    lib.brisk_quantized_matmul_dense.argtypes = [p] * 4 + [i, p, p] + [i] * 7
    lib.brisk_amx_available.restype = ctypes.c_int
    lib.brisk_amx_available.argtypes = []
    lib.brisk_quantized_gather.restype = ctypes.c_int
    lib.brisk_quantized_gather.argtypes = [p, i, p, p, p, i, p] + [i] * 4


def load() -> ctypes.CDLL | None:
    """The native library: the bundle's prebuilt one, else built on first use; None when
    it cannot be had."""
    library = status().value
    return library if isinstance(library, ctypes.CDLL) else None


def status() -> prebuilt.Loaded:
    """Which library is in use and where it came from (`brisk info` reports it)."""
    if not plan.on_cpu_now():  # asked again later: a `with mx.stream(mx.cpu)` block may build them
        return prebuilt.Loaded(None, "off", note=plan.NOT_ON_CPU)
    with _lock:
        if "loaded" not in _state:
            off = plan.turned_off()
            if off is not None:
                _state["loaded"] = prebuilt.Loaded(None, "off", note=off)
            else:
                found = prebuilt.lookup("ctypes", all_sources(), {"platform": prebuilt.platform_tag()}, cpu_features())
                _state["loaded"] = prebuilt.load_first(
                    "ctypes",
                    prebuilt=found,
                    open_file=open_library,
                    build=_build,
                    errors=(OSError, RuntimeError, subprocess.SubprocessError, AttributeError),
                )
        return _state["loaded"]


def unavailable_reason() -> str | None:
    loaded = status()
    return None if loaded.value is not None else loaded.note
