"""Make MLX's CPU matmuls use an optimized BLAS on Linux.

MLX's Linux CPU wheel calls `cblas_sgemm` from a reference BLAS (about 4 GFLOP/s on
our machines). A library loaded with RTLD_GLOBAL *before* `mlx.core` is imported
wins the symbol lookup, so MLX's calls land in it instead (MKL: 124-155 GFLOP/s).
MKL's `libmkl_rt` exports the unprefixed `cblas_*` names; the `scipy-openblas`
wheels do not (their symbols are prefixed), so MKL from PyPI is what we depend on.

This module must not import mlx: `engine/__init__.py` calls `preload_optimized_blas()`
first thing. Set `BRISK_BLAS=reference` to keep MLX's own BLAS (used by `brisk bench blas`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Names the MKL wheel installs into <prefix>/lib (a normal or --prefix install keeps them).
MKL_LIBRARY_NAMES = ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so")


@dataclass(frozen=True)
class BlasState:
    requested: str  # "auto" or "reference"
    loaded_path: str | None  # the optimized library we loaded, if any
    sgemm_provider: str | None  # the shared object that `cblas_sgemm` resolves to
    note: str

    @property
    def name(self) -> str:
        provider = (self.sgemm_provider or "").lower()
        if "mkl" in provider:
            return "mkl"
        if "openblas" in provider:
            return "openblas"
        return "reference"


_state: BlasState | None = None


def _candidate_dirs() -> list[Path]:
    dirs = [Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"]
    extra = os.environ.get("BRISK_BLAS_DIR")
    if extra:
        dirs.insert(0, Path(extra))
    return dirs


def find_mkl() -> Path | None:
    for directory in _candidate_dirs():
        for name in MKL_LIBRARY_NAMES:
            path = directory / name
            if path.exists():
                return path
    found = ctypes.util.find_library("mkl_rt")
    return Path(found) if found else None


def _symbol_provider(symbol: str) -> str | None:
    """The file of the shared object that the process-wide lookup of `symbol` resolves to."""

    class DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    try:
        libdl = ctypes.CDLL(None)
        address = ctypes.cast(getattr(libdl, symbol), ctypes.c_void_p).value
        info = DlInfo()
        if libdl.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) and info.dli_fname:
            return info.dli_fname.decode()
    except (AttributeError, OSError):
        return None
    return None


def preload_optimized_blas() -> BlasState:
    """Load MKL globally before mlx is imported (Linux only; idempotent)."""
    global _state
    if _state is not None:
        return _state
    requested = os.environ.get("BRISK_BLAS", "auto").lower()
    if not sys.platform.startswith("linux"):
        _state = BlasState(requested, None, None, "not Linux: MLX uses Accelerate/Metal")
        return _state
    if "mlx.core" in sys.modules:
        log.warning("mlx was imported before engine: the optimized BLAS may not take over")
    loaded = None
    note = ""
    if requested == "reference":
        note = "BRISK_BLAS=reference: MLX's bundled BLAS kept on purpose"
    else:
        path = find_mkl()
        if path is None:
            note = "MKL not found (pip install mkl); MLX falls back to its reference BLAS"
        else:
            try:
                # MKL's OpenMP threads spin 200 ms after each sgemm by default, taking the
                # cores that the dequantizing pool and MLX's other ops run on between
                # sgemms: 0 makes them sleep at once (prefill ~10% faster on two cores).
                os.environ.setdefault("KMP_BLOCKTIME", "0")
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                loaded = str(path)
                note = "MKL loaded before mlx (RTLD_GLOBAL)"
            except OSError as exc:
                note = f"MKL at {path} failed to load: {exc}"
    if loaded is None and requested != "reference":
        log.warning(note)
    _state = BlasState(requested, loaded, _symbol_provider("cblas_sgemm"), note)
    return _state


def blas_state() -> BlasState:
    return preload_optimized_blas()
