"""Build Brisk's native kernels ahead of time, for a bundle.

    python packaging/build_kernels.py [--out kernels/prebuilt]

Run it in the environment the bundle is frozen from (its mlx, nanobind and Python
headers): the primitives module binds to that exact mlx. The folder gets both libraries
and a manifest (sha256, source digest, CPU features, platform, mlx version) that
kernels/prebuilt.py checks before loading anything from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from brisk.kernels import ctypes_library, mlx_extension, prebuilt  # noqa: E402


def build_into(target: Path) -> dict:
    """Compile both native libraries into `target` and write its manifest (needs the compiler,
    Python headers, nanobind and mlx that the bundle ships with). Here, not in kernels/prebuilt.py:
    the loaders import prebuilt, and prebuilt importing them back made an import cycle."""
    target.mkdir(parents=True, exist_ok=True)
    cxx = ctypes_library.find_compiler()
    suffix = ".dylib" if sys.platform == "darwin" else ".so"
    builds = {
        "ctypes": (
            f"brisk_kernels{suffix}",
            ctypes_library.compile_command,
            ctypes_library.all_sources(),
            {"platform": prebuilt.platform_tag()},
        ),
        "mlx_primitives": (
            f"brisk_mlx_ops{mlx_extension.suffix()}",
            lambda c, out: mlx_extension.compile_command(c, out, rpath=False),
            mlx_extension.all_sources(),
            {"platform": prebuilt.platform_tag(), "mlx": version("mlx")},
        ),
    }
    libraries = {}
    for kind, (name, command, sources, requires) in builds.items():
        out = target / name
        done = subprocess.run(command(cxx, out), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {kind} failed: {done.stderr.strip()[-2000:]}")
        os.chmod(out, 0o755)
        libraries[kind] = {
            "file": name,
            "sha256": prebuilt.file_sha256(out),
            "sources": prebuilt.sources_digest(sources),
            "requires": requires,
            "cpu": ctypes_library.cpu_features(),
        }
    manifest = {"libraries": libraries, "compiler": cxx}
    (target / prebuilt.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=prebuilt.FOLDER, help="folder to build into")
    args = parser.parse_args(argv)
    manifest = build_into(args.out)
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
