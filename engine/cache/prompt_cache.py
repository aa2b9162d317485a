"""A model's prompt cache and everything that must stay true about it, in one object.

mlx-lm's per-layer caches hold keys and values; what they *stand for* (which tokens, at
which precision, at which RoPE positions after a sparse prefill) used to be tracked beside
them in three places. Here it lives with the layers:

- `tokens`: the tokens the layers hold, in order.
- `mode`: (k_bits, v_bits, kv_group_size) the layers were built with; another mode starts over.
- the position map of a sparse prefill: from token `dense_from` on, RoPE position =
  cache slot + `shift` (+ `layer_shifts[i]` in layer i, after UniPrefill, whose later
  layers hold fewer slots than its earlier ones); no rewinding into the sparse region.

Target and draft both use it; reuse, trim and reset are written once, here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterator


class PromptCache:
    def __init__(self, model):
        self.model = model  # the mlx-lm model whose layers these are
        self.layers: list | None = None
        self.tokens: list[int] = []
        self.mode: tuple | None = None
        self.shift = 0
        self.layer_shifts: list[int] | None = None
        self.dense_from = 0

    def __len__(self) -> int:
        return len(self.tokens)

    # --- what the cache holds ------------------------------------------------------

    def common_prefix(self, tokens: list[int]) -> int:
        common = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            common += 1
        return common

    def reset(self) -> None:
        """Forget everything (the next prefill starts from token 0)."""
        self.layers, self.tokens, self.mode = None, [], None
        self.shift = self.dense_from = 0
        self.layer_shifts = None

    def drop_sparse(self) -> None:
        """Forget a sparsely prefilled region (and what follows it): the next prefill reads
        every token."""
        if self.dense_from:
            mode = self.mode
            self.reset()
            self.mode = mode

    def ensure_mode(self, mode: tuple) -> None:
        """A cache of another KV precision cannot be reused: start over in `mode`."""
        if self.mode != mode:
            self.reset()
            self.mode = mode

    def trim_to(self, keep: int, *, checkpoint=None) -> None:
        """Hold only the first `keep` tokens: trimmed in place, rewound through `checkpoint`
        (a CacheCheckpoint marked at token `checkpoint[1]`) for layers that cannot trim,
        or reset when neither can undo it."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        drop = len(self.tokens) - keep
        if drop <= 0 or self.layers is None:
            return
        if keep < self.dense_from:
            mode = self.mode
            self.reset()  # cannot rewind into a sparsely prefilled region
            self.mode = mode
            return
        if can_trim_prompt_cache(self.layers):
            trim_prompt_cache(self.layers, drop)
        elif checkpoint is not None and keep >= checkpoint[1]:
            checkpoint[0].rewind(self.model, self.tokens[checkpoint[1] :], keep - checkpoint[1])
        else:
            mode = self.mode
            self.reset()  # e.g. recurrent state: it cannot be rewound, start over
            self.mode = mode
            return
        self.tokens = self.tokens[:keep]

    def reuse(self, tokens: list[int], *, keep_last: bool = True) -> int:
        """Keep the longest common prefix with `tokens` (all but the last token when
        `keep_last`: it must run to give the next logits); return how many tokens are reused.
        Fresh layers are made when there were none."""
        from engine.half_kv import make_layers

        common = self.common_prefix(tokens)
        if keep_last:
            common = min(common, len(tokens) - 1)
        self.trim_to(common)
        if self.layers is None:
            self.layers = make_layers(self.model)
            self.tokens = []
        return len(self.tokens)

    def sync(self, tokens: list[int], step: int) -> Iterator[int]:
        """Make the cache hold exactly `tokens`: reuse the common prefix, prefill the rest
        in chunks of `step`; yields new tokens done so far."""
        from engine.prefill import prefill_chunks

        common = self.reuse(tokens, keep_last=False)
        for done in prefill_chunks(self.model, self.layers, tokens[common:], step):
            self.tokens = list(tokens[: common + done])
            yield done

    # --- sparse prefill's position map -------------------------------------------------

    def mark_sparse(self, tokens_held: list[int]) -> None:
        """After a sparse prefill: the layers hold fewer slots than `tokens_held`; from the
        next token on, positions and slots advance together (in each layer by its own shift
        when layers hold different numbers of slots; layers without slots have no positions)."""
        self.dense_from = len(tokens_held)
        shifts = [self.dense_from - layer.offset if hasattr(layer, "offset") else None for layer in self.layers or []]
        known = [s for s in shifts if s is not None]
        self.shift = min(known)
        self.layer_shifts = None if len(set(known)) == 1 else [0 if s is None else s - self.shift for s in shifts]
        self.tokens = list(tokens_held)

    def model_view(self):
        """The model with RoPE positions shifted past tokens a sparse prefill dropped."""
        from engine.accel.positions import ShiftedModel

        if not self.shift and not self.layer_shifts:
            return self.model
        return ShiftedModel(self.model, self.shift, self.layer_shifts)

    # --- packing, size, saving ---------------------------------------------------------

    def pack(self, *, k_bits: int, v_bits: int, group_size: int, start: int) -> None:
        from engine.kvcache import maybe_quantize_kv_cache

        if self.layers is not None:
            maybe_quantize_kv_cache(self.layers, k_bits=k_bits, v_bits=v_bits, group_size=group_size, start=start)

    def save(self, path, identity: dict) -> None:
        """Write layers and state; `identity` (model id, tokenizer) is stored to be checked on load."""
        from mlx_lm.models.cache import save_prompt_cache

        state = {
            **identity,
            "tokens": self.tokens,
            "shift": self.shift,
            "dense_from": self.dense_from,
            "layer_shifts": self.layer_shifts,
            "mode": self.mode,
            "tokens_sha256": tokens_digest(self.tokens),
            "kv_sha256": kv_digest(self.layers),
        }
        if self.layers is None:
            raise ValueError("the prompt cache holds no layers to save")
        save_prompt_cache(str(path), self.layers, {"brisk": json.dumps(state)})

    def load(self, path, identity: dict) -> None:
        """Adopt a cache written by `save` for the same `identity`; refuse anything else."""
        from mlx_lm.models.cache import load_prompt_cache

        from engine.errors import BriskError

        try:
            layers, meta = load_prompt_cache(str(path), return_metadata=True)
            state = json.loads(meta["brisk"])
        except Exception as exc:  # missing, truncated, or not ours
            raise BriskError(f"Cannot read saved cache {path}: {exc}") from exc
        if {k: state.get(k) for k in identity} != identity:
            raise BriskError(f"Saved cache {path} belongs to model {state.get('model')}, not {identity.get('model')}")
        # The KV must be the one computed for these tokens: a file spliced from two chats
        # (KV of one, tokens of another) answered about the wrong document.
        if state.get("tokens_sha256") != tokens_digest(state["tokens"]) or state.get("kv_sha256") != kv_digest(layers):
            raise BriskError(
                f"Saved cache {path} does not match its own tokens and KV (damaged or spliced "
                "from another chat); it was not used"
            )
        self.layers, self.tokens = layers, list(state["tokens"])
        self.shift, self.dense_from = state["shift"], state["dense_from"]
        self.layer_shifts = state.get("layer_shifts")
        self.mode = tuple(state["mode"]) if state["mode"] else None


def tokens_digest(tokens) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()


def kv_digest(layers) -> str:
    """sha256 over every array the layers save, as raw bytes, in layer order."""
    import mlx.core as mx
    import numpy as np

    from engine.mx_values import tree_leaves

    digest = hashlib.sha256()
    for layer in layers or []:
        for value in tree_leaves(layer.state):
            if not isinstance(value, mx.array):  # e.g. an offset beside the arrays
                digest.update(repr(value).encode())
                continue
            digest.update(f"{value.shape}{value.dtype}".encode())
            digest.update(np.array(mx.view(value, mx.uint8)).tobytes())
    return digest.hexdigest()
