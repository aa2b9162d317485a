"""The macOS build cannot run here (no Mac): what can be checked on Linux is. The plists
are valid and say what MLX and a Retina desktop app need; the PyInstaller spec runs with
stand-ins for PyInstaller and asks for the right app; the iconset renders."""

import plistlib
import sys
import types
from pathlib import Path

import pytest

from brisk.engine.version import __version__

ROOT = Path(__file__).resolve().parents[2]
MACOS = ROOT / "packaging" / "macos"


def test_the_info_plist_is_valid_and_says_what_brisk_needs():
    with open(MACOS / "Info.plist", "rb") as fh:
        info = plistlib.load(fh)
    assert tuple(int(p) for p in info["LSMinimumSystemVersion"].split(".")) >= (14, 0)  # MLX's wheels
    assert info["NSHighResolutionCapable"] is True and info["NSRequiresAquaSystemAppearance"] is False
    assert info["LSApplicationCategoryType"].startswith("public.app-category.")
    assert info["LSArchitecturePriority"] == ["arm64"] and info["CFBundlePackageType"] == "APPL"
    assert "CFBundleShortVersionString" not in info  # the spec adds it from engine/version.py


def test_the_entitlements_are_a_valid_plist_of_booleans():
    with open(MACOS / "entitlements.plist", "rb") as fh:
        entitlements = plistlib.load(fh)
    assert entitlements and all(key.startswith("com.apple.security.") for key in entitlements)
    assert all(value is True for value in entitlements.values())


class Recorder:
    """Stands in for PyInstaller's Analysis, PYZ, EXE, COLLECT and BUNDLE."""

    made: dict = {}

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        self.pure = self.scripts = self.binaries = self.datas = []
        Recorder.made[type(self).__name__] = self


def run_spec(spec: Path, monkeypatch, **env) -> dict:
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_data_files = lambda package, includes=None: [(f"{package}:{includes}", package)]
    hooks.collect_submodules = lambda package: [f"{package}.stub"]
    hooks.copy_metadata = lambda dist: [(f"{dist}.dist-info", ".")]
    for name in ("PyInstaller", "PyInstaller.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "PyInstaller.utils.hooks", hooks)
    monkeypatch.delitem(sys.modules, "freeze", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for key, value in {"BRISK_ROOT": str(ROOT), **env}.items():
        monkeypatch.setenv(key, value)
    Recorder.made = {}
    names = {name: type(name, (Recorder,), {}) for name in ("Analysis", "PYZ", "EXE", "COLLECT", "BUNDLE")}
    exec(compile(spec.read_text(), str(spec), "exec"), {**names, "__file__": str(spec)})
    return Recorder.made


def test_the_macos_spec_builds_a_windowed_arm64_app_with_the_single_sourced_version(monkeypatch, tmp_path):
    made = run_spec(
        MACOS / "Brisk.spec",
        monkeypatch,
        BRISK_PREBUILT=str(tmp_path / "prebuilt"),
        BRISK_ICNS=str(tmp_path / "Brisk.icns"),
    )
    bundle = made["BUNDLE"].kwargs
    assert bundle["name"] == "Brisk.app" and bundle["icon"] == str(tmp_path / "Brisk.icns")
    assert bundle["info_plist"]["CFBundleShortVersionString"] == __version__
    assert bundle["bundle_identifier"] == bundle["info_plist"]["CFBundleIdentifier"]
    exe = made["EXE"].kwargs
    assert exe["console"] is False and exe["target_arch"] == "arm64" and Path(exe["entitlements_file"]).is_file()
    analysis = made["Analysis"]
    assert analysis.args[0] == [str(ROOT / "packaging" / "brisk_entry.py")]
    assert (str(tmp_path / "prebuilt"), "brisk/kernels/prebuilt") in analysis.kwargs["datas"]
    assert analysis.kwargs["binaries"] == []  # no MKL on macOS


def test_the_linux_spec_ships_mkl_from_the_folder_it_is_given(monkeypatch, tmp_path):
    for name in ("libmkl_rt.so.3", "libmkl_core.so.3", "libmkl_scalapack_lp64.so.2"):
        (tmp_path / name).write_bytes(b"")
    made = run_spec(
        ROOT / "packaging" / "linux" / "brisk.spec",
        monkeypatch,
        BRISK_PREBUILT=str(tmp_path / "pb"),
        BRISK_MKL_DIR=str(tmp_path),
    )
    shipped = sorted(Path(src).name for src, dest in made["Analysis"].kwargs["binaries"])
    assert shipped == ["libmkl_core.so.3", "libmkl_rt.so.3"]  # ScaLAPACK stays out
    assert made["COLLECT"].kwargs["name"] == "brisk"


def test_the_iconset_has_the_ten_sizes_iconutil_wants():
    pytest.importorskip("PySide6", reason="the iconset is rendered with Qt's SVG renderer")
    from PySide6.QtGui import QImage

    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import make_iconset
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        written = make_iconset.render(ROOT / "resources" / "icons" / "brisk.svg", Path(tmp) / "Brisk.iconset")
        sizes = {path.name: QImage(str(path)).width() for path in written}
        opaque = QImage(str(written[-1])).pixelColor(512, 512).alpha()
    assert len(sizes) == 10
    assert sizes["icon_16x16.png"] == 16 and sizes["icon_16x16@2x.png"] == 32 and sizes["icon_512x512@2x.png"] == 1024
    assert opaque > 0  # the drawing is there, not a blank square
