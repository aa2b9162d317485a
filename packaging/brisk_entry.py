"""The frozen bundle's one executable: the desktop app by default, and the `brisk`
command line when started under that name (the bundle ships `brisk` as a link to it,
as busybox does), so the two share one copy of Python, MLX, Qt and MKL."""

import sys
from pathlib import Path


def main() -> None:
    if Path(sys.argv[0]).name == "brisk":
        from brisk.engine.host.cli import console_main

        console_main()
    else:
        from brisk.app.main import main as app_main

        sys.exit(app_main())


if __name__ == "__main__":
    main()
