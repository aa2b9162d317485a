"""What the PyInstaller specs of both platforms share: Brisk's data files, the modules
the analysis cannot see, the metadata transformers checks, and what stays out.
(packaging/linux/brisk.spec and packaging/macos/Brisk.spec import it.)"""

from __future__ import annotations

from pathlib import Path

# transformers checks its dependencies' versions through their metadata at import.
METADATA = (
    "brisk",
    "mlx",
    "mlx-lm",
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "safetensors",
    "numpy",
    "tqdm",
    "regex",
    "requests",
    "packaging",
    "filelock",
    "pyyaml",
    "jinja2",
    "gguf",
    "pypdf",
)
EXCLUDES = [
    "tkinter",
    "torch",
    "tensorflow",
    "jax",
    "flax",
    "IPython",
    "matplotlib",
    "pytest",
    "pandas",
    "scipy",
    "sklearn",
    "PySide6.QtNetwork",
    "PySide6.QtQml",
    "PySide6.QtQuick",
    "PySide6.QtPdf",
    "PySide6.QtOpenGL",
]


def analysis_options(root: Path, prebuilt: Path) -> dict:
    """Keyword arguments for PyInstaller's Analysis (binaries are the platform's own)."""
    from PyInstaller.utils.hooks import collect_data_files, collect_submodules, copy_metadata

    datas = collect_data_files("brisk.resources")
    datas += collect_data_files("mlx", includes=["lib/*.metallib"])  # macOS: MLX's Metal kernels
    sources = ["csrc/*.cpp", "csrc/*.h", "csrc/mlx_primitives/*.cpp", "csrc/mlx_primitives/*.h"]
    datas += collect_data_files("brisk.kernels", includes=sources)
    datas += [(str(prebuilt), "brisk/kernels/prebuilt")]
    for dist in METADATA:
        datas += copy_metadata(dist)
    return {
        "scripts": [str(root / "packaging" / "brisk_entry.py")],
        "datas": datas,
        # mlx-lm imports a model's module by its architecture name at load time; mlx.core's C
        # extension imports mlx's own helpers (mlx._reprlib_fix) where the analysis cannot see.
        "hiddenimports": collect_submodules("mlx_lm.models")
        + collect_submodules("mlx")
        + ["brisk.engine.host.cli", "brisk.app.main"],
        "excludes": EXCLUDES,
        # engine/runtime/mlx_hooks.py reads mlx's and mlx-lm's source to check the hooks it relies on.
        "module_collection_mode": {"mlx_lm": "pyz+py", "mlx": "pyz+py"},
    }
