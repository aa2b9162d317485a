"""A prebuilt manifest names its libraries by plain file name, in its own folder (issue 54
item 16): an absolute path, a `../` path, or a symlink into a folder anyone can write was
trusted, and loading the library ran its constructor. Here the library is a tiny one whose
constructor leaves a mark, so "never loaded" is seen, not assumed."""

import ctypes
import json
import shutil
import subprocess

import pytest

from brisk.kernels import ctypes_library, prebuilt

GCC = shutil.which("gcc") or shutil.which("cc")
pytestmark = pytest.mark.skipif(GCC is None, reason="building the marking library needs gcc (or cc)")

MARKING = r"""
#include <stdio.h>
__attribute__((constructor)) static void mark(void) {
    FILE *f = fopen(MARK, "w"); if (f) { fputs("ran", f); fclose(f); }
}
"""


def build_marking_library(tmp_path, target):
    """A shared library that writes tmp_path/mark when loaded; its source for the manifest."""
    source = tmp_path / "marking.c"
    source.write_text(MARKING)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [GCC, "-shared", "-fPIC", f'-DMARK="{tmp_path / "mark"}"', str(source), "-o", str(target)], check=True
    )
    target.chmod(0o755)
    return source


def write_manifest(folder, file, library, source):
    folder.mkdir(mode=0o755, exist_ok=True)
    entry = {
        "file": file,
        "sha256": prebuilt.file_sha256(library),
        "sources": prebuilt.sources_digest([source]),
        "requires": {},
        "cpu": [],
    }
    (folder / prebuilt.MANIFEST).write_text(json.dumps({"libraries": {"ctypes": entry}}))


def load_as_brisk_does(source):
    """lookup, then load_first with the ctypes loader and no local build."""

    def no_build():
        raise RuntimeError("no compiler in this test")

    found = prebuilt.lookup("ctypes", [source], {}, [])
    loaded = prebuilt.load_first(
        "ctypes", prebuilt=found, open_file=ctypes.CDLL, build=no_build, errors=(OSError, RuntimeError)
    )
    return found, loaded


@pytest.fixture
def folder(tmp_path, monkeypatch):
    where = tmp_path / "prebuilt"
    monkeypatch.setenv("BRISK_PREBUILT_KERNELS", str(where))
    return where


def test_a_plain_name_in_the_manifests_folder_loads(tmp_path, folder):
    """The control: the same library, named plainly, does load (and leaves its mark)."""
    source = build_marking_library(tmp_path, folder / "brisk_kernels.so")
    write_manifest(folder, "brisk_kernels.so", folder / "brisk_kernels.so", source)
    found, loaded = load_as_brisk_does(source)
    assert found == (folder / "brisk_kernels.so", "") and loaded.origin == "prebuilt"
    assert (tmp_path / "mark").read_text() == "ran"


@pytest.mark.parametrize("name", ["absolute", "../brisk_kernels.so", "sub/brisk_kernels.so"])
def test_a_file_outside_the_manifests_folder_is_refused_and_never_loaded(tmp_path, folder, name):
    outside = folder / "sub" / "brisk_kernels.so" if name.startswith("sub") else tmp_path / "brisk_kernels.so"
    source = build_marking_library(tmp_path, outside)
    write_manifest(folder, str(outside) if name == "absolute" else name, outside, source)
    found, loaded = load_as_brisk_does(source)
    assert found[0] is None and "not a file name inside" in found[1]
    assert loaded.value is None and loaded.origin == "fallback" and "not a file name inside" in loaded.note
    assert not (tmp_path / "mark").exists(), "the library's constructor ran"


def test_a_symlink_into_a_folder_anyone_can_write_is_refused_and_never_loaded(tmp_path, folder):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    source = build_marking_library(tmp_path, shared / "brisk_kernels.so")
    write_manifest(folder, "brisk_kernels.so", shared / "brisk_kernels.so", source)
    (folder / "brisk_kernels.so").symlink_to(shared / "brisk_kernels.so")
    found, loaded = load_as_brisk_does(source)
    assert found[0] is None and "is a symbolic link" in found[1]
    assert loaded.value is None and not (tmp_path / "mark").exists(), "the library's constructor ran"


def test_a_symlinked_manifest_is_refused(tmp_path, folder):
    source = build_marking_library(tmp_path, folder / "brisk_kernels.so")
    write_manifest(tmp_path / "elsewhere", "brisk_kernels.so", folder / "brisk_kernels.so", source)
    (folder / prebuilt.MANIFEST).symlink_to(tmp_path / "elsewhere" / prebuilt.MANIFEST)
    found, _ = load_as_brisk_does(source)
    assert found[0] is None and "is a symbolic link" in found[1]
    assert not (tmp_path / "mark").exists()


@pytest.mark.parametrize("name", ["", "..", 7, None])
def test_a_file_entry_that_is_no_name_is_refused(tmp_path, folder, name):
    source = build_marking_library(tmp_path, folder / "brisk_kernels.so")
    write_manifest(folder, name, folder / "brisk_kernels.so", source)
    found, _ = load_as_brisk_does(source)
    assert found[0] is None and "not a file name inside" in found[1]


def test_brisk_info_says_why_the_prebuilt_library_was_refused(tmp_path, folder, monkeypatch):
    from brisk.engine.runtime.info import kernel_origins

    outside = tmp_path / "brisk_kernels.so"
    build_marking_library(tmp_path, outside)
    entry = {
        "file": str(outside),
        "sha256": prebuilt.file_sha256(outside),
        "sources": prebuilt.sources_digest(ctypes_library.all_sources()),
        "requires": {"platform": prebuilt.platform_tag()},
        "cpu": [],
    }
    folder.mkdir()
    (folder / prebuilt.MANIFEST).write_text(json.dumps({"libraries": {"ctypes": entry}}))
    monkeypatch.setattr(ctypes_library, "_state", {})
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler-here"))
    line = kernel_origins()["kernels_ctypes"]
    assert line.startswith("fallback") and f"the manifest names '{outside}', not a file name inside" in line
    assert not (tmp_path / "mark").exists()
