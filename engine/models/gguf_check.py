"""Walk a GGUF file's header before any reader trusts it.

The `gguf` package believes the counts a file states: a 52-byte file declaring a 2^62
element array made it loop while memory grew. Here every count and length is checked
against the bytes that remain before anything is read or allocated, so a damaged or
hostile file is refused in milliseconds with the offset where it goes wrong.
Layout (GGUF v2/v3): magic, version u32, tensor count u64, key/value count u64, the
key/value pairs, then per tensor: name, n_dims u32, dims u64[n], type u32, offset u64;
then, at the next multiple of `general.alignment` (32), the tensors' data.

The walk also bounds what the reader and the tokenizer build will cost: the `gguf`
reader keeps about 1.7 KB of numpy views per string in an array, and a tokenizer about
0.4 KB more per token or merge. A 222 MB file of 10 million tokens passed every length
check and needed over 10 GB to import, so string arrays are refused by count (beyond any
real vocabulary) and by the memory they would take, before the reader is built.

Once the importer has a config from the metadata, `check_tensors` holds the file's tensors
to it: exactly the tensors that config needs, each of its shape (a vocabulary of one, a
zero dimension or a wrong hidden size used to install and fail at load).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from brisk.engine.api.errors import GGUFImportError


class ArchSpec(Protocol):
    """What the shape checks read of gguf_import's ArchSpec (named here, not imported: that
    module imports this one)."""

    @property
    def model_type(self) -> str: ...
    @property
    def layer_names(self) -> dict[str, str]: ...
    @property
    def biases(self) -> tuple[str, ...]: ...


# GGUF value types -> bytes per item; 8 = string, 9 = array.
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4
MAX_DIMS = 4
# The smallest a key/value pair (empty key, a u8) and a tensor entry (empty name, 1 dim) can be.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8
# GGUF caps keys at 65535 bytes; llama.cpp caps tensor names at 64 (GGML_MAX_NAME).
MAX_KEY_BYTES = 65535
MAX_TENSOR_NAME_BYTES = 256
DEFAULT_ALIGNMENT = 32
# The largest real vocabularies are 250-262k tokens (Gemma, BLOOM, XLM-R): twice that is no
# model (a million tokens took 46 s and 2.8 GB before failing). Llama-3 has 280k merges.
MAX_VOCAB = 1 << 19
MAX_MERGES = 1 << 20
# Measured on this importer: the reader's views (~1.7 KB) and the tokenizer build (~0.4 KB)
# per string of a token or merge list, rounded up.
BYTES_PER_STRING = 2304
STRING_LIMITS = {"tokenizer.ggml.tokens": ("tokens", MAX_VOCAB), "tokenizer.ggml.merges": ("merges", MAX_MERGES)}
# Any other string array (a file's own lists) is held to the larger bound too.
OTHER_STRINGS_LIMIT = MAX_MERGES


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dims: tuple[int, ...]  # GGUF order: the fastest-moving dimension first
    type_id: int
    offset: int  # from the start of the data section


@dataclass
class Header:
    """What the walk learned: string-array sizes and every tensor's place."""

    string_items: dict[str, int] = field(default_factory=dict)
    tensors: list[TensorEntry] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    data_start: int = 0
    file_size: int = 0


class _Reader:
    def __init__(self, path: Path):
        self.fh = open(path, "rb")
        self.size = path.stat().st_size
        self.name = path.name

    def remaining(self) -> int:
        return self.size - self.fh.tell()

    def fail(self, what: str):
        raise GGUFImportError(f"{self.name} is damaged or truncated (or hostile): {what} (at byte {self.fh.tell()})")

    def take(self, n: int) -> bytes:
        if n > self.remaining():
            self.fail(f"it needs {n:,} more bytes but {self.remaining():,} remain")
        return self.fh.read(n)

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def skip(self, n: int) -> None:
        if n > self.remaining():
            self.fail(f"a value of {n:,} bytes is longer than the {self.remaining():,} that remain")
        self.fh.seek(n, 1)

    def string(self) -> None:
        self.skip(self.u64())

    def text(self, limit: int, what: str) -> str:
        n = self.u64()
        if n > limit:
            self.fail(f"a {what} of {n:,} bytes (at most {limit:,})")
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"a {what} is not UTF-8 text ({raw[:40]!r})")
            raise  # unreachable: fail raises

    def count(self, per_item: int, what: str) -> int:
        n = self.u64()
        if n * per_item > self.remaining():
            self.fail(f"it declares {n:,} {what}, more than its remaining {self.remaining():,} bytes can hold")
        return n


def check_gguf_structure(path: Path) -> Header:
    """GGUFImportError unless every count and length in the header fits the file and memory."""
    reader = _Reader(Path(path))
    header = Header(file_size=reader.size)
    with reader.fh:
        if reader.take(4) != b"GGUF":
            reader.fail("no GGUF magic")
        version = reader.u32()
        if version not in (2, 3):
            reader.fail(f"GGUF version {version} is not 2 or 3")
        tensors_at = reader.fh.tell()
        reader.u64()  # tensor count, checked once the key/values are behind us
        kv_count = reader.count(MIN_KV_BYTES, "key/value pairs")
        for _ in range(kv_count):
            key = reader.text(MAX_KEY_BYTES, "key")
            kind = reader.u32()
            if key == "general.alignment" and kind == UINT32:
                header.alignment = reader.u32()
                if header.alignment == 0 or header.alignment & (header.alignment - 1):
                    reader.fail(f"general.alignment is {header.alignment}, not a power of two")
            else:
                _skip_value(reader, kind, key, header)
        _check_string_memory(reader.name, header)
        after_kv = reader.fh.tell()
        reader.fh.seek(tensors_at)
        tensor_count = reader.u64()
        reader.fh.seek(after_kv)
        if tensor_count * MIN_TENSOR_BYTES > reader.remaining():
            reader.fail(f"it declares {tensor_count:,} tensors, more than the file can describe")
        for _ in range(tensor_count):
            name = reader.text(MAX_TENSOR_NAME_BYTES, "tensor name")
            dims = reader.u32()
            if not 1 <= dims <= MAX_DIMS:
                reader.fail(f"tensor {name} has {dims} dimensions")
            shape = tuple(reader.u64() for _ in range(dims))
            elements = 1
            for n in shape:
                elements *= n
            if elements > reader.size * 4:  # even 2-bit weights take a quarter byte each
                reader.fail(f"tensor {name} of {elements:,} elements cannot fit a {reader.size:,}-byte file")
            type_id = reader.u32()
            offset = reader.u64()
            if offset > reader.size:
                reader.fail(f"tensor {name}'s data offset lies beyond the end of the file")
            header.tensors.append(TensorEntry(name, shape, type_id, offset))
        end = reader.fh.tell()
        header.data_start = end + (-end % header.alignment)
    check_tensor_data(reader.name, header)
    return header


def _skip_value(reader: _Reader, kind: int, key: str, header: Header, depth: int = 0) -> None:
    if kind in SCALAR_BYTES:
        reader.skip(SCALAR_BYTES[kind])
    elif kind == STRING:
        reader.string()
    elif kind == ARRAY:
        if depth > 2:
            reader.fail("arrays are nested too deeply")
        item = reader.u32()
        if item in SCALAR_BYTES:
            reader.skip(reader.count(SCALAR_BYTES[item], "array items") * SCALAR_BYTES[item])
        elif item in (STRING, ARRAY):
            n = reader.count(8, "array items")
            if item == STRING:
                what, limit = STRING_LIMITS.get(key, ("strings", OTHER_STRINGS_LIMIT))
                if n > limit:
                    raise GGUFImportError(
                        f"{reader.name} lists {n:,} {what} in '{key}'; no model has more than {limit:,} "
                        "(the file is damaged or hostile)"
                    )
                header.string_items[key] = header.string_items.get(key, 0) + n
            for _ in range(n):
                _skip_value(reader, item, key, header, depth + 1)
        else:
            reader.fail(f"unknown array item type {item}")
    else:
        reader.fail(f"unknown value type {kind}")


def available_memory() -> int | None:
    """Bytes the system can give without swapping (Linux MemAvailable, else free pages); None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None  # macOS has no SC_AVPHYS_PAGES: the count limits still hold


def _check_string_memory(name: str, header: Header) -> None:
    strings = sum(header.string_items.values())
    need = strings * BYTES_PER_STRING
    free = available_memory()
    if free is not None and need > free:
        raise GGUFImportError(
            f"{name} lists {strings:,} strings (its vocabulary and merges); reading them would take about "
            f"{need / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB of memory available. "
            "Close other programs, or the file is damaged or hostile."
        )


def tensor_bytes(entry: TensorEntry) -> int:
    """The bytes `entry`'s data takes for its type, or GGUFImportError for an unknown type or a
    row that does not fill the type's blocks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        kind = GGMLQuantizationType(entry.type_id)
        block, block_bytes = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise GGUFImportError(f"Tensor {entry.name} has an unknown type {entry.type_id}") from None
    if entry.dims[0] % block:
        raise GGUFImportError(
            f"Tensor {entry.name} ({kind.name}) has rows of {entry.dims[0]} values, not a multiple of its "
            f"{block}-value blocks"
        )
    elements = 1
    for n in entry.dims:
        elements *= n
    return elements // block * block_bytes


def check_tensor_data(name: str, header: Header) -> None:
    """Every tensor's data inside the file, no two overlapping, names unique, and each tensor
    sized for its type (a tensor whose data runs into the next, or leaves more than the
    alignment's padding before it, is labelled with the wrong type)."""
    seen: set[str] = set()
    spans = []
    for entry in header.tensors:
        if entry.name in seen:
            raise GGUFImportError(f"{name} has two tensors named {entry.name}")
        seen.add(entry.name)
        if entry.offset % header.alignment:
            raise GGUFImportError(f"Tensor {entry.name}'s data is not aligned to {header.alignment} bytes")
        start = header.data_start + entry.offset
        end = start + tensor_bytes(entry)
        if end > header.file_size:
            raise GGUFImportError(
                f"Tensor {entry.name}'s data ends at byte {end:,}, beyond the end of {name} ({header.file_size:,} "
                "bytes): the file is truncated or the tensor mislabelled"
            )
        spans.append((start, end, entry.name))
    spans.sort()
    for (start, end, first), (next_start, _, second) in zip(spans, spans[1:]):
        if end > next_start:
            raise GGUFImportError(f"Tensors {first} and {second} overlap in {name}: the file is damaged or hostile")
        if next_start - end >= header.alignment:
            raise GGUFImportError(
                f"Tensor {first} is {end - start:,} bytes for its type but {next_start - start:,} lie before "
                f"{second}: its type does not match its data (the file is damaged or mislabelled)"
            )


# Tensors whose values must stay exact: a norm or bias stored quantized is mislabelled.
FLOAT_TYPE_IDS = {0: "F32", 1: "F16", 28: "F64", 30: "BF16"}
# Integer tensors (I8..I64) are no weights this importer knows.
INTEGER_TYPE_IDS = {24, 25, 26, 27}


def expected_shapes(config: dict, spec: ArchSpec) -> dict[str, tuple[int, ...]]:
    """Every tensor this config needs, GGUF-named, with its shape in Hugging Face order."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config["head_dim"]
    q_rows, kv_rows = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    per_layer = {
        "attn_norm": (hidden,),
        "attn_q": (q_rows, hidden),
        "attn_k": (kv_rows, hidden),
        "attn_v": (kv_rows, hidden),
        "attn_output": (hidden, q_rows),
        "ffn_gate": (inter, hidden),
        "ffn_up": (inter, hidden),
        "ffn_down": (hidden, inter),
        "ffn_norm": (hidden,),
        "attn_q_norm": (head_dim,),
        "attn_k_norm": (head_dim,),
        "post_attention_norm": (hidden,),
        "post_ffw_norm": (hidden,),
    }
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["output.weight"] = (vocab, hidden)
    for layer in range(config["num_hidden_layers"]):
        for kind in spec.layer_names:
            shapes[f"blk.{layer}.{kind}.weight"] = per_layer[kind]
        for kind in spec.biases:
            shapes[f"blk.{layer}.{kind}.bias"] = per_layer[kind][:1]
    return shapes


def check_tensors(config: dict, spec: ArchSpec, tensors: list[TensorEntry]) -> None:
    """GGUFImportError unless the file holds exactly the tensors `config` needs, each of the
    shape and kind of type its name says, before anything is written."""
    expected = expected_shapes(config, spec)
    for entry in tensors:
        shape = tuple(reversed(entry.dims))  # GGUF lists the fastest-moving dimension first
        if entry.name not in expected:
            raise GGUFImportError(
                f"Tensor {entry.name} does not belong to this {spec.model_type} model "
                f"({config['num_hidden_layers']} layers, biases: {', '.join(spec.biases) or 'none'})"
            )
        if shape != expected[entry.name]:
            raise GGUFImportError(
                f"Tensor {entry.name} is {list(shape)} but the metadata makes it {list(expected[entry.name])}: "
                "the file's tensors do not match its metadata"
            )
        if entry.type_id in INTEGER_TYPE_IDS or (len(shape) == 1 and entry.type_id not in FLOAT_TYPE_IDS):
            raise GGUFImportError(f"Tensor {entry.name} is stored as type {entry.type_id}, which no such tensor uses")
    missing = sorted(set(expected) - {entry.name for entry in tensors})
    if missing:
        raise GGUFImportError(f"The GGUF lacks {len(missing)} tensor(s) its metadata promises (e.g. {missing[0]})")
