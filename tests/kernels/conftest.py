"""The native kernels run two ways: as lazy MLX primitives (kernels/mlx_extension.py) and as
eager ctypes calls (kernels/ctypes_library.py), the fallback where the primitives cannot be built.
Tests that use `kernel_path` run once on each."""

import pytest

from brisk.kernels import mlx_extension
from brisk.kernels.prebuilt import Loaded


@pytest.fixture(params=["mlx-primitive", "ctypes"])
def kernel_path(request, monkeypatch):
    if request.param == "ctypes":
        off = Loaded(None, "off", note="the ctypes path under test")
        monkeypatch.setattr(mlx_extension, "_state", {"loaded": off})
    elif mlx_extension.load() is None:
        pytest.skip(f"the MLX primitives cannot be built here: {mlx_extension.unavailable_reason()}")
    return request.param


@pytest.fixture(scope="session")
def copying_compiler(tmp_path_factory):
    """A "compiler" that copies the libraries this run already built (the shared kernel cache)
    to its `-o` path: tests of the cache's rules (build once, hash, rebuild what does not match)
    run those rules without compiling again (a build of the primitives takes minutes on 2 cores).
    That the real compile works is what loading the shared cache proves."""
    from brisk.kernels import ctypes_library

    built = {"ctypes": ctypes_library.status(), "primitives": mlx_extension.status()}
    for kind, loaded in built.items():
        if loaded.value is None or not loaded.path:
            pytest.skip(f"the {kind} library is not built here: {loaded.note}")
    script = tmp_path_factory.mktemp("copying-compiler") / "c++"
    script.write_text(
        "#!/bin/sh\n"
        'out=""; prev=""\n'
        'for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done\n'
        f'from="{built["ctypes"].path}"\n'
        f'case " $* " in *nb_combined.cpp*) from="{built["primitives"].path}" ;; esac\n'
        'exec cp "$from" "$out"\n'
    )
    script.chmod(0o755)
    return str(script)
