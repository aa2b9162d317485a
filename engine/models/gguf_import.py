"""Import a GGUF file (llama.cpp / LM Studio / Ollama format) into an MLX model folder.

Quantized weights stay quantized in MLX's affine format (engine/models/gguf_quant.py says
which GGUF type goes where); float tensors are saved as float32. Tensors are read with the
`gguf` package (it reads every quant type in numpy; `mx.load` fails on some, e.g. Q5_0)
and renamed to Hugging Face names. The tokenizer is rebuilt from the
GGUF metadata with transformers' GGUF tokenizer builder, which needs no torch.

Quirks handled (llama.cpp's converter, convert_hf_to_gguf.py):
- `llama` q/k projections are row-permuted for llama.cpp's rotary layout: undone here.
- Gemma norm weights are stored as `w + 1` (HF stores `w`, the model adds 1): subtract 1.
- No `output.weight` means tied embeddings.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from brisk.engine.api.errors import BriskError, BrokenModelFolder, GGUFImportError
from brisk.engine.models import gguf_quant
from brisk.engine.models.folder import check_config_values
from brisk.engine.models.gguf_check import MAX_VOCAB, check_gguf_structure, check_tensors
from brisk.engine.models.gguf_quant import Report

log = logging.getLogger(__name__)

# Tokens that end an assistant turn in the chat templates we know; when the template
# uses one, generation must stop on it even if the GGUF's eos_token_id says otherwise.
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>")

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class ArchSpec:
    model_type: str  # mlx-lm's module name
    layer_names: dict[str, str]
    unpermute_qk: bool = False
    norms_plus_one: bool = False
    biases: tuple[str, ...] = ()  # the layer tensors that have a bias (mlx-lm's model sets which)


ARCHITECTURES = {
    "llama": ArchSpec("llama", _LAYER_NAMES, unpermute_qk=True),
    "qwen2": ArchSpec("qwen2", _LAYER_NAMES, biases=("attn_q", "attn_k", "attn_v")),
    "gemma3": ArchSpec("gemma3_text", _GEMMA3_LAYER_NAMES, norms_plus_one=True),
}


class _Metadata:
    """Typed access to a GGUFReader's key/value fields: a value of the wrong type or range is
    a GGUFImportError naming the key, never a ValueError from deep inside the import."""

    def __init__(self, reader):
        self._fields = reader.fields

    def get(self, key: str, default=None):
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except UnicodeDecodeError as exc:
            raise GGUFImportError(
                f"GGUF metadata '{key}' holds text that is not UTF-8 (bytes {exc.object[exc.start : exc.end]!r}); "
                "the file is damaged or was written wrongly"
            ) from None
        except (ValueError, IndexError, TypeError) as exc:
            raise GGUFImportError(f"GGUF metadata '{key}' cannot be read: {exc}") from None

    def has(self, key: str) -> bool:
        return key in self._fields

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise GGUFImportError(f"GGUF metadata lacks '{key}'; the file is incomplete or not a model")
        return value

    def whole(self, key: str, default: int | None = None) -> int:
        """An integer-typed value (a string, float or bool is refused, not converted)."""
        value = self.require(key) if default is None else self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise GGUFImportError(f"GGUF metadata '{key}' is {_shown(value)}, not a whole number")
        return value

    def positive(self, key: str, default: float | None = None) -> float:
        """A finite number above zero (epsilons, RoPE bases and factors)."""
        value = self.require(key) if default is None else self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise GGUFImportError(f"GGUF metadata '{key}' is {_shown(value)}; it must be a finite number above 0")
        return float(value)

    def text(self, key: str) -> str | None:
        value = self.get(key)
        if value is not None and not isinstance(value, str):
            raise GGUFImportError(f"GGUF metadata '{key}' is {_shown(value)}, not text")
        return value


def _shown(value) -> str:
    text = repr(value)
    return f"{text[:60]}... ({type(value).__name__})" if len(text) > 60 else f"{text} ({type(value).__name__})"


def open_gguf(path: Path):
    """The `gguf` reader over `path` and the header facts checked before it was built."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise GGUFImportError(f"No such file: {path}")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise GGUFImportError(f"{path.name} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    header = check_gguf_structure(path)  # the reader trusts stated counts; a hostile file must not reach it
    try:
        return gguf.GGUFReader(str(path)), header
    except MemoryError:
        raise GGUFImportError(f"{path.name}'s metadata does not fit in the memory available") from None
    except Exception as exc:  # the reader raises bare ValueError/IndexError on damage
        raise GGUFImportError(f"{path.name} is damaged or truncated: {exc}") from exc


def build_config(meta: _Metadata, arch: str, spec: ArchSpec, tensor_names: set[str]) -> dict:
    hidden = meta.whole(f"{arch}.embedding_length")
    heads = meta.whole(f"{arch}.attention.head_count")
    kv_heads = meta.whole(f"{arch}.attention.head_count_kv", heads)
    tokens = meta.require("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise GGUFImportError("GGUF metadata 'tokenizer.ggml.tokens' is not a list of text tokens")
    if not 2 <= len(tokens) <= MAX_VOCAB:
        raise GGUFImportError(f"The GGUF's vocabulary has {len(tokens):,} tokens; a model needs 2 to {MAX_VOCAB:,}")
    eps = meta.positive(f"{arch}.attention.layer_norm_rms_epsilon")
    config = {
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": meta.whole(f"{arch}.block_count"),
        "intermediate_size": meta.whole(f"{arch}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": meta.whole(f"{arch}.attention.key_length", hidden // heads if heads > 0 else 1),
        "rms_norm_eps": eps,
        "vocab_size": len(tokens),
        "max_position_embeddings": meta.whole(f"{arch}.context_length"),
        "rope_theta": meta.positive(f"{arch}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    scaling = meta.text(f"{arch}.rope.scaling.type")
    if "rope_freqs.weight" in tensor_names:
        raise GGUFImportError("Llama-3-style rope frequency tables (rope_freqs) are not supported yet")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": meta.positive(f"{arch}.rope.scaling.factor")}
    elif scaling not in (None, "none"):
        raise GGUFImportError(f"RoPE scaling '{scaling}' in a GGUF is not supported yet")
    try:
        check_config_values(config)
    except BrokenModelFolder as exc:
        raise GGUFImportError(f"GGUF metadata is not usable: {exc}".replace("config.json: ", "")) from exc
    if eps >= 1:
        raise GGUFImportError(f"GGUF metadata: an RMS norm epsilon of {eps} is not a small number")
    if heads % kv_heads:
        raise GGUFImportError(
            f"GGUF metadata: {heads} attention heads cannot be shared among {kv_heads} key/value heads "
            "(the heads must be a multiple of the key/value heads)"
        )
    if not meta.has(f"{arch}.attention.key_length") and hidden % heads:
        raise GGUFImportError(f"GGUF metadata: a hidden size of {hidden} does not split into {heads} heads")
    if arch == "gemma3":
        # Gemma-3 facts llama.cpp hard-codes rather than storing (see shared/MODELS.md).
        window = meta.whole("gemma3.attention.sliding_window", 512)
        pattern = meta.whole("gemma3.attention.sliding_window_pattern", 6)
        config.update(
            sliding_window=window,
            sliding_window_pattern=pattern,
            rope_local_base_freq=10000.0,
            query_pre_attn_scalar=config["head_dim"],
        )
        if window < 1 or pattern < 1:
            raise GGUFImportError("GGUF metadata: Gemma-3's sliding window and its pattern must be above 0")
    return config


def _unpermute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp interleaves each head's rotary halves; restore HF's (half, half) order.
    rows = weight.shape[0]
    return (
        weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:])  # (H, D/2, 2, ...)
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def hf_name(gguf_name: str, spec: ArchSpec) -> str:
    stem, _, kind = gguf_name.rpartition(".")  # kind: weight | bias
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in spec.layer_names:
        return f"model.layers.{parts[1]}.{spec.layer_names[parts[2]]}.{kind}"
    raise GGUFImportError(f"Unexpected tensor '{gguf_name}' for a {spec.model_type} model")


def convert_tensors(
    reader,
    config: dict,
    spec: ArchSpec,
    progress: Callable[[int, int], None],
    *,
    keep_quantized: bool = True,
    report: Report | None = None,
):
    """HF-named mx arrays, one tensor at a time (no float32 copy of the whole model).

    With `keep_quantized`, quantized GGUF tensors become MLX affine-quantized ones
    (engine/models/gguf_quant.py) and `config["quantization"]` says which bits each took;
    without, everything is dequantized to float32 (the old behaviour, for comparisons).
    """
    import mlx.core as mx
    from gguf.quants import dequantize

    weights, bits_of = {}, {}
    report = report if report is not None else Report()
    total = len(reader.tensors)
    for i, tensor in enumerate(reader.tensors):
        name = hf_name(tensor.name, spec)
        kind = tensor.tensor_type.name
        try:
            if keep_quantized:
                result = gguf_quant.convert(tensor, dequantize)
            else:
                result = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except Exception as exc:
            raise GGUFImportError(f"Cannot convert {tensor.name} ({kind}): {exc}") from exc
        report.add(kind, gguf_quant.outcome(kind, result))
        if spec.unpermute_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            result = gguf_quant.permute_rows(result, lambda a, h=heads: _unpermute(a, h))
        if isinstance(result, gguf_quant.Quantized):
            module = name[: -len(".weight")]
            weights[name] = mx.array(result.weight)
            weights[f"{module}.scales"] = mx.array(result.scales)
            weights[f"{module}.biases"] = mx.array(result.biases)
            bits_of[module] = result.bits
        else:
            if spec.norms_plus_one and "norm" in name:
                result = result - 1.0
            weights[name] = mx.array(result)
        progress(i + 1, total)
    if bits_of:
        config["quantization"] = quantization_config(bits_of)
    return weights


def quantization_config(bits_of: dict[str, int]) -> dict:
    """mlx-lm's `quantization` entry: the commonest bits as the default, the rest per layer."""
    default = Counter(bits_of.values()).most_common(1)[0][0]
    entry: dict = {"group_size": gguf_quant.GROUP, "bits": default, "mode": "affine"}
    for module, bits in sorted(bits_of.items()):
        if bits != default:
            entry[module] = {"group_size": gguf_quant.GROUP, "bits": bits, "mode": "affine"}
    return entry


def write_tokenizer(reader, meta: _Metadata, arch: str, dest: Path) -> dict:
    """Rebuild tokenizer.json/tokenizer_config.json; returns extra config (eos ids)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tokens = list(meta.require("tokenizer.ggml.tokens"))
    ids = {key: _token_id(meta, key, len(tokens)) for key in TOKEN_ID_KEYS}
    template = meta.text("tokenizer.chat_template")
    if template:
        bos_id, eos_id = ids["bos_token_id"], ids["eos_token_id"]
        check_chat_template(
            template,
            bos=tokens[bos_id] if bos_id is not None else None,
            eos=tokens[eos_id] if eos_id is not None else None,
            name=str(meta.text("general.name") or "the GGUF"),
        )
    tokenizer_dict = {
        "tokenizer_type": meta.text("tokenizer.ggml.model"),
        "pre_tokenizer_type": meta.text("tokenizer.ggml.pre"),
        "tokens": tokens,
        "token_type": meta.get("tokenizer.ggml.token_type"),
        "scores": meta.get("tokenizer.ggml.scores"),
        "bos_token_id": ids["bos_token_id"],
        "eos_token_id": ids["eos_token_id"],
        "unk_token_id": ids["unknown_token_id"],
        "pad_token_id": ids["padding_token_id"],
    }
    merges = meta.get("tokenizer.ggml.merges")
    if merges is not None:
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise GGUFImportError("GGUF metadata 'tokenizer.ggml.merges' is not a list of text merges")
        tokenizer_dict["merges"] = merges
    try:
        backend, _ = convert_gguf_tokenizer(arch, {k: v for k, v in tokenizer_dict.items() if v is not None})
    except Exception as exc:  # MemoryError included: the header bound makes it unlikely, not impossible
        raise GGUFImportError(f"Cannot rebuild the tokenizer from GGUF metadata: {exc}") from exc

    def token(key):
        idx = ids[key]
        return tokens[idx] if idx is not None else None

    bos = token("bos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    if template and bos and bos in template:
        add_bos = False  # the template writes BOS itself: adding it again would double it
    if add_bos and bos:
        # Fast tokenizers add BOS only through a post-processor; without it a base model
        # like Gemma sees no <bos> and degenerates ("The The The...").
        from tokenizers import processors

        bos_id = tokens.index(bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, bos_id)]
        )
    backend.save(str(dest / "tokenizer.json"))
    eos = ids["eos_token_id"]
    ends = {eos} if eos is not None else set()
    for name in END_OF_TURN_TOKENS:
        if template and name in template and name in tokens:
            ends.add(tokens.index(name))
    eos_ids = sorted(ends)
    eos_token = tokens[eos_ids[-1]] if eos_ids else None
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos_token,
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{arch}.context_length", 0) or 0) or None,
    }
    if template:
        tokenizer_config["chat_template"] = template
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return {"eos_token_id": eos_ids} if eos_ids else {}


# A plain exchange every chat template must render, as the first chat will.
SAMPLE_CHAT = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "Say something."},
]


@dataclass(frozen=True)
class _TemplateOnly:
    """What engine/turn/chat_template.py reads of a tokenizer, before the tokenizer exists."""

    template: str
    special_tokens_map: dict[str, str]

    def get_chat_template(self) -> str:
        return self.template


def check_chat_template(template: str, *, bos: str | None, eos: str | None, name: str) -> None:
    """GGUFImportError unless the GGUF's chat template renders SAMPLE_CHAT as a chat will
    (engine/turn/chat_template.py's bounded sandbox and time budget): a template that cannot
    (a range beyond the sandbox's limit, `9**9999999`, an error it raises) would install a
    model that fails at its first message."""
    from brisk.engine.turn.chat_template import render_chat

    specials = {key: value for key, value in (("bos_token", bos), ("eos_token", eos)) if value is not None}
    try:
        render_chat(_TemplateOnly(template, specials), SAMPLE_CHAT, model_id=name)
    except Exception as exc:  # whatever the template does wrong, said in one line
        reason = str(exc) if isinstance(exc, BriskError) else f"{type(exc).__name__}: {exc}"
        raise GGUFImportError(
            f"The GGUF's chat template cannot render a plain conversation, so the model could not chat: {reason[:300]}"
        ) from None


TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")


def _token_id(meta: _Metadata, key: str, vocab: int) -> int | None:
    """`tokenizer.ggml.<key>` as an index into the vocabulary, or None when absent. An id past
    the vocabulary is ignored, as llama.cpp does (some converters write one for a missing
    pad token); one that is not a whole number is a damaged file."""
    value = meta.get(f"tokenizer.ggml.{key}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise GGUFImportError(f"GGUF metadata 'tokenizer.ggml.{key}' is {_shown(value)}, not a token id")
    if not 0 <= value < vocab:
        log.warning(
            "GGUF metadata 'tokenizer.ggml.%s' is %d, outside the %d-token vocabulary: ignored", key, value, vocab
        )
        return None
    return value


def import_gguf(
    path: Path, dest: Path, *, progress: Callable[[int, int], None] | None = None, keep_quantized: bool = True
) -> dict:
    """Convert `path` into the (empty, existing) folder `dest`; returns the config written.

    Quantized tensors stay quantized unless `keep_quantized` is False (float32, as before).
    """
    reader, header = open_gguf(path)
    meta = _Metadata(reader)
    arch = meta.text("general.architecture")
    spec = ARCHITECTURES.get(arch or "")
    if arch is None or spec is None:
        raise GGUFImportError(
            f"GGUF architecture '{arch}' is not supported for import (supported: {', '.join(sorted(ARCHITECTURES))})"
        )
    config = build_config(meta, arch, spec, {t.name for t in header.tensors})
    check_tensors(config, spec, header.tensors)  # before anything is written
    try:
        return _write_model(reader, meta, arch, spec, config, Path(path), dest, progress, keep_quantized)
    except OSError as exc:  # a full disk above all: one line, and the caller's staging is removed
        from brisk.engine.models.download import disk_error

        raise GGUFImportError(str(disk_error(exc, f"writing the model into {dest}"))) from exc


def _write_model(reader, meta, arch, spec, config, path: Path, dest: Path, progress, keep_quantized: bool) -> dict:
    config.update(write_tokenizer(reader, meta, arch, dest))
    report = Report()
    weights = convert_tensors(
        reader, config, spec, progress or (lambda *_: None), keep_quantized=keep_quantized, report=report
    )
    for line in report.lines():
        log.info("%s: %s", path.name, line)
    import mlx.core as mx

    mx.save_safetensors(str(dest / "model.safetensors"), weights)
    config["brisk_source"] = {"gguf": path.name, "name": meta.get("general.name"), "tensors": report.lines()}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return config
