"""brisk-app names the system libraries Qt's xcb platform lacks, with the install command,
instead of Qt's abort that blamed the wrong package."""

import os

import pytest

import brisk.app.platform_check as platform_check

LDD_ON_BARE_DEBIAN = """\
\tlibQt6XcbQpa.so.6 => /x/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-cursor.so.0 => /lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x00007f)
"""


def test_missing_libraries_are_read_from_ldd():
    assert platform_check.missing_from_ldd(LDD_ON_BARE_DEBIAN) == ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]


def test_brisk_app_prints_the_install_command_instead_of_qts_abort(monkeypatch, capsys):
    from brisk.app.main import main

    monkeypatch.setattr(platform_check, "_ldd", lambda file: LDD_ON_BARE_DEBIAN)
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "apt-get install -y libxcb-icccm4 libxcb-keysyms1" in err
    assert "xcb-util-keysyms xcb-util-wm" in err


def test_other_platforms_are_not_checked(monkeypatch):
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert not platform_check.wants_xcb()


@pytest.mark.skipif(
    os.environ.get("BRISK_CI_XCB") != "1",
    reason="only meaningful after installing exactly README's packages (the CI xcb stage does)",
)
def test_the_readme_packages_leave_nothing_missing():
    assert platform_check.missing_libraries() == []


@pytest.mark.parametrize("uid,prefix", [(0, ""), (1000, "sudo ")])
def test_the_install_command_uses_sudo_only_for_a_user_who_is_not_root(monkeypatch, uid, prefix):
    """As root on a bare Debian there is no sudo ("sudo: command not found", issue 58)."""
    monkeypatch.setattr(platform_check.os, "geteuid", lambda: uid)
    advice = platform_check.install_advice(["libxcb-icccm.so.4"])
    assert f"  Debian/Ubuntu: {prefix}apt-get install -y libxcb-icccm4" in advice
    assert f"  Fedora:        {prefix}dnf install -y" in advice


def test_the_readmes_launch_command_runs_apt_get_itself_as_root_and_through_sudo_otherwise(tmp_path):
    import re
    import subprocess
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "apt-get install -y libxcb" in line)
    prefix = re.match(r"(.*?)apt-get install", line).group(1)
    assert "sudo" in prefix
    for uid, want in (("0", ""), ("1000", "sudo")):
        fake = tmp_path / uid
        fake.mkdir()
        (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
        (fake / "id").chmod(0o755)
        out = subprocess.run(
            ["bash", "-c", f"echo {prefix}"], env={"PATH": f"{fake}:/usr/bin:/bin"}, capture_output=True, text=True
        )
        assert out.stdout.strip() == want
