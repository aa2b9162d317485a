"""Write GGUF files the way llama.cpp's converter does, from a tiny mlx-lm model folder.

Used to test the importer on every architecture it claims: q/k rows permuted for
`llama`, Gemma norms stored as w + 1, tied embeddings as a missing output.weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3"}
REVERSE = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str, model_type: str) -> str:
    kind = hf.rsplit(".", 1)[1]
    stem = hf.rsplit(".", 1)[0]
    if stem == "model.embed_tokens":
        return f"token_embd.{kind}"
    if stem == "model.norm":
        return f"output_norm.{kind}"
    if stem == "lm_head":
        return f"output.{kind}"
    _, _, idx, rest = stem.split(".", 3)
    names = dict(REVERSE)
    if model_type == "gemma3_text":
        names.update(
            {
                "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm",
            }
        )
    else:
        names["post_attention_layernorm"] = "ffn_norm"
    return f"blk.{idx}.{names[rest]}.{kind}"


def write_gguf(
    model_dir: Path,
    out: Path,
    *,
    quantize_embeddings: bool = False,
    base_model: bool = False,
    uint64_metadata: dict | None = None,
    quantize_weights: str | None = None,
) -> Path:
    """base_model: no chat template and add_bos_token set, like Gemma's base GGUFs.
    quantize_weights: a GGML type name (e.g. "Q4_1"): every 2-D weight whose rows fit its blocks.
    uint64_metadata: keys (without the architecture prefix) written as given, for hostile files."""
    import gguf
    import mlx.core as mx

    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    model_type = config["model_type"]
    arch = GGUF_ARCH[model_type]
    writer = gguf.GGUFWriter(str(out), arch)
    overrides = uint64_metadata or {}
    for key, value in overrides.items():
        writer.add_key_value(f"{arch}.{key}", value, gguf.GGUFValueType.UINT64)
    writer.add_block_count(config["num_hidden_layers"])
    if "context_length" not in overrides:
        writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    if "attention.head_count" not in overrides:
        writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if model_type == "gemma3_text":
        writer.add_sliding_window(config["sliding_window"])

    vocab = {**tokenizer["model"]["vocab"], **{t["content"]: t["id"] for t in tokenizer["added_tokens"]}}
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {t["content"] for t in tokenizer["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    merges = tokenizer["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_bos_token_id(vocab["<|endoftext|>"])
    writer.add_add_bos_token(base_model)
    if not base_model:
        tc = json.loads((model_dir / "tokenizer_config.json").read_text())
        writer.add_chat_template(tc["chat_template"])

    weights = mx.load(str(model_dir / "model.safetensors"))
    for name, value in sorted(weights.items()):
        array = np.array(value.astype(mx.float32))
        if model_type == "llama" and name.endswith("q_proj.weight"):
            array = _permute(array, config["num_attention_heads"])
        elif model_type == "llama" and name.endswith("k_proj.weight"):
            array = _permute(array, config["num_key_value_heads"])
        if model_type == "gemma3_text" and "norm" in name:
            array = array + 1.0
        gname = _gguf_name(name, model_type)
        kind = gguf.GGMLQuantizationType[quantize_weights] if quantize_weights else None
        if kind is not None and array.ndim == 2 and array.shape[1] % gguf.GGML_QUANT_SIZES[kind][0] == 0:
            writer.add_tensor(gname, gguf.quants.quantize(array, kind), raw_dtype=kind)
        elif quantize_embeddings and gname == "token_embd.weight":
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gname, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
