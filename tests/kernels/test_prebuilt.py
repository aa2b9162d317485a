"""Kernels built ahead of time (a bundle's) load on a machine with no compiler, and only
when they are the very files recorded, for these sources, this CPU and this mlx."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brisk.kernels import ctypes_library, prebuilt
from tests.kernels.test_ctypes_library import CXX, build_hostile


def _build_kernels_script():
    """packaging/build_kernels.py, loaded by its path (`packaging` is also PyPI's package name)."""
    path = Path(__file__).resolve().parents[2] / "packaging" / "build_kernels.py"
    spec = importlib.util.spec_from_file_location("brisk_build_kernels", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pytestmark = pytest.mark.skipif(CXX is None, reason="building the prebuilt kernels needs a C++ compiler")


@pytest.fixture(scope="module")
def shipped_once(tmp_path_factory, copying_compiler):
    """A prebuilt folder as packaging/build_kernels.py writes it, its libraries copied from this
    run's builds (the packaging stage compiles them for real, and its bundle test loads them)."""
    folder = tmp_path_factory.mktemp("bundle") / "prebuilt"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CXX", copying_compiler)
        _build_kernels_script().build_into(folder)
    return folder


@pytest.fixture
def shipped(shipped_once, tmp_path, monkeypatch):
    """A private copy of the prebuilt folder, looked up instead of the package's."""
    folder = tmp_path / "prebuilt"
    shutil.copytree(shipped_once, folder)
    monkeypatch.setenv("BRISK_PREBUILT_KERNELS", str(folder))
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler-here"))
    monkeypatch.setattr(ctypes_library, "_state", {})
    return folder


def edit_manifest(folder, kind, **changes):
    path = folder / prebuilt.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["libraries"][kind].update(changes)
    path.write_text(json.dumps(manifest))


CHECK = """
import json, engine
import mlx.core as mx
from brisk.engine.runtime.info import kernel_origins
from brisk.kernels.skinny_matmul import skinny_matmul_native
origins = kernel_origins()
x, w = mx.random.normal((2, 64)), mx.random.normal((96, 64))
origins["equal"] = bool(mx.allclose(skinny_matmul_native(x, w), x @ w.T, atol=1e-4).item())
print(json.dumps(origins))
"""


def test_without_a_compiler_both_prebuilt_libraries_load_and_compute(shipped, tmp_path):
    env = dict(os.environ)  # the fixture's BRISK_PREBUILT_KERNELS, CXX (none) and empty cache
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["kernels_ctypes"].startswith(f"prebuilt ({shipped}")
    assert found["kernels_mlx_ops"].startswith(f"prebuilt ({shipped}")
    assert found["equal"]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing compiled


def test_a_replaced_prebuilt_library_never_runs(shipped, tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_TEST_MARK", str(tmp_path / "mark"))
    library = shipped / "brisk_kernels.so"
    library.unlink()
    build_hostile(tmp_path, library)
    loaded = ctypes_library.status()
    assert loaded.value is None and loaded.origin == "fallback"
    assert "does not match its recorded sha256" in loaded.note and "no-compiler-here" in loaded.note
    assert not (tmp_path / "mark").exists()


def test_a_prebuilt_folder_others_can_write_is_refused(shipped):
    shipped.chmod(0o777)
    loaded = ctypes_library.status()
    assert loaded.value is None and "writable by others" in loaded.note


@pytest.mark.parametrize(
    "change, said",
    [
        ({"sources": "0" * 64}, "built from other kernel sources"),
        ({"cpu": ["avx2", "imaginary_simd"]}, "CPU features this machine lacks: imaginary_simd"),
        ({"requires": {"platform": "linux-riscv64-cpython-399"}}, "built for platform linux-riscv64-cpython-399"),
    ],
)
def test_a_prebuilt_library_for_other_sources_cpus_or_platforms_is_not_used(shipped, change, said):
    edit_manifest(shipped, "ctypes", **change)
    loaded = ctypes_library.status()
    assert loaded.value is None and said in loaded.note


def test_prebuilt_primitives_for_another_mlx_are_not_used(shipped):
    from brisk.kernels import mlx_extension

    edit_manifest(shipped, "mlx_primitives", requires={"platform": prebuilt.platform_tag(), "mlx": "0.0.1"})
    path, why = prebuilt.lookup(
        "mlx_primitives",
        mlx_extension.all_sources(),
        {"platform": prebuilt.platform_tag(), "mlx": mlx_extension._mlx_version()},
        ctypes_library.cpu_features(),
    )
    assert path is None and "built for mlx 0.0.1" in why


def test_with_a_compiler_a_refused_prebuilt_falls_back_to_a_local_build(shipped, monkeypatch, copying_compiler):
    monkeypatch.setenv("CXX", copying_compiler)
    edit_manifest(shipped, "ctypes", sources="0" * 64)
    loaded = ctypes_library.status()
    assert loaded.value is not None and loaded.origin == "built locally"
    assert "other kernel sources" in loaded.note
