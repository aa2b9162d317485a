"""The native kernel library is loaded only when it is the very file Brisk built, from a
folder nobody else can write: loading a shared library runs its constructors."""

import os
import shutil
import stat
import subprocess

import pytest

from brisk.kernels import ctypes_library

CXX = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
needs_compiler = pytest.mark.skipif(CXX is None, reason="no C++ compiler on this machine to build the library")

# A library whose constructor leaves a mark: what an attacker would drop in the cache.
HOSTILE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void mark(void) {
    FILE *f = fopen(getenv("BRISK_TEST_MARK"), "w"); if (f) { fputs("ran", f); fclose(f); }
}
"""


@pytest.fixture
def fresh(monkeypatch, tmp_path, copying_compiler):
    """An empty kernel cache, and a compiler that copies this run's build into it (the cache's
    rules are under test here, not the compile: the shared cache's build proves that)."""
    monkeypatch.setattr(ctypes_library, "_state", {})
    cache = tmp_path / "kernels"
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(cache))
    monkeypatch.setenv("BRISK_TEST_MARK", str(tmp_path / "mark"))
    monkeypatch.setenv("CXX", copying_compiler)
    return cache


def cache_target():
    """Where the loader builds the ctypes library now (named by its compiler among the rest)."""
    return ctypes_library.library_path(ctypes_library.find_compiler())


def build_hostile(tmp_path, target):
    source = tmp_path / "hostile.c"
    source.write_text(HOSTILE)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    subprocess.run([CXX, "-x", "c", "-shared", "-fPIC", str(source), "-o", str(target)], check=True)


@needs_compiler
def test_cache_folder_is_created_private_and_the_library_hash_is_recorded(fresh):
    assert ctypes_library.load() is not None, ctypes_library.unavailable_reason()
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    library = cache_target()
    assert ctypes_library.digest_path(library).read_text() == ctypes_library.file_sha256(library)


@needs_compiler
def test_a_planted_library_at_the_cache_path_never_runs_and_is_rebuilt(fresh, tmp_path, caplog):
    library = cache_target()
    build_hostile(tmp_path, library)
    with caplog.at_level("WARNING", logger="brisk.kernels.ctypes_library"):
        lib = ctypes_library.load()
    assert not (tmp_path / "mark").exists(), "the planted library's constructor ran"
    assert lib is not None, ctypes_library.unavailable_reason()
    assert ctypes_library.verified(library)
    assert "does not match" in caplog.text


@needs_compiler
def test_a_garbage_library_is_rebuilt_instead_of_leaving_the_slow_path(fresh):
    library = cache_target()
    library.parent.mkdir(mode=0o700, parents=True)
    library.write_bytes(b"\x7fELF garbage")
    assert ctypes_library.load() is not None, ctypes_library.unavailable_reason()
    assert ctypes_library.verified(library)


@needs_compiler
def test_a_forged_hash_record_does_not_make_a_planted_library_load(fresh, tmp_path):
    library = cache_target()
    build_hostile(tmp_path, library)
    ctypes_library.digest_path(library).write_text("0" * 64)
    assert ctypes_library.load() is not None
    assert not (tmp_path / "mark").exists()


@needs_compiler
def test_a_cache_folder_writable_by_others_is_refused(fresh, tmp_path):
    fresh.mkdir(parents=True)
    os.chmod(fresh, 0o777)
    library = cache_target()
    build_hostile(tmp_path, library)
    ctypes_library.digest_path(library).write_text(ctypes_library.file_sha256(library))  # even with a matching record
    assert ctypes_library.load() is None
    assert "writable by others" in ctypes_library.unavailable_reason()
    assert not (tmp_path / "mark").exists()


def test_kernels_live_under_brisk_home_when_it_is_set(monkeypatch, tmp_path):
    monkeypatch.delenv("BRISK_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("BRISK_HOME", str(tmp_path))
    assert ctypes_library.cache_dir() == tmp_path / "cache" / "kernels"


# The MLX primitives module (kernels/mlx_extension.py) shares the same guard.


@pytest.fixture
def fresh_primitives(monkeypatch, fresh):
    from brisk.kernels import mlx_extension

    monkeypatch.setattr(mlx_extension, "_state", {})
    return mlx_extension


@needs_compiler
def test_the_mlx_primitives_build_wherever_nanobind_is_installed():
    """Brisk depends on nanobind, so a failing build is a bug, not a reason to skip the primitive
    tests. The build this run's tests share (the kernel cache) is the one checked: no second one."""
    from brisk.kernels import mlx_extension

    module = mlx_extension.load()
    assert module is not None, mlx_extension.unavailable_reason()
    assert module.version() == mlx_extension.VERSION
    loaded = mlx_extension.status()
    assert loaded.origin == "built locally" and loaded.path == str(
        mlx_extension.module_path(ctypes_library.find_compiler())
    )
    assert ctypes_library.verified(mlx_extension.module_path(ctypes_library.find_compiler()))


@needs_compiler
def test_a_planted_primitives_module_never_runs_and_is_rebuilt(fresh_primitives, tmp_path):
    target = fresh_primitives.module_path(ctypes_library.find_compiler())
    build_hostile(tmp_path, target)
    assert fresh_primitives.load() is not None, fresh_primitives.unavailable_reason()
    assert not (tmp_path / "mark").exists(), "the planted module's constructor ran"
    assert ctypes_library.verified(target)


def test_without_nanobind_the_primitives_say_why_and_the_ctypes_path_stays(fresh_primitives, monkeypatch):
    real = fresh_primitives.importlib.util.find_spec
    monkeypatch.setattr(
        fresh_primitives.importlib.util, "find_spec", lambda name, *a: None if name == "nanobind" else real(name, *a)
    )
    assert fresh_primitives.load() is None
    assert "nanobind" in fresh_primitives.unavailable_reason()


def test_the_primitives_can_be_turned_off_alone(fresh_primitives, monkeypatch):
    monkeypatch.setenv("BRISK_MLX_PRIMITIVES", "0")
    assert fresh_primitives.load() is None and "BRISK_MLX_PRIMITIVES" in fresh_primitives.unavailable_reason()
