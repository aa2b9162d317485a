"""Before Qt starts: are the system libraries its X11 (xcb) platform plugin needs there, and
does the installed PySide6 keep its references (the second half, below)?

Without them Qt aborts with "Could not load the Qt platform plugin xcb" and names the
wrong culprit (it blamed xcb-cursor0, which was installed, when libxcb-icccm4 and
libxcb-keysyms1 were missing on a bare Debian 12). `ldd` on the plugin names exactly what
is missing; this turns that into the one command that installs it.
"""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import subprocess
import sys
from pathlib import Path

# soname -> (Debian/Ubuntu package, Fedora package). The Debian list is what README's launch
# command installs (checked on Debian 12); the Fedora names follow Fedora's xcb-util split.
PACKAGES = {
    "libxcb-cursor.so.0": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so.4": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-keysyms.so.1": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-image.so.0": ("libxcb-image0", "xcb-util-image"),
    "libxcb-render-util.so.0": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-randr.so.0": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so.0": ("libxcb-shape0", "libxcb"),
    "libxcb-sync.so.1": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so.0": ("libxcb-xfixes0", "libxcb"),
    "libxcb-xkb.so.1": ("libxcb-xkb1", "libxcb"),
    "libxcb-shm.so.0": ("libxcb-shm0", "libxcb"),
    "libxcb-render.so.0": ("libxcb-render0", "libxcb"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libX11-xcb.so.1": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so.6": ("libx11-6", "libX11"),
    "libxkbcommon-x11.so.0": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so.0": ("libxkbcommon0", "libxkbcommon"),
    "libEGL.so.1": ("libegl1", "mesa-libEGL"),
    "libGL.so.1": ("libgl1", "mesa-libGL"),
    "libfontconfig.so.1": ("libfontconfig1", "fontconfig"),
    "libfreetype.so.6": ("libfreetype6", "freetype"),
    "libdbus-1.so.3": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so.0": ("libglib2.0-0", "glib2"),
}
# Qt loads this one with dlopen at start-up, so ldd never lists it.
DLOPENED = ("libxcb-cursor.so.0",)


def wants_xcb() -> bool:
    """Qt will pick its xcb platform: Linux, an X display, no other platform requested."""
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if not sys.platform.startswith("linux") or (platform and not platform.startswith("xcb")):
        return False
    return bool(platform or os.environ.get("DISPLAY")) and not os.environ.get("WAYLAND_DISPLAY")


def qt_xcb_files() -> list[Path]:
    import PySide6

    qt = Path(PySide6.__file__).parent / "Qt"
    return [p for p in (qt / "plugins" / "platforms" / "libqxcb.so", qt / "lib" / "libQt6XcbQpa.so.6") if p.exists()]


def missing_from_ldd(output: str) -> list[str]:
    return [line.split("=>")[0].strip() for line in output.splitlines() if "not found" in line]


def missing_libraries(ldd=None) -> list[str]:
    """Sonames the xcb plugin needs and the system lacks (empty when unknown: no ldd)."""
    ldd = ldd or _ldd
    missing: list[str] = []
    for file in qt_xcb_files():
        missing += missing_from_ldd(ldd(file))
    for name in DLOPENED:
        try:
            ctypes.CDLL(name)
        except OSError:
            missing.append(name)
    return sorted(set(missing))


def _ldd(file: Path) -> str:
    tool = shutil.which("ldd")
    if not tool:
        return ""
    return subprocess.run([tool, str(file)], capture_output=True, text=True, timeout=30).stdout


def install_advice(missing: list[str]) -> str:
    debian = sorted({PACKAGES.get(m, (m, m))[0] for m in missing})
    fedora = sorted({PACKAGES.get(m, (m, m))[1] for m in missing})
    sudo = "" if hasattr(os, "geteuid") and os.geteuid() == 0 else "sudo "  # root has no sudo on a bare system
    return (
        "Qt's X11 (xcb) platform cannot start: these system libraries are missing: "
        f"{', '.join(missing)}.\nInstall them, then start brisk-app again:\n"
        f"  Debian/Ubuntu: {sudo}apt-get install -y {' '.join(debian)}\n"
        f"  Fedora:        {sudo}dnf install -y {' '.join(fedora)}"
    )


# Qt's Python binding must keep its references to None, True and False. PySide6/shiboken6
# 6.12.0 dropped one to None on every call that returns nothing; on Python 3.11 (Debian 12's)
# the count reaches zero after a few thousand calls and the interpreter aborts ("none_dealloc"),
# mid-chat or at quit. pyproject's gui extra keeps this requirement; the probe catches any
# install that has a leaking release anyway, whatever its version string says.
PYSIDE_REQUIREMENT = "PySide6-Essentials>=6.8,<6.12"
PROBE_CALLS = 100  # few: each one a leaking binding runs takes a reference, until given back


def singleton_refcounts() -> dict[str, int]:
    return {"None": sys.getrefcount(None), "True": sys.getrefcount(True), "False": sys.getrefcount(False)}


def lost_references(call, calls: int = PROBE_CALLS) -> dict[str, int]:
    """How many references to None, True and False `calls` runs of `call` took and never gave
    back. The collector is held off meanwhile: freeing unrelated garbage lowers the counts too."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        before = singleton_refcounts()
        for _ in range(calls):
            call()
        after = singleton_refcounts()
    finally:
        if collecting:
            gc.enable()
    return {name: before[name] - after[name] for name in before if after[name] < before[name]}


def _qt_calls():
    """A call that returns nothing, a signal emitted (6.12.0 dropped a True per emit) and a
    call that returns a bool, on a throwaway object."""
    from PySide6.QtCore import QObject, Signal

    class Probe(QObject):
        ping = Signal(bool)

    probe = Probe()

    def call():
        probe.setObjectName("probe")
        probe.ping.emit(False)
        probe.signalsBlocked()

    return call


def qt_reference_leak(call=None) -> str:
    """Empty when Qt's calls keep their references; else the one line that says what to do.
    A leak loses one reference per call, so half the calls is far above any noise."""
    lost = lost_references(call or _qt_calls())
    leaking = {name: n for name, n in lost.items() if n >= PROBE_CALLS // 2}
    if not leaking:
        return ""
    _give_back(leaking)  # the probe's own losses, so that exiting now cannot abort
    import PySide6

    return (
        f"PySide6 {PySide6.__version__} loses a reference to {' and '.join(leaking)} on every Qt call, "
        "and Python aborts once the count runs out; install a release without the bug: "
        f'{sys.executable} -m pip install "{PYSIDE_REQUIREMENT}"'
    )


def _give_back(lost: dict[str, int]) -> None:
    objects = {"None": None, "True": True, "False": False}
    increment = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))
    for name, n in lost.items():
        for _ in range(n):
            increment(objects[name])
