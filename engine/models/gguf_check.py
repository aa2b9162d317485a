"""Walk a GGUF file's header before any reader trusts it.

The `gguf` package believes the counts a file states: a 52-byte file declaring a 2^62
element array made it loop while memory grew. Here every count and length is checked
against the bytes that remain before anything is read or allocated, so a damaged or
hostile file is refused in milliseconds with the offset where it goes wrong.
Layout (GGUF v2/v3): magic, version u32, tensor count u64, key/value count u64, the
key/value pairs, then per tensor: name, n_dims u32, dims u64[n], type u32, offset u64.
"""

from __future__ import annotations

import struct
from pathlib import Path

from engine.errors import GGUFImportError

# GGUF value types -> bytes per item; 8 = string, 9 = array.
SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
MAX_DIMS = 4
# The smallest a key/value pair (empty key, a u8) and a tensor entry (empty name, 1 dim) can be.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8


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

    def count(self, per_item: int, what: str) -> int:
        n = self.u64()
        if n * per_item > self.remaining():
            self.fail(f"it declares {n:,} {what}, more than its remaining {self.remaining():,} bytes can hold")
        return n


def check_gguf_structure(path: Path) -> None:
    """GGUFImportError unless every count and length in the header fits the file."""
    reader = _Reader(Path(path))
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
            reader.string()
            _skip_value(reader, reader.u32())
        after_kv = reader.fh.tell()
        reader.fh.seek(tensors_at)
        tensor_count = reader.u64()
        reader.fh.seek(after_kv)
        if tensor_count * MIN_TENSOR_BYTES > reader.remaining():
            reader.fail(f"it declares {tensor_count:,} tensors, more than the file can describe")
        for _ in range(tensor_count):
            reader.string()
            dims = reader.u32()
            if not 1 <= dims <= MAX_DIMS:
                reader.fail(f"a tensor has {dims} dimensions")
            elements = 1
            for _ in range(dims):
                elements *= reader.u64()
            if elements > reader.size * 4:  # even 2-bit weights take a quarter byte each
                reader.fail(f"a tensor of {elements:,} elements cannot fit a {reader.size:,}-byte file")
            reader.u32()
            if reader.u64() > reader.size:
                reader.fail("a tensor's data offset lies beyond the end of the file")


def _skip_value(reader: _Reader, kind: int, depth: int = 0) -> None:
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
            for _ in range(reader.count(8, "array items")):
                _skip_value(reader, item, depth + 1)
        else:
            reader.fail(f"unknown array item type {item}")
    else:
        reader.fail(f"unknown value type {kind}")
