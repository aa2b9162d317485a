"""GGUF files that used to install a broken model or end in 'failed unexpectedly' (issue 54,
items 9 and 14): each is built here from a tiny model's GGUF, refused with one clear line
before anything is written, and leaves nothing installed and no staging folder."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from brisk.engine.api.errors import GGUFImportError
from brisk.engine.models import gguf_check
from brisk.engine.models.gguf_import import import_gguf
from brisk.engine.models.store import ModelStore
from tests.gguf_writer import write_gguf
from tests.tiny_models import make_tiny_model

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent

T = gguf.GGUFValueType


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    return write_gguf(make_tiny_model(folder / "model", "qwen2"), folder / "m.gguf")


def rewrite(src, dst, *, fields=None, drop=(), tensors=None):
    """`src` written again with `fields` ({key: (value, type[, item type])}) set, `drop` keys
    left out and `tensors` ({name: array or None}) replaced or removed."""
    fields, tensors = fields or {}, tensors or {}
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop or key in fields:
            continue
        sub = field.types[-1] if field.types[0] == T.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for key, (value, kind, *sub) in fields.items():
        writer.add_key_value(key, value, kind, sub_type=sub[0] if sub else None)
    for tensor in reader.tensors:
        data = tensors.get(tensor.name, np.array(tensor.data))
        if data is not None:
            writer.add_tensor(tensor.name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def patch_tensor_info(path, name, *, offset_of=None, type_id=None):
    """Overwrite tensor `name`'s stored data offset (with `offset_of`'s) or type in place."""
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    field = by_name[name].field
    at = field.offset + sum(part.nbytes for part in field.parts[:-2])  # type u32, then offset u64
    del reader
    with open(path, "r+b") as fh:
        if type_id is not None:
            fh.seek(at)
            fh.write(struct.pack("<I", type_id))
        if offset_of is not None:
            other = gguf.GGUFReader(str(path)).tensors
            offset = next(t for t in other if t.name == offset_of).field.parts[-1][0]
            fh.seek(at + 4)
            fh.write(struct.pack("<Q", int(offset)))
    return path


def tokens_of(src) -> list[str]:
    return gguf.GGUFReader(str(src)).fields["tokenizer.ggml.tokens"].contents()


def refused(path, tmp_path, match):
    """Import `path` the way the CLI does; it must fail with `match`, install nothing, stage nothing."""
    store = ModelStore(tmp_path / "home")
    with pytest.raises(GGUFImportError, match=match):
        with store.staging("hostile") as stage:
            import_gguf(path, stage)
            store.register(stage, model_id="hostile", source="test")
    assert not store.has("hostile")
    assert [p.name for p in store.models_dir.iterdir()] == []  # no model, no .staging-hostile


def test_a_vocabulary_of_one_token_is_refused(tiny_gguf, tmp_path):
    reader = gguf.GGUFReader(str(tiny_gguf))
    embedding = np.array(next(t for t in reader.tensors if t.name == "token_embd.weight").data)
    path = rewrite(
        tiny_gguf,
        tmp_path / "v1.gguf",
        fields={"tokenizer.ggml.tokens": (["a"], T.ARRAY, T.STRING), "tokenizer.ggml.token_type": ([1], T.ARRAY)},
        drop=("tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"),
        tensors={"token_embd.weight": embedding[:1]},
    )
    refused(path, tmp_path, "vocabulary has 1 tokens")


@pytest.mark.parametrize(
    "name,shape,why",
    [
        ("blk.0.ffn_up.weight", (0, 64), "a zero dimension"),
        ("blk.1.attn_norm.weight", (32,), "a norm of half the hidden size"),
        ("blk.0.ffn_down.weight", (64, 96), "a down projection from the wrong size"),
    ],
)
def test_a_tensor_whose_shape_differs_from_the_metadata_is_refused(tiny_gguf, tmp_path, name, shape, why):
    path = rewrite(tiny_gguf, tmp_path / "shape.gguf", tensors={name: np.zeros(shape, np.float32)})
    refused(path, tmp_path, f"Tensor {name} is .* but the metadata makes it")


def test_a_wrong_hidden_size_is_refused(tiny_gguf, tmp_path):
    path = rewrite(tiny_gguf, tmp_path / "h.gguf", fields={"qwen2.embedding_length": (32, T.UINT32)})
    refused(path, tmp_path, "Tensor .* is .* but the metadata makes it")


def test_swapped_tensor_names_are_refused(tiny_gguf, tmp_path):
    reader = gguf.GGUFReader(str(tiny_gguf))
    data = {t.name: np.array(t.data) for t in reader.tensors}
    swapped = {"blk.0.attn_q.weight": data["blk.0.attn_k.weight"], "blk.0.attn_k.weight": data["blk.0.attn_q.weight"]}
    refused(rewrite(tiny_gguf, tmp_path / "swap.gguf", tensors=swapped), tmp_path, "blk.0.attn_(q|k).weight is")


def test_a_missing_layer_tensor_is_refused(tiny_gguf, tmp_path):
    path = rewrite(tiny_gguf, tmp_path / "gap.gguf", tensors={"blk.1.ffn_gate.weight": None})
    refused(path, tmp_path, r"lacks 1 tensor\(s\) its metadata promises \(e.g. blk.1.ffn_gate.weight\)")


@pytest.mark.parametrize(
    "key,value,kind,match",
    [
        ("qwen2.attention.layer_norm_rms_epsilon", float("nan"), T.FLOAT32, "epsilon' is nan .*finite number above 0"),
        ("qwen2.attention.layer_norm_rms_epsilon", 5.0, T.FLOAT32, "not a small number"),
        ("qwen2.rope.freq_base", 0.0, T.FLOAT32, "freq_base' is 0.0 .*above 0"),
        ("qwen2.rope.freq_base", -10000.0, T.FLOAT32, "freq_base' is -10000.0"),
        ("qwen2.attention.head_count_kv", 3, T.UINT32, "4 attention heads cannot be shared among 3"),
        ("qwen2.feed_forward_length", "big", T.STRING, "feed_forward_length' is 'big' \\(str\\), not a whole number"),
        ("qwen2.feed_forward_length", "128", T.STRING, "feed_forward_length' is '128' \\(str\\)"),
        ("qwen2.block_count", 2.0, T.FLOAT32, "block_count' is 2.0 \\(float\\), not a whole number"),
        ("tokenizer.ggml.eos_token_id", "two", T.STRING, "eos_token_id' is 'two' \\(str\\), not a token id"),
    ],
)
def test_metadata_of_the_wrong_type_or_range_is_refused(tiny_gguf, tmp_path, key, value, kind, match):
    refused(rewrite(tiny_gguf, tmp_path / "meta.gguf", fields={key: (value, kind)}), tmp_path, match)


def test_tokens_that_are_not_utf8_are_refused(tiny_gguf, tmp_path):
    tokens: list = tokens_of(tiny_gguf)
    tokens[7] = b"\xff\xfeA"
    path = rewrite(tiny_gguf, tmp_path / "bytes.gguf", fields={"tokenizer.ggml.tokens": (tokens, T.ARRAY, T.STRING)})
    refused(path, tmp_path, r"'tokenizer.ggml.tokens' holds text that is not UTF-8 \(bytes b'\\xff")


def test_overlapping_tensors_are_refused(tiny_gguf, tmp_path):
    path = rewrite(tiny_gguf, tmp_path / "overlap.gguf")
    patch_tensor_info(path, "blk.0.ffn_norm.weight", offset_of="blk.0.attn_norm.weight")
    refused(path, tmp_path, "Tensors blk.0.(attn|ffn)_norm.weight and blk.0.(attn|ffn)_norm.weight overlap")


def test_a_tensor_labelled_with_the_wrong_type_is_refused(tiny_gguf, tmp_path):
    path = rewrite(tiny_gguf, tmp_path / "label.gguf")
    patch_tensor_info(path, "blk.0.attn_norm.weight", type_id=int(gguf.GGMLQuantizationType.Q8_0))
    refused(path, tmp_path, "blk.0.attn_norm.weight is .* bytes for its type but .* its type does not match")


@pytest.mark.parametrize("claim", [10_000_000, 1_000_000])
def test_millions_of_tokens_are_refused_before_anything_reads_them(tmp_path, monkeypatch, claim):
    """The header's claim is enough: a sparse file of empty strings costs no disk or memory."""
    path = tmp_path / "vocab.gguf"
    key = b"tokenizer.ggml.tokens"
    with open(path, "wb") as fh:
        fh.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key)
        fh.write(struct.pack("<IIQ", 9, 8, claim))
        fh.truncate(fh.tell() + 8 * claim)  # each empty string is a zero length
    built = []
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: built.append(a))
    refused(path, tmp_path, f"lists {claim:,} tokens in 'tokenizer.ggml.tokens'; no model has more than 524,288")
    assert built == []


def test_a_vocabulary_larger_than_free_memory_is_refused_before_the_reader(tiny_gguf, tmp_path, monkeypatch):
    strings = len(tokens_of(tiny_gguf)) + len(gguf.GGUFReader(str(tiny_gguf)).fields["tokenizer.ggml.merges"].data)
    monkeypatch.setattr(gguf_check, "available_memory", lambda: strings * gguf_check.BYTES_PER_STRING // 2)
    built = []
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: built.append(a))
    refused(tiny_gguf, tmp_path, f"lists {strings:,} strings .* more than the .* GiB of memory available")
    assert built == []


def test_the_tiny_gguf_itself_still_imports(tiny_gguf, tmp_path):
    """The checks above refuse only what is wrong: the untouched file (tensors rewritten) installs."""
    store = ModelStore(tmp_path / "home")
    with store.staging("fine") as stage:
        import_gguf(rewrite(tiny_gguf, tmp_path / "same.gguf"), stage)
        store.register(stage, model_id="fine", source="test")
    assert store.has("fine")


@pytest.mark.parametrize(
    "template,match",
    [
        ("{% for i in range(100001) %}x{% endfor %}", "Range too big"),
        ("{{ 9**9999999 }}", "cannot render a plain conversation"),
        ("{% set n = 99999 %}{{ 9**n }}", "cannot render a plain conversation"),
        ("{{ raise_exception('no chats here') }}", "cannot render a plain conversation.*no chats here"),
        ("{% for m in messages %}{{ m.content", "cannot render a plain conversation"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}", "was stopped"),
    ],
)
def test_a_chat_template_that_cannot_render_a_chat_is_refused_at_import(tiny_gguf, tmp_path, template, match):
    path = rewrite(tiny_gguf, tmp_path / "tpl.gguf", fields={"tokenizer.chat_template": (template, T.STRING)})
    refused(path, tmp_path, match)


def test_a_staging_folder_left_by_a_killed_import_is_removed_by_the_next(tiny_gguf, tmp_path):
    """A process killed for memory runs no cleanup; the next install sweeps what it left,
    but never the folder of an install that is running (it holds the id's lock)."""
    store = ModelStore(tmp_path / "home")
    killed = store.models_dir / ".staging-killed"
    running = store.models_dir / ".staging-running"
    for folder in (killed, running):
        folder.mkdir(parents=True)
        (folder / "tokenizer.json").write_text("{}")
    with store._install_lock("running"):
        with store.staging("next") as stage:
            import_gguf(tiny_gguf, stage)
            store.register(stage, model_id="next", source="test")
        assert not killed.exists() and running.exists()
    assert store.has("next")
