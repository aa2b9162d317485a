"""A random-weight GGUF at a real model's shapes, for speed tests of models we cannot download.

`python -m brisk.bench.random_gguf OUT.gguf` writes a 7B-class `llama` (32 layers, hidden 4096,
32 heads, 8 KV heads, FFN 14336, vocab 32000: Mistral-7B's shapes) with
every matrix quantized by the `gguf` package's own Q4_0 quantizer, about 4 GB. Brisk imports it
(`brisk models import-gguf`) and llama.cpp loads it, so `brisk bench peers --gguf OUT.gguf`
compares the two on the bytes a 7B model streams per token. The text it writes is noise; the
speed is a real model's.

- Tokenizer: a real byte-level BPE cut to the vocabulary size (its first ids and the merges
  among them), taken from an installed model's tokenizer.json (default: the bundled SmolLM2),
  with that model's ChatML template, so prompts tokenize as in a real model.
- Weights: N(0, 0.02) matrices, norms of ones. One random set of layer weights is quantized
  and written for every layer (`--distinct-layers` draws each; the file is the same size and
  each layer is its own bytes on disk and in memory either way): quantizing 7 billion values
  in numpy takes ~10 minutes on two cores, one layer ~15 s.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shapes:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 14336
    vocab: int = 32000
    context: int = 8192
    rope_theta: float = 1000000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


PRESETS = {
    "7b": Shapes(),
    # A few MB with the same structure: what the tests write.
    "tiny": Shapes(layers=2, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1024, context=2048),
}


def cut_tokenizer(tokenizer: dict, vocab_size: int) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """A byte-level BPE cut to its first `vocab_size` ids: (tokens, token types, merges, ids).
    BPE ids follow merge order, so the first ids keep the first merges; a merge is kept when
    both its parts and its result are kept."""
    vocab = {**tokenizer["model"]["vocab"], **{t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}}
    kept = {token: i for token, i in vocab.items() if i < vocab_size}
    if sorted(kept.values()) != list(range(vocab_size)):
        raise ValueError(f"the tokenizer's ids 0..{vocab_size - 1} are not all used: cannot cut it to that size")
    tokens = [token for token, _ in sorted(kept.items(), key=lambda item: item[1])]
    specials = {t["content"] for t in tokenizer.get("added_tokens", []) if t.get("special", True)}
    merges = []
    for merge in tokenizer["model"]["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if left in kept and right in kept and left + right in kept:
            merges.append(f"{left} {right}")
    return tokens, [3 if t in specials else 1 for t in tokens], merges, kept


def default_tokenizer_folder() -> Path:
    from brisk.engine.models.store import ModelStore

    return ModelStore().path("smollm2-135m-instruct")


def _random(rng: np.random.Generator, rows: int, columns: int) -> np.ndarray:
    return rng.standard_normal((rows, columns), dtype=np.float32) * np.float32(0.02)


def write_random_gguf(
    out: Path, shapes: Shapes, tokenizer_folder: Path, *, distinct_layers: bool = False, seed: int = 0, log=print
) -> Path:
    import gguf

    tokenizer = json.loads((tokenizer_folder / "tokenizer.json").read_text())
    template = json.loads((tokenizer_folder / "tokenizer_config.json").read_text()).get("chat_template")
    tokens, types, merges, ids = cut_tokenizer(tokenizer, shapes.vocab)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(f"random-llama-{shapes.layers}x{shapes.hidden}")
    writer.add_block_count(shapes.layers)
    writer.add_context_length(shapes.context)
    writer.add_embedding_length(shapes.hidden)
    writer.add_feed_forward_length(shapes.ffn)
    writer.add_head_count(shapes.heads)
    writer.add_head_count_kv(shapes.kv_heads)
    writer.add_rope_dimension_count(shapes.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(shapes.rope_theta)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for name, add in (("<|im_end|>", writer.add_eos_token_id), ("<|endoftext|>", writer.add_bos_token_id)):
        if name in ids:
            add(ids[name])
    writer.add_add_bos_token(False)
    if template:
        writer.add_chat_template(template)

    q4_0 = gguf.GGMLQuantizationType.Q4_0
    rng = np.random.default_rng(seed)

    def quantized(rows: int, columns: int) -> np.ndarray:
        return gguf.quants.quantize(_random(rng, rows, columns), q4_0)

    h, kv = shapes.hidden, shapes.kv_heads * shapes.head_dim
    matrices = {  # GGUF name: (rows, columns) as numpy holds them (out_features, in_features)
        "attn_q": (h, h),
        "attn_k": (kv, h),
        "attn_v": (kv, h),
        "attn_output": (h, h),
        "ffn_gate": (shapes.ffn, h),
        "ffn_up": (shapes.ffn, h),
        "ffn_down": (h, shapes.ffn),
    }
    ones = np.ones(h, dtype=np.float32)
    log(f"quantizing the embeddings and the output ({shapes.vocab} x {h}, Q4_0)")
    writer.add_tensor("token_embd.weight", quantized(shapes.vocab, h), raw_dtype=q4_0)
    shared = None
    for layer in range(shapes.layers):
        if distinct_layers or shared is None:
            log(f"quantizing layer {layer}" + ("" if distinct_layers else f" (written for all {shapes.layers})"))
            shared = {name: quantized(*shape) for name, shape in matrices.items()}
        for name, data in shared.items():
            writer.add_tensor(f"blk.{layer}.{name}.weight", data, raw_dtype=q4_0)
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", ones)
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", quantized(shapes.vocab, h), raw_dtype=q4_0)
    log(f"writing {out}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m brisk.bench.random_gguf", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write (about 4 GB for 7b: not inside the repository)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="7b")
    parser.add_argument(
        "--tokenizer-from", type=Path, help="a model folder with tokenizer.json (default: installed SmolLM2)"
    )
    parser.add_argument("--distinct-layers", action="store_true", help="draw every layer's weights (slow)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = args.tokenizer_from or default_tokenizer_folder()
    if not (folder / "tokenizer.json").is_file():
        print(
            f"error: no tokenizer.json in {folder} (brisk models install-bundled smollm2-135m-instruct, "
            "or pass --tokenizer-from)",
            file=sys.stderr,
        )
        return 2
    write_random_gguf(
        args.out,
        PRESETS[args.preset],
        folder,
        distinct_layers=args.distinct_layers,
        seed=args.seed,
        log=lambda message: print(message, file=sys.stderr),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
