"""Inspect an MLX model folder without loading it: verify it and describe it.

Verification reads only metadata (config.json, safetensors headers, tokenizer files),
so a broken folder is reported by name in milliseconds instead of failing deep inside
mlx-lm with a KeyError.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from dataclasses import dataclass
from math import prod
from pathlib import Path

from engine.errors import BrokenModelFolder, UnsupportedModel

# Keys under which configs state their context window, most specific first.
CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_ctx", "context_length")
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
                     "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class FolderInfo:
    architecture: str
    parameters: int
    dtype: str
    bytes_on_disk: int
    tokenizer_fingerprint: str
    context_length: int
    has_chat_template: bool


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not folder.is_dir():
        raise BrokenModelFolder(f"Model folder {folder} does not exist")
    if not path.is_file():
        raise BrokenModelFolder(f"{folder} has no config.json: not a model folder")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BrokenModelFolder(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise BrokenModelFolder(f"{path} has no 'model_type': cannot tell the architecture")
    return config


def mlx_architecture(config: dict) -> str:
    """mlx-lm's module for this config, or UnsupportedModel naming the type."""
    from mlx_lm.utils import _get_classes  # mlx-lm's own lookup, remappings included

    try:
        model_class, _ = _get_classes(config)
    except ValueError as exc:
        raise UnsupportedModel(
            f"Architecture '{config['model_type']}' is not one mlx-lm {_mlx_lm_version()} can run"
        ) from exc
    return model_class.__module__.rsplit(".", 1)[-1]


def _mlx_lm_version() -> str:
    from importlib.metadata import version

    return version("mlx-lm")


def read_safetensors_header(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise BrokenModelFolder(f"{path.name} is truncated ({size} bytes): no safetensors header")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > min(size - 8, 100 << 20):
            raise BrokenModelFolder(f"{path.name} is not a valid safetensors file (header length {header_len})")
        try:
            header = json.loads(fh.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BrokenModelFolder(f"{path.name} has a corrupt safetensors header: {exc}") from exc
    header.pop("__metadata__", None)
    data_end = max((t["data_offsets"][1] for t in header.values()), default=0)
    available = size - 8 - header_len
    if data_end > available:
        raise BrokenModelFolder(
            f"{path.name} is truncated: its header promises {data_end} bytes of tensors, the file holds {available}"
        )
    return header


def tokenizer_fingerprint(folder: Path) -> str:
    """sha256 over vocab + merges (+ added tokens): equal fingerprints mean interchangeable token ids."""
    tj = folder / "tokenizer.json"
    if tj.is_file():
        try:
            data = json.loads(tj.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BrokenModelFolder(f"{tj} is not valid JSON: {exc}") from exc
        model = data.get("model") or {}
        key = {
            "vocab": model.get("vocab"),
            "merges": model.get("merges"),
            "added": sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or []),
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    sp = folder / "tokenizer.model"
    if sp.is_file():
        return hashlib.sha256(sp.read_bytes()).hexdigest()[:16]
    raise BrokenModelFolder(f"{folder} has no tokenizer (tokenizer.json or tokenizer.model missing)")


def has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        try:
            return bool(json.loads(tc.read_text()).get("chat_template"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BrokenModelFolder(f"{tc} is not valid JSON: {exc}") from exc
    return False


def context_length(config: dict) -> int:
    text = config.get("text_config") or {}
    for key in CONTEXT_KEYS:
        for source in (config, text):
            if isinstance(source.get(key), int) and source[key] > 0:
                return source[key]
    return 4096  # mlx-lm's models assume nothing; this is a conservative guess, stated in `models list`


def inspect_folder(folder: Path) -> FolderInfo:
    """Verify a model folder and describe it. Raises BrokenModelFolder/UnsupportedModel."""
    folder = Path(folder)
    config = read_config(folder)
    architecture = mlx_architecture(config)
    fingerprint = tokenizer_fingerprint(folder)
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise BrokenModelFolder(f"{folder} has no *.safetensors weights")
    params, dtypes, size = 0, Counter(), 0
    for shard in shards:
        for tensor in read_safetensors_header(shard).values():
            count = prod(tensor["shape"])
            params += count
            dtypes[tensor["dtype"]] += count
        size += shard.stat().st_size
    if (folder / "model.safetensors.index.json").is_file():
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        missing = sorted(set(index.get("weight_map", {}).values()) - {s.name for s in shards})
        if missing:
            raise BrokenModelFolder(f"{folder} is missing weight shards: {', '.join(missing)}")
    quant = config.get("quantization") or {}
    if quant.get("bits"):
        # Packed uint32 words hold 32/bits weights each.
        params = sum(
            count * (32 // quant["bits"] if dtype == "U32" else 1) for dtype, count in dtypes.items()
        )
    total_bytes = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    return FolderInfo(
        architecture=architecture,
        parameters=params,
        dtype=f"q{quant['bits']}" if quant.get("bits") else dtypes.most_common(1)[0][0].lower(),
        bytes_on_disk=total_bytes,
        tokenizer_fingerprint=fingerprint,
        context_length=context_length(config),
        has_chat_template=has_chat_template(folder),
    )
