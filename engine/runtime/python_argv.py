"""argv for starting Brisk's own Python modules without trusting the current folder.

`python -m pkg.mod` puts the current folder first on `sys.path`, so running `brisk` in a
folder that holds a package named `engine`, `kernels`, `app` or `mlx` (a cloned
repository, a download folder) would import that folder's code instead of Brisk's.
"""

from __future__ import annotations

import sys

# Python 3.10 has no -P: run the module from -c after dropping the '' entry -c puts first.
_RUN_WITHOUT_CWD = "import runpy, sys; del sys.path[0]; runpy.run_module({!r}, run_name='__main__', alter_sys=True)"


def module_argv(module: str, *args: str) -> list[str]:
    """The argv that runs `module` as `__main__` with the current folder kept off `sys.path`."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _RUN_WITHOUT_CWD.format(module), *args]
