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
from dataclasses import dataclass, field
from math import prod
from pathlib import Path

from brisk.engine.api.errors import BrokenModelFolder, UnsupportedModel

# Keys under which configs state their context window, most specific first.
CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_ctx", "context_length")
# Keys that make transformers or mlx-lm import and run Python shipped with the model
# (`auto_map` classes, mlx-lm's `model_file`): Brisk never runs code from a model folder.
REMOTE_CODE_KEYS = {
    "config.json": ("auto_map", "model_file"),
    "tokenizer_config.json": ("auto_map",),
    "processor_config.json": ("auto_map",),
    "preprocessor_config.json": ("auto_map",),
}
# No released model has a longer context than this; larger values are typos or hostile.
MAX_CONTEXT_LENGTH = 1 << 24
SAFETENSORS_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


@dataclass(frozen=True)
class FolderInfo:
    architecture: str
    parameters: int
    dtype: str
    bytes_on_disk: int
    tokenizer_fingerprint: str
    context_length: int
    has_chat_template: bool
    # Stored bits per weight, scales and float tensors included (a Q4_1-like 4-bit model: ~5).
    bits_per_weight: float = field(default=0.0, kw_only=True)  # an older catalog lacks it
    # Bytes the weights take once loaded for the CPU: float tensors at float32, quantized
    # ones as stored.
    memory_bytes: int = field(default=0, kw_only=True)


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
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise BrokenModelFolder(f"{path} has no 'model_type': cannot tell the architecture")
    if "text_config" in config and not isinstance(config["text_config"], dict):
        raise BrokenModelFolder(f"{path}: 'text_config' must be an object, not {type(config['text_config']).__name__}")
    return config


# Sizes a config states, with the largest value any real model uses rounded far up: a
# zero divides by zero deep in mlx-lm, a huge one allocates the machine away.
SIZE_LIMITS = {
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "vocab_size": 1 << 22,
    "head_dim": 1 << 12,
}


def check_config_values(config: dict) -> None:
    """BrokenModelFolder naming the first size that is not a sane whole number."""
    for source in (config, config.get("text_config") or {}):
        for key, limit in SIZE_LIMITS.items():
            value = source.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit):
                raise BrokenModelFolder(
                    f"config.json: '{key}' is {value!r}; it must be a whole number from 1 to {limit:,}"
                )
    context_length(config)


def refuse_remote_code(folder: Path) -> None:
    """BrokenModelFolder naming the key when a folder asks to run its own Python code."""
    for name, keys in REMOTE_CODE_KEYS.items():
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BrokenModelFolder(f"{path} is not valid JSON: {exc}") from exc
        found = [key for key in keys if isinstance(data, dict) and key in data]
        if found:
            raise BrokenModelFolder(
                f"{path.name} in {Path(folder).name} sets '{found[0]}': the model wants to run Python code shipped "
                "with it, which Brisk never does. Use a model that mlx-lm supports without it."
            )


def mlx_architecture(config: dict) -> str:
    """mlx-lm's module for this config, or UnsupportedModel naming the type."""
    return mlx_model_class(config).__module__.rsplit(".", 1)[-1]


def mlx_model_class(config: dict) -> type:
    """mlx-lm's Model class for this config, or UnsupportedModel naming the type."""
    from mlx_lm.utils import _get_classes  # mlx-lm's own lookup, remappings included

    try:
        model_class, args_class = _get_classes(config)
        if not (isinstance(model_class, type) and isinstance(args_class, type)):
            raise ValueError("not a model module")
    except (ValueError, ImportError, AttributeError, TypeError) as exc:  # e.g. model_type "base" or "cache"
        raise UnsupportedModel(
            f"Architecture '{config['model_type']}' is not one mlx-lm {_mlx_lm_version()} can run"
        ) from exc
    return model_class


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
    if not isinstance(header, dict):
        raise BrokenModelFolder(
            f"{path.name} has a corrupt safetensors header: a {type(header).__name__}, not an object"
        )
    header.pop("__metadata__", None)
    for name, tensor in header.items():
        if not _valid_tensor_entry(tensor):
            raise BrokenModelFolder(
                f"{path.name} has a corrupt safetensors header: tensor '{name}' lacks a valid "
                "dtype, integer shape or data_offsets"
            )
    data_end = max((t["data_offsets"][1] for t in header.values()), default=0)
    available = size - 8 - header_len
    if data_end > available:
        raise BrokenModelFolder(
            f"{path.name} is truncated: its header promises {data_end} bytes of tensors, the file holds {available}"
        )
    return header


def _valid_tensor_entry(tensor) -> bool:
    def ints(value, n=None):
        return (
            isinstance(value, list)
            and (n is None or len(value) == n)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        )

    return (
        isinstance(tensor, dict)
        and tensor.get("dtype") in SAFETENSORS_BYTES
        and ints(tensor.get("shape"))
        and ints(tensor.get("data_offsets"), 2)
        and tensor["data_offsets"][0] <= tensor["data_offsets"][1]
    )


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
            value = source.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_CONTEXT_LENGTH:
                raise BrokenModelFolder(
                    f"config.json: '{key}' is {value!r}; a context length is a whole number "
                    f"of tokens from 1 to {MAX_CONTEXT_LENGTH:,}"
                )
            return value
    return 4096  # mlx-lm's models assume nothing; this is a conservative guess, stated in `models list`


@dataclass
class WeightCount:
    """Parameters and bytes of a folder's tensors, quantized ones counted by their bits."""

    parameters: int = 0
    stored_bytes: int = 0
    memory_bytes: int = 0
    dtypes: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, tensors: list[tuple[str, dict]], quant: dict) -> "WeightCount":
        count = cls()
        packed = {name[: -len(".weight")] for name, t in tensors if t["dtype"] == "U32" and name.endswith(".weight")}
        for name, tensor in tensors:
            n = prod(tensor["shape"])
            nbytes = n * SAFETENSORS_BYTES[tensor["dtype"]]
            module, _, kind = name.rpartition(".")
            count.stored_bytes += nbytes
            count.dtypes[tensor["dtype"]] += n
            if module in packed and kind == "weight":
                override = quant.get(module)
                bits = (override if isinstance(override, dict) else quant).get("bits") or 4
                count.parameters += n * 32 // bits
                count.memory_bytes += nbytes
            elif module in packed and kind in ("scales", "biases"):
                count.memory_bytes += nbytes  # the quantizer's own numbers, not parameters
            else:
                count.parameters += n
                float_tensor = tensor["dtype"] in ("F64", "F32", "F16", "BF16")
                count.memory_bytes += n * 4 if float_tensor else nbytes
        return count


def inspect_folder(folder: Path) -> FolderInfo:
    """Verify a model folder and describe it. Raises BrokenModelFolder/UnsupportedModel."""
    folder = Path(folder)
    config = read_config(folder)
    refuse_remote_code(folder)
    check_config_values(config)
    architecture = mlx_architecture(config)
    fingerprint = tokenizer_fingerprint(folder)
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise BrokenModelFolder(f"{folder} has no *.safetensors weights")
    quant = config.get("quantization") or {}
    if not isinstance(quant, dict) or quant.get("bits") not in (None, 2, 3, 4, 5, 6, 8):
        raise BrokenModelFolder(f"{folder.name}/config.json: 'quantization' must give bits of 2-8, not {quant!r}")
    tensors = [t for shard in shards for t in read_safetensors_header(shard).items()]
    weights = WeightCount.of(tensors, quant)
    index_file = folder / "model.safetensors.index.json"
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text()).get("weight_map", {})
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError("'weight_map' must map tensor names to file names")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, ValueError) as exc:
            raise BrokenModelFolder(f"{index_file.name} is corrupt: {exc}") from exc
        missing = sorted(set(weight_map.values()) - {s.name for s in shards})
        if missing:
            raise BrokenModelFolder(f"{folder} is missing weight shards: {', '.join(missing)}")
    total_bytes = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    return FolderInfo(
        architecture=architecture,
        parameters=weights.parameters,
        dtype=f"q{quant['bits']}" if quant.get("bits") else weights.dtypes.most_common(1)[0][0].lower(),
        bytes_on_disk=total_bytes,
        tokenizer_fingerprint=fingerprint,
        context_length=context_length(config),
        has_chat_template=has_chat_template(folder),
        bits_per_weight=round(8 * weights.stored_bytes / max(weights.parameters, 1), 2),
        memory_bytes=weights.memory_bytes,
    )
