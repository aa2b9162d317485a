"""Hostile and broken model folders (issue 14): no code from a folder ever runs, chat
templates are rendered under limits, and every malformed file is named, never a traceback."""

import json
import shutil
import struct
import tracemalloc

import pytest

from brisk.engine.api.errors import BriskError, BrokenModelFolder, TurnCancelled, UnsupportedModel
from brisk.engine.api.session import CancelToken, Message, Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.folder import inspect_folder
from brisk.engine.models.loader import load_folder
from brisk.engine.models.store import ModelStore, validate_model_id
from brisk.engine.turn.chat_template import TemplateError
from brisk.engine.turn.prompt import encode_messages


@pytest.fixture
def folder(tmp_path, tiny_llama_dir):
    copy = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, copy)
    return copy


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


# --- 1. remote code ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "file,key", [("tokenizer_config.json", "auto_map"), ("config.json", "auto_map"), ("config.json", "model_file")]
)
def test_a_folder_asking_to_run_its_own_code_is_refused_naming_the_key(folder, tmp_path, file, key):
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    edit_json(folder / file, **{key: {"AutoTokenizer": ["evil.Tok", None]} if key == "auto_map" else "evil.py"})
    with pytest.raises(BrokenModelFolder, match=f"sets '{key}'"):
        load_folder(folder)
    assert not marker.exists()


def test_the_loader_passes_trust_remote_code_false(monkeypatch, folder):
    import mlx_lm.utils

    seen = {}
    real = mlx_lm.utils.load

    def spy(path, **kwargs):
        seen.update(kwargs)
        return real(path, **kwargs)

    monkeypatch.setattr(mlx_lm.utils, "load", spy)
    load_folder(folder)
    assert seen["trust_remote_code"] is False and seen["tokenizer_config"]["trust_remote_code"] is False


# --- 3. chat templates --------------------------------------------------------------------


def with_template(folder, template):
    edit_json(folder / "tokenizer_config.json", chat_template=template)
    return load_folder(folder, model_id="hostile")


NESTED_LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
FLOOD = "{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}"


class SteppingClock:
    """The sandbox's clock (engine/turn/template_sandbox.py reads time.monotonic): each reading
    is `step` seconds after the last, so time is the count of checks, whatever the load."""

    def __init__(self, step: float):
        self.now, self.step, self.readings = 0.0, step, 0

    def monotonic(self) -> float:
        self.readings += 1
        self.now += self.step
        return self.now


def test_a_template_that_loops_for_ever_is_stopped_within_its_budget(folder, monkeypatch):
    from brisk.engine.turn import chat_template, template_sandbox

    clock = SteppingClock(0.001)
    monkeypatch.setattr(template_sandbox, "time", clock)
    lm = with_template(folder, NESTED_LOOPS)
    budget = chat_template.DEFAULT_TEMPLATE_SECONDS + chat_template.TEMPLATE_SECONDS_PER_MESSAGE
    with pytest.raises(TemplateError, match="ran longer than"):
        encode_messages(lm, [Message("user", "hi")])
    # The clock is read at every iteration of the inner loop and the render stops at the first
    # reading past its budget: ~2,000 iterations of the 10^10 the template asks for.
    assert clock.readings == pytest.approx(budget / clock.step, abs=3)


def test_a_template_that_floods_output_is_stopped_by_the_size_cap(folder):
    lm = with_template(folder, FLOOD)
    with pytest.raises(TemplateError, match="more than"):
        encode_messages(lm, [Message("user", "hi")])


def test_stop_interrupts_a_slow_template(folder, monkeypatch):
    from brisk.engine.turn import template_sandbox

    monkeypatch.setattr(template_sandbox, "time", SteppingClock(0.0))  # the time budget never runs out
    lm = with_template(folder, NESTED_LOOPS)
    cancel, polls = CancelToken(), []

    def cancelled():
        polls.append(1)
        if len(polls) == 500:
            cancel.cancel()  # the user presses Stop while the template loops
        return cancel.cancelled

    with pytest.raises(TurnCancelled):
        encode_messages(lm, [Message("user", "hi")], cancelled=cancelled)
    assert len(polls) == 500  # seen at once: no iteration ran after Stop


def test_a_hostile_template_ends_the_turn_with_a_clear_error(folder):
    session = Session(with_template(folder, FLOOD), ChatSettings(model="tiny", temperature=0, max_tokens=4))
    events = list(session.send("hi"))
    errors = [e for e in events if type(e).__name__ == "EngineErrored"]
    assert errors and "chat template" in errors[0].message and errors[0].kind == "chat_template"


def test_a_template_raising_its_own_error_is_reported(folder):
    lm = with_template(folder, "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        encode_messages(lm, [Message("user", "hi")])


# --- 13. malformed safetensors headers and configs -----------------------------------------


def write_header(path, header):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 64)


@pytest.mark.parametrize(
    "header",
    [
        [1, 2, 3],
        {"w": {"dtype": "F32", "shape": [4, 4]}},
        {"w": {"dtype": "F32", "shape": ["4", "4"], "data_offsets": [0, 64]}},
        {"w": {"dtype": "F32", "shape": [4], "data_offsets": [16]}},
    ],
)
def test_malformed_safetensors_headers_are_named(folder, header):
    write_header(folder / "model.safetensors", header)
    with pytest.raises(BrokenModelFolder, match="corrupt safetensors header"):
        inspect_folder(folder)


@pytest.mark.parametrize(
    "change,error,match",
    [
        ({"model_type": "base"}, UnsupportedModel, "'base'"),
        ({"model_type": "cache"}, UnsupportedModel, "'cache'"),
        ({"text_config": [1, 2]}, BrokenModelFolder, "text_config"),
        ({"max_position_embeddings": True}, BrokenModelFolder, "max_position_embeddings"),
        ({"max_position_embeddings": 1 << 40}, BrokenModelFolder, "max_position_embeddings"),
        ({"num_attention_heads": 0}, BrokenModelFolder, "num_attention_heads"),
        ({"quantization": {"bits": "four"}}, BrokenModelFolder, "quantization"),
    ],
)
def test_hostile_config_values_are_named(folder, change, error, match):
    edit_json(folder / "config.json", **change)
    with pytest.raises(error, match=match):
        load_folder(folder)


def test_a_broken_safetensors_index_is_named(folder):
    (folder / "model.safetensors.index.json").write_text('{"weight_map": [')
    with pytest.raises(BrokenModelFolder, match="index.json is corrupt"):
        inspect_folder(folder)


def test_a_config_that_breaks_inside_mlx_lm_is_a_broken_folder_not_a_traceback(folder):
    edit_json(folder / "config.json", hidden_size=60)  # not divisible into the weights' shapes
    with pytest.raises(BrokenModelFolder, match="cannot be loaded"):
        load_folder(folder)


# --- 13. the store: symlinked models, concurrent installs; 16. ids -------------------------


def test_removing_a_symlinked_model_removes_the_link_not_the_target(tmp_path, tiny_llama_dir):
    store = ModelStore(tmp_path / "home")
    store.install_folder(tiny_llama_dir, model_id="real", source="test")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(store.path("real"), elsewhere)
    store.path("linked").symlink_to(elsewhere, target_is_directory=True)
    store.remove("linked")
    assert not store.path("linked").exists() and (elsewhere / "config.json").is_file()


def test_a_second_install_of_the_same_id_is_told_it_is_already_being_installed(tmp_path, tiny_llama_dir):
    store = ModelStore(tmp_path / "home")
    with pytest.raises(KeyboardInterrupt):  # the first install is interrupted after the second was refused
        with store.staging("dup"):
            with pytest.raises(BriskError, match="already being installed"):
                with store.staging("dup"):
                    pass
            raise KeyboardInterrupt
    with store.staging("dup") as stage:  # the lock is released afterwards
        shutil.copytree(tiny_llama_dir, stage, dirs_exist_ok=True)
        store.register(stage, model_id="dup", source="test")
    assert store.has("dup")


@pytest.mark.parametrize("bad", ["smollm\n", "a\nb", "", "UPPER", "../x", "a" * 81])
def test_model_ids_must_match_in_full(bad):
    with pytest.raises(BriskError, match="Invalid model id"):
        validate_model_id(bad)


# --- 12. hostile GGUF files ----------------------------------------------------------------


def test_a_gguf_declaring_a_huge_array_is_refused_at_once(tmp_path):
    from brisk.engine.api.errors import GGUFImportError
    from brisk.engine.models.gguf_import import import_gguf

    path = tmp_path / "bomb.gguf"
    key = b"tokenizer.ggml.tokens"
    # magic, version 3, 0 tensors, 1 key: an array of 2^62 strings in a 52-byte file
    path.write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 1 << 62)
    )
    assert path.stat().st_size < 100
    with pytest.raises(GGUFImportError, match="hostile"):
        import_gguf(path, tmp_path)  # imports what the reader needs, so the next call measures only itself
    tracemalloc.start()
    try:
        with pytest.raises(GGUFImportError, match="hostile"):
            import_gguf(path, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # refused from the declared count: nothing allocated or read for 2^62 strings


@pytest.mark.parametrize(
    "metadata,match",
    [({"attention.head_count": 0}, "head_count|num_attention_heads"), ({"context_length": 1 << 40}, "context")],
)
def test_gguf_metadata_out_of_range_is_refused_before_install(tmp_path, metadata, match):
    from brisk.engine.api.errors import GGUFImportError
    from brisk.engine.models.gguf_import import import_gguf
    from tests.gguf_writer import write_gguf
    from tests.tiny_models import make_tiny_model

    original = make_tiny_model(tmp_path / "orig", "qwen2", context_length=256)
    path = write_gguf(original, tmp_path / "m.gguf", uint64_metadata=metadata)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(GGUFImportError, match=match):
        import_gguf(path, dest)
