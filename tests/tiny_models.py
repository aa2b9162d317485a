"""Tiny random-weight model folders built from mlx-lm's own model classes.

Each folder is a complete MLX model folder (config.json, model.safetensors, a real
byte-level BPE tokenizer trained on a small corpus, ChatML chat template), so it goes
through exactly the code paths a downloaded model does, in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Zażółć gęślą jaźń, w Warszawie.",
    "def main():\n\treturn 42  # code with tabs and    spaces\n",
    "東京は日本の首都です。 Emoji: 🙂🚀 numbers 1234567890 and more text.",
] * 20

BASE_CONFIGS = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": 32,
        "sliding_window": 16,
        "sliding_window_pattern": 6,
    },
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    # sliding-window + full layers, YaRN RoPE, attention sinks, MoE
    "gpt_oss": {
        "model_type": "gpt_oss",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 16,
        "rope_theta": 150000,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 128,
        },
    },
    # hybrid SSM: Mamba-2 layers, attention without RoPE, MLP
    "nemotron_h": {
        "model_type": "nemotron_h",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": ["M", "*", "-", "M", "*"],
        "tie_word_embeddings": False,
    },
}


def write_tokenizer(folder: Path, vocab_size: int = 384) -> int:
    """Train a byte-level BPE; returns the real vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "chat_template": CHATML,
                "clean_up_tokenization_spaces": False,
                "add_bos_token": False,
            }
        )
    )
    return tok.get_vocab_size()


def make_tiny_model(
    folder: Path,
    arch: str = "llama",
    *,
    seed: int = 0,
    context_length: int = 512,
    tokenizer_vocab: int = 384,
    quantize: int | None = None,
    **overrides,
) -> Path:
    """A random-weight model folder; `quantize=4`, 5 or 8 stores it as mlx-lm quantizes (groups of 32)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import _get_classes

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder, tokenizer_vocab)
    config = {
        **BASE_CONFIGS[arch],
        "vocab_size": vocab,
        "max_position_embeddings": context_length,
        "eos_token_id": 2,
        **overrides,
    }
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    # Larger-than-default init so greedy outputs vary with the prompt (not one repeated token).
    weights = {k: v * 4 if v.ndim == 2 else v for k, v in tree_flatten(model.parameters())}
    if quantize:
        model.update(tree_unflatten(list(weights.items())))
        nn.quantize(model, group_size=32, bits=quantize)  # mlx-lm's predicate: layers whose sizes fit
        weights = dict(tree_flatten(model.parameters()))
        config["quantization"] = {"group_size": 32, "bits": quantize}
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def make_tiny_model_by_key(folder: Path, key: str, **kwargs) -> Path:
    """`key` is an architecture, or one with its weights quantized: "llama-q4", "qwen2-q5", "qwen3-q8"."""
    arch, _, bits = key.partition("-q")
    return make_tiny_model(folder, arch, quantize=int(bits) if bits else None, **kwargs)
