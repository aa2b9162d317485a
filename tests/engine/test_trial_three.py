"""Inputs from the third adversarial trial (models, CLI, data folder; issue 54): each built
here, each refused or survived without a hang, a traceback or a write outside Brisk's files."""

from __future__ import annotations

import os

import pytest

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.events import EngineErrored
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import Answer, ConversationEvent, EngineWorker

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent


def _logs(tmp_path, monkeypatch):
    monkeypatch.setenv("BRISK_HOME", str(tmp_path / "home"))
    logs = tmp_path / "home" / "logs"
    logs.mkdir(parents=True, mode=0o700)
    return logs / "brisk-errors.log"


def test_the_error_log_is_never_written_through_a_planted_link(tmp_path, monkeypatch):
    from brisk.engine.runtime.crash_log import record_failure

    log = _logs(tmp_path, monkeypatch)
    victim = tmp_path / "victim.txt"
    victim.write_text("one line\n")
    log.symlink_to(victim)
    assert record_failure(RuntimeError("boom"), context="test") is None
    assert victim.read_text() == "one line\n"


def test_a_fifo_planted_as_the_error_log_is_not_waited_on(tmp_path, monkeypatch):
    from brisk.engine.runtime.crash_log import record_failure, user_message

    log = _logs(tmp_path, monkeypatch)
    os.mkfifo(log)  # no reader: a blocking open for writing never returns
    assert record_failure(RuntimeError("boom"), context="test") is None
    assert user_message(RuntimeError("boom"), context="The engine").startswith("The engine failed unexpectedly")


class RustPanic(BaseException):
    """As pyo3's PanicException: a BaseException, which `except Exception` does not catch."""


def test_a_library_panic_is_an_error_event_and_the_engine_goes_on():
    """A hostile tokenizer.json made the tokenizers library panic: the server's engine thread
    died and every later chat request hung."""

    def load(model_id):
        raise RustPanic("Onig: Regex search error: retry-limit-in-match over")

    worker = EngineWorker(load=load)
    command = Answer(3, ChatSettings(model="k1"), [Message("user", "a" * 40 + "b")])
    (event,) = list(worker.handle(command, CancelToken()))
    assert isinstance(event, ConversationEvent) and isinstance(event.event, EngineErrored)
    assert "RustPanic" in event.event.message
    (again,) = list(worker.handle(command, CancelToken()))  # the worker still answers
    assert isinstance(again.event, EngineErrored)


def test_errors_printed_to_a_terminal_carry_no_control_sequences():
    from brisk.engine.host.cli import printable

    hostile = "boom\x1b[2J\x1b]0;PWNED\x07\x1b[31mred\x9b"
    shown = printable(hostile)
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert shown == "boom\\x1b[2J\\x1b]0;PWNED\\x07\\x1b[31mred\\x9b"
    assert printable("two\nlines\tand tabs") == "two\nlines\tand tabs"


def test_ctrl_c_while_the_command_line_loads_is_one_line(monkeypatch, capsys):
    """SIGINT in the first second (building the parser imports the subcommands) printed a raw
    KeyboardInterrupt traceback."""
    import brisk.engine.host.cli

    def interrupted_while_loading(_parser):
        raise KeyboardInterrupt

    monkeypatch.setattr(brisk.engine.host.cli, "add_sampling_args", interrupted_while_loading)
    assert brisk.engine.host.cli.main_interruptible(["run", "--prompt", "hi"]) == 130
    assert capsys.readouterr().err.strip() == "brisk: interrupted"


def _catalog(tmp_path, tiny_llama_dir):
    import json

    from brisk.engine.models.store import ModelStore

    store = ModelStore(tmp_path / "home")
    store.install_folder(tiny_llama_dir, model_id="good", source="test")
    store.install_folder(tiny_llama_dir, model_id="bad", source="test")
    entry = store.path("bad") / "brisk.json"
    return store, entry, json.loads(entry.read_text())


def test_a_catalog_entry_of_the_wrong_shape_hides_only_itself(tmp_path, tiny_llama_dir):
    """A dict where `models list` formats a string failed the list for every model; a deeply
    nested file failed it with RecursionError; an entry naming '../../etc' was listed so."""
    import json

    import pytest

    from brisk.engine.api.errors import BrokenModelFolder

    store, entry, data = _catalog(tmp_path, tiny_llama_dir)
    for hostile in (
        json.dumps({**data, "architecture": {"a": 1}}),
        json.dumps({**data, "context_length": "4096"}),
        json.dumps({**data, "has_chat_template": 1}),
        json.dumps({**data, "id": "../../etc"}),
        '{"a":' * 100_000,
    ):
        entry.write_text(hostile)
        assert [e.id for e in store.list()] == ["good"]
        with pytest.raises(BrokenModelFolder, match="corrupt"):
            store.get("bad")
