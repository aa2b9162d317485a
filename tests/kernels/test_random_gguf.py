"""bench/random_gguf.py: a random-weight Q4_0 GGUF at a model's shapes that Brisk's GGUF
import takes (and llama.cpp loads: checked by hand, it is a bench-only install here)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from brisk.bench.random_gguf import PRESETS, cut_tokenizer, write_random_gguf


def test_the_tokenizer_is_cut_to_its_first_ids_with_the_merges_among_them():
    tokenizer = {
        "model": {"vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4}, "merges": ["a b", "ab c", ["b", "c"]]},
        "added_tokens": [{"id": 5, "content": "<|im_end|>", "special": True}],
    }
    tokens, types, merges, ids = cut_tokenizer(tokenizer, 4)
    assert tokens == ["a", "b", "ab", "c"] and types == [1, 1, 1, 1]
    assert merges == ["a b"]  # "ab c" makes "abc" (cut), "b c" makes "bc" (never a token)
    tokens, types, merges, ids = cut_tokenizer(tokenizer, 6)
    assert tokens[-1] == "<|im_end|>" and types[-1] == 3 and ids["<|im_end|>"] == 5
    with pytest.raises(ValueError, match="not all used"):
        cut_tokenizer({"model": {"vocab": {"a": 0, "b": 2}, "merges": []}}, 3)


def test_the_file_has_the_shapes_asked_for_and_brisk_imports_and_runs_it(tiny_llama_dir, tmp_path):
    import gguf
    import mlx.core as mx

    from brisk.engine.models.gguf_import import import_gguf
    from brisk.engine.models.loader import load_folder

    vocab = len(json.loads((tiny_llama_dir / "tokenizer.json").read_text())["model"]["vocab"])
    shapes = dataclasses.replace(PRESETS["tiny"], vocab=vocab)
    out = write_random_gguf(tmp_path / "random.gguf", shapes, tiny_llama_dir, log=lambda message: None)
    reader = gguf.GGUFReader(str(out))
    by_name = {t.name: t for t in reader.tensors}
    assert len([n for n in by_name if n.startswith("blk.")]) == shapes.layers * 9
    gate = by_name["blk.1.ffn_gate.weight"]
    assert gate.tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert list(gate.shape) == [shapes.hidden, shapes.ffn]  # GGUF lists dimensions innermost first
    assert list(by_name["blk.0.attn_k.weight"].shape) == [shapes.hidden, shapes.kv_heads * shapes.head_dim]
    assert by_name["output.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    dest = tmp_path / "imported"
    dest.mkdir()
    config = import_gguf(out, dest)
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
        shapes.layers,
        shapes.hidden,
        shapes.ffn,
    )
    assert config["num_key_value_heads"] == shapes.kv_heads and config["vocab_size"] == vocab
    lm = load_folder(dest, model_id="random")
    logits = lm.model(mx.array([lm.tokenizer.encode("hello there")]))
    assert logits.shape[-1] == vocab and bool(mx.all(mx.isfinite(logits)).item())
