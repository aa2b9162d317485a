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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing it
    sys.path.insert(0, str(ROOT))

from kernels import prebuilt  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=prebuilt.FOLDER, help="folder to build into")
    args = parser.parse_args(argv)
    manifest = prebuilt.build_into(args.out)
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
