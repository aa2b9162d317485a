"""The native kernels run two ways: as lazy MLX primitives (kernels/mlx_extension.py) and as
eager ctypes calls (kernels/native.py), the fallback where the primitives cannot be built.
Tests that use `kernel_path` run once on each."""

import pytest

from kernels import mlx_extension
from kernels.prebuilt import Loaded


@pytest.fixture(params=["mlx-primitive", "ctypes"])
def kernel_path(request, monkeypatch):
    if request.param == "ctypes":
        off = Loaded(None, "off", note="the ctypes path under test")
        monkeypatch.setattr(mlx_extension, "_state", {"loaded": off})
    elif mlx_extension.load() is None:
        pytest.skip(f"the MLX primitives cannot be built here: {mlx_extension.unavailable_reason()}")
    return request.param
