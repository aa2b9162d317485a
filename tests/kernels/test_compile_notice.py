"""The kernels' one-time compile is announced to whoever shows progress (the CLI's stderr, the
app's loading line through the model loader's progress callback), never done in silence."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from brisk.kernels import compile_notice, ctypes_library
from brisk.kernels.compile_notice import BUILT, FAILED, STARTED


@pytest.fixture(autouse=True)
def fresh_notice(monkeypatch):
    monkeypatch.setattr(compile_notice, "_listeners", [])
    monkeypatch.setattr(compile_notice, "_compiled", {"count": 0})


def _writer(body: str) -> list[str]:
    """A stand-in compiler: runs `body` with the output path (the last argument) as sys.argv[1]."""
    return [sys.executable, "-c", body, "OUT"]


def test_a_compile_is_announced_before_and_after_to_the_innermost_listener(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))
    outer, inner = [], []
    compile_notice.listen_always(outer.append)
    target = tmp_path / "cache" / "lib.so"
    with compile_notice.listening(inner.append):
        ctypes_library.build_verified(
            target, _writer("import sys; open(sys.argv[1], 'wb').write(b'lib')"), "the native kernels"
        )
    assert target.read_bytes() == b"lib"
    assert [(e.phase, e.what, e.first) for e in inner] == [
        (STARTED, "the native kernels", True),
        (BUILT, "the native kernels", False),
    ]
    assert inner[0].message.startswith("Compiling Brisk's CPU kernels once for this machine")
    assert inner[1].message.startswith("Compiled the native kernels in ")
    assert outer == []  # the inner listener replaces the outer one while it listens
    ctypes_library.build_verified(target, _writer("raise SystemExit(1)"), "the native kernels")  # built: nothing to say
    assert len(inner) == 2 and outer == []


def test_a_failed_compile_is_announced_and_still_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))
    heard = []
    compile_notice.listen_always(heard.append)
    with pytest.raises(RuntimeError, match="compiling the MLX primitives failed"):
        ctypes_library.build_verified(
            tmp_path / "cache" / "ops.so", _writer("import sys; sys.exit('no compiler here')"), "the MLX primitives"
        )
    assert [e.phase for e in heard] == [STARTED, FAILED]
    assert "failed" in heard[1].message and "goes on without them" in heard[1].message


def test_a_second_library_is_not_announced_as_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))
    heard = []
    compile_notice.listen_always(heard.append)
    for name in ("a.so", "b.so"):
        ctypes_library.build_verified(tmp_path / "cache" / name, _writer("import sys; open(sys.argv[1], 'w')"), name)
    starts = [e for e in heard if e.phase == STARTED]
    assert [e.first for e in starts] == [True, False]
    assert starts[1].message == "Compiling: b.so…"


def test_a_listener_that_fails_does_not_fail_the_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_KERNEL_CACHE", str(tmp_path / "cache"))

    def broken(event):
        raise ValueError("display gone")

    compile_notice.listen_always(broken)
    target = tmp_path / "cache" / "lib.so"
    ctypes_library.build_verified(
        target, _writer("import sys; open(sys.argv[1], 'wb').write(b'x')"), "the native kernels"
    )
    assert target.exists()


def test_the_model_loader_reports_the_compile_as_load_progress(monkeypatch):
    """The engine's hook: load_installing_default's progress callback (the CLI prints it, the
    app's worker turns it into ModelLoadProgressed for the loading line) hears the compile."""
    from brisk.engine.models import bundled, loader

    def loading(model_id, store=None):
        with compile_notice.compiling("the native kernels"):
            pass
        return f"loaded {model_id}"

    monkeypatch.setattr(loader, "load_model", loading)
    monkeypatch.setattr(bundled.ModelStore, "has", lambda self, model_id: True)
    said: list[str] = []
    assert bundled.load_installing_default("some-model", progress=said.append) == "loaded some-model"
    assert said[0].startswith("Compiling Brisk's CPU kernels once for this machine (about a minute)")
    assert said[1].startswith("Compiled the native kernels in ")
    assert compile_notice._listeners == []  # the loader's listener is gone once it returns


def test_the_cli_prints_a_compile_on_stderr(monkeypatch, capsys, tmp_path: Path):
    from brisk.engine.host import cli

    def info(args):
        with compile_notice.compiling("the MLX primitives"):
            pass
        return 0

    monkeypatch.setattr(cli, "cmd_info", info)
    assert cli.main(["info"]) == 0
    err = capsys.readouterr().err
    assert "brisk: Compiling Brisk's CPU kernels once for this machine (about a minute): the MLX primitives…" in err
    assert "brisk: Compiled the MLX primitives in " in err
