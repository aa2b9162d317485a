"""The model store and folder verification: every broken folder is named precisely."""

import json
import shutil

import pytest

from brisk.engine.api.errors import BriskError, BrokenModelFolder, ModelNotFound, UnsupportedModel
from brisk.engine.models.folder import inspect_folder
from brisk.engine.models.loader import load_folder, load_model
from brisk.engine.models.store import ModelStore, model_id_from_repo
from brisk.kernels import plan


@pytest.fixture
def broken(tmp_path, tiny_llama_dir):
    folder = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, folder)
    return folder


def test_inspect_describes_a_good_folder(tiny_llama_dir, tiny_llama):
    from mlx.utils import tree_flatten

    info = inspect_folder(tiny_llama_dir)
    assert info.architecture == "llama"
    assert info.context_length == 512
    assert info.has_chat_template
    assert info.dtype == "f32"
    # counted from safetensors headers alone, equal to the loaded model's parameter count
    assert info.parameters == sum(v.size for _, v in tree_flatten(tiny_llama.model.parameters()))


def test_missing_config_is_named(broken):
    (broken / "config.json").unlink()
    with pytest.raises(BrokenModelFolder, match="no config.json"):
        load_folder(broken)


def test_invalid_config_json_is_named(broken):
    (broken / "config.json").write_text("{not json")
    with pytest.raises(BrokenModelFolder, match="not valid JSON"):
        load_folder(broken)


def test_unknown_architecture_is_named(broken):
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(UnsupportedModel, match="'bert' is not one mlx-lm"):
        load_folder(broken)


def test_missing_tokenizer_is_named(broken):
    (broken / "tokenizer.json").unlink()
    with pytest.raises(BrokenModelFolder, match="no tokenizer"):
        load_folder(broken)


def test_truncated_safetensors_is_named(broken):
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 1000])
    with pytest.raises(BrokenModelFolder, match="truncated"):
        load_folder(broken)


def test_missing_weights_are_named(broken):
    (broken / "model.safetensors").unlink()
    with pytest.raises(BrokenModelFolder, match="no \\*.safetensors"):
        load_folder(broken)


def test_weights_that_do_not_match_the_config_are_named(broken):
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(BrokenModelFolder, match="cannot be loaded by mlx-lm"):
        load_folder(broken)


def test_store_install_list_get_remove(tmp_path, tiny_llama_dir):
    store = ModelStore(tmp_path / "home")
    entry = store.install_folder(tiny_llama_dir, model_id="tiny", source="test")
    assert [e.id for e in store.list()] == ["tiny"]
    assert store.get("tiny") == entry
    assert entry.tokenizer_fingerprint == inspect_folder(tiny_llama_dir).tokenizer_fingerprint
    lm = load_model("tiny", store=store)
    assert lm.compute_dtype == plan.current().compute_dtype  # float32 on the CPU kernels, else as stored
    store.remove("tiny")
    assert store.list() == []
    with pytest.raises(ModelNotFound, match="not installed"):
        store.get("tiny")


def test_failed_install_leaves_nothing_behind(tmp_path, tiny_llama_dir):
    store = ModelStore(tmp_path / "home")
    with pytest.raises(RuntimeError):
        with store.staging("half") as stage:
            (stage / "config.json").write_text("{}")
            raise RuntimeError("interrupted")
    assert not store.path("half").exists()
    assert [p.name for p in store.models_dir.iterdir()] == []


def test_corrupt_catalog_entry_does_not_hide_other_models(tmp_path, tiny_llama_dir):
    store = ModelStore(tmp_path / "home")
    store.install_folder(tiny_llama_dir, model_id="a", source="test")
    store.install_folder(tiny_llama_dir, model_id="b", source="test")
    (store.path("a") / "brisk.json").write_text("garbage")
    assert [e.id for e in store.list()] == ["b"]
    with pytest.raises(BrokenModelFolder, match="corrupt"):
        store.get("a")


def test_model_ids_are_validated():
    assert model_id_from_repo("mlx-community/Qwen2.5-0.5B-Instruct-4bit") == "qwen2.5-0.5b-instruct-4bit"
    with pytest.raises(BriskError, match="Invalid model id"):
        ModelStore().path("../escape")
