"""The native kernels as lazy MLX primitives (kernels/csrc/mlx_primitives/primitives.cpp).

Through ctypes (kernels/ctypes_library.py) a kernel evaluates its inputs and copies its output into
a new array: a 4-bit SmolLM2 decode step synchronised with MLX ~210 times for it. As MLX
primitives the same kernels are nodes of the graph and evaluate with the rest of it.

The module is compiled on first use against the installed mlx wheel (its headers and
libmlx) with nanobind in MLX's domain, so its functions take and return `mx.array`. It is
cached and guarded like the ctypes library (private folder, recorded sha256). When it
cannot be had (no compiler, no nanobind or Python headers, `BRISK_MLX_PRIMITIVES=0` or
`BRISK_NATIVE_KERNELS=0`), `load()` returns None, `unavailable_reason()` says why, and
callers keep the ctypes path.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import platform
import subprocess
import sys
import sysconfig
import threading
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from types import ModuleType

from brisk.kernels import ctypes_library, plan, prebuilt

SOURCE = ctypes_library.CSRC / "mlx_primitives" / "primitives.cpp"
TILED_PRIMITIVES = ctypes_library.CSRC / "mlx_primitives" / "tiled.cpp"
# attention.cpp (and its attention_tiles.cpp, attention_flash.cpp), norm_rope.cpp, sampling.cpp,
# pooled_attention.cpp, activation.cpp and float_gemm.cpp are built only here: they have no ctypes path (MLX's own ops
# are their fallback).
KERNELS = [
    TILED_PRIMITIVES,
    ctypes_library.CSRC / "quantized_matmul.cpp",
    ctypes_library.CSRC / "tiled_matmul.cpp",
    ctypes_library.CSRC / "amx_matmul.cpp",
    ctypes_library.CSRC / "skinny_matmul.cpp",
    ctypes_library.CSRC / "float_gemm.cpp",
    ctypes_library.CSRC / "attention.cpp",
    ctypes_library.CSRC / "attention_tiles.cpp",
    ctypes_library.CSRC / "attention_flash.cpp",
    ctypes_library.CSRC / "norm_rope.cpp",
    ctypes_library.CSRC / "packed_attention.cpp",
    ctypes_library.CSRC / "sampling.cpp",
    ctypes_library.CSRC / "pooled_attention.cpp",
    ctypes_library.CSRC / "activation.cpp",
]
# Included by the kernels: part of the build's key.
HEADERS = [
    ctypes_library.CSRC / "vector_exp.h",
    ctypes_library.CSRC / "half.h",
    ctypes_library.CSRC / "sgemm.h",
    ctypes_library.CSRC / "register_tile.h",
    ctypes_library.CSRC / "isa.h",
    ctypes_library.CSRC / "thread_pool.h",
    ctypes_library.CSRC / "mlx_primitives" / "primitive_base.h",
]
MODULE = "_brisk_mlx_ops"
VERSION = 14

_lock = threading.Lock()
_state: dict = {}


def _package_dir(name: str) -> Path:
    module = importlib.util.find_spec(name)
    if module is None or not module.submodule_search_locations:
        raise RuntimeError(f"{name} is not installed (pip install 'nanobind==3.1.0' to build the MLX primitives)")
    return Path(list(module.submodule_search_locations)[0])


def all_sources() -> list[Path]:
    return [SOURCE, *KERNELS, *HEADERS]


def suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def compile_command(cxx: str, output: Path, *, rpath: bool = True) -> list[str]:
    """`rpath`: find libmlx where it was built against. A prebuilt module has none and
    binds to the libmlx that `import mlx.core` already loaded (same soname)."""
    mlx_dir, nb_dir = _package_dir("mlx"), _package_dir("nanobind")
    python_include = Path(sysconfig.get_paths()["include"])
    if not (python_include / "Python.h").exists():
        raise RuntimeError(f"Python's headers are missing ({python_include}/Python.h; install python3-dev)")
    if not (mlx_dir / "include" / "mlx" / "primitives.h").exists():
        raise RuntimeError(f"the mlx package at {mlx_dir} ships no C++ headers")
    # Python's own symbols resolve at import (macOS's linker must be told so)
    platform_flags = ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []
    search = [f"-Wl,-rpath,{mlx_dir / 'lib'}"] if rpath else []
    return [
        cxx,
        *ctypes_library.compiler_flags("c++20"),
        "-fvisibility=hidden",
        "-fno-strict-aliasing",
        "-DNB_DOMAIN=mlx",
        "-DNDEBUG",
        f"-I{mlx_dir / 'include'}",
        f"-I{nb_dir / 'include'}",
        f"-I{nb_dir / 'ext' / 'robin_map' / 'include'}",
        f"-I{python_include}",
        str(SOURCE),
        *map(str, KERNELS),
        str(nb_dir / "src" / "nb_combined.cpp"),
        f"-L{mlx_dir / 'lib'}",
        "-lmlx",
        *search,
        *platform_flags,
        *ctypes_library.link_flags(),
        "-o",
        str(output),
    ]


def _versions() -> str:
    found = []
    for name in ("mlx", "nanobind"):
        try:
            found.append(f"{name}={package_version(name)}")
        except PackageNotFoundError:
            found.append(f"{name}=?")
    return " ".join(found)


def module_path(cxx: str) -> Path:
    key = hashlib.sha256(b"".join(p.read_bytes() for p in all_sources()))
    key.update(" ".join(compile_command(cxx, Path("out"))).encode())
    key.update(f"{_versions()} {sys.implementation.cache_tag}-{platform.machine()}".encode())
    return ctypes_library.cache_dir() / f"brisk_mlx_ops-{key.hexdigest()[:16]}{suffix()}"


def open_module(path: Path) -> ModuleType:
    import mlx.core  # noqa: F401  (the module's functions take mlx.core.array: MLX registers it first)

    spec = importlib.util.spec_from_file_location(
        MODULE, path, loader=importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    )
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{path}: not loadable as an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if module.version() != VERSION:
        raise RuntimeError(f"{path}: version() is not {VERSION}")
    return module


def _build() -> tuple[ModuleType, Path]:
    cxx = ctypes_library.find_compiler()
    target = module_path(cxx)
    ctypes_library.build_verified(target, compile_command(cxx, target), "the MLX primitives")
    return open_module(target), target


def _mlx_version() -> str:
    try:
        return package_version("mlx")
    except PackageNotFoundError:
        return "?"


def load() -> ModuleType | None:
    """The primitives module: the bundle's prebuilt one, else built on first use; None
    when it cannot be had."""
    module = status().value
    return module if isinstance(module, ModuleType) else None


def status() -> prebuilt.Loaded:
    """Which module is in use and where it came from (`brisk info` reports it)."""
    loaded = _state.get("loaded")  # once set it stays: read without the lock (every layer asks)
    if loaded is not None:
        return loaded
    if not plan.on_cpu_now():  # asked again later: a `with mx.stream(mx.cpu)` block may build them
        return prebuilt.Loaded(None, "off", note=plan.NOT_ON_CPU)
    with _lock:
        if "loaded" not in _state:
            off = plan.turned_off(primitives=True)
            if off is not None:
                _state["loaded"] = prebuilt.Loaded(None, "off", note=off)
            else:
                requires = {"platform": prebuilt.platform_tag(), "mlx": _mlx_version()}
                found = prebuilt.lookup("mlx_primitives", all_sources(), requires, ctypes_library.cpu_features())
                _state["loaded"] = prebuilt.load_first(
                    "mlx_primitives",
                    prebuilt=found,
                    open_file=open_module,
                    build=_build,
                    errors=(OSError, RuntimeError, ImportError, subprocess.SubprocessError),
                )
        return _state["loaded"]


def unavailable_reason() -> str | None:
    loaded = status()
    return None if loaded.value is not None else loaded.note
