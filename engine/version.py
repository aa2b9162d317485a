"""Brisk's version (the one place it is written: pyproject.toml reads it from here) and
the versions of what it runs on, for `brisk --version`, the About box and bug reports.

Module attributes, not package metadata: a frozen bundle carries the modules but not
always their dist-info."""

from __future__ import annotations

__version__ = "0.2.0"


def runtime_versions() -> dict[str, str]:
    """MLX, mlx-lm and the BLAS MLX's matmuls land in (Qt is the app's to add)."""
    import mlx.core as mx
    import mlx_lm

    from brisk.engine.runtime.blas import blas_state

    state = blas_state()
    blas = state.name if state.name == "reference" else f"{state.name} ({state.sgemm_provider})"
    return {"brisk": __version__, "mlx": getattr(mx, "__version__", "?"), "mlx-lm": mlx_lm.__version__, "blas": blas}


def version_line(extra: dict[str, str] | None = None) -> str:
    found = {**runtime_versions(), **(extra or {})}
    rest = " · ".join(f"{name} {value}" for name, value in found.items() if name not in ("brisk", "blas"))
    return f"Brisk {found['brisk']} · {rest} · BLAS: {found['blas']}"
