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

import json
from typing import Iterator

from brisk.engine.api.errors import BriskError


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
        from brisk.engine.kv.half import make_layers

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
        from brisk.engine.turn.dense_prefill import prefill_chunks

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
        from brisk.engine.accel.positions import ShiftedModel

        if not self.shift and not self.layer_shifts:
            return self.model
        return ShiftedModel(self.model, self.shift, self.layer_shifts)

    # --- packing, size, saving ---------------------------------------------------------

    def pack(self, *, k_bits: int, v_bits: int, group_size: int, start: int) -> None:
        from brisk.engine.kv.packed_cache import maybe_quantize_kv_cache

        if self.layers is not None:
            maybe_quantize_kv_cache(self.layers, k_bits=k_bits, v_bits=v_bits, group_size=group_size, start=start)

    def save(self, path, identity: dict, *, key: bytes | None = None) -> None:
        """Write layers and state, signed with `key` (default: this installation's,
        engine/kv/signing.py); `identity` (model id, tokenizer) is checked on load."""
        from mlx_lm.models.cache import save_prompt_cache

        from brisk.engine.kv.signing import cache_mac, installation_key

        if self.layers is None:
            raise ValueError("the prompt cache holds no layers to save")
        state = {
            **identity,
            "tokens": self.tokens,
            "shift": self.shift,
            "dense_from": self.dense_from,
            "layer_shifts": self.layer_shifts,
            "mode": self.mode,
        }
        state["mac"] = cache_mac(installation_key() if key is None else key, state, self.layers)
        save_prompt_cache(str(path), self.layers, {"brisk": json.dumps(state)})

    def load(self, path, identity: dict, *, key: bytes | None = None) -> None:
        """Adopt a cache written by `save` for the same `identity` and signed with `key`;
        BriskError for anything else (unsigned, altered, damaged, another model's)."""
        from brisk.engine.kv.signing import installation_key

        key = installation_key() if key is None else key
        try:
            layers, state = _read_signed(path, key)
        except BriskError:
            raise
        except Exception as exc:  # truncated, not ours, or a field of the wrong type or size
            raise BriskError(f"Cannot read saved cache {path}: {type(exc).__name__}: {exc}") from exc
        if {k: state.get(k) for k in identity} != identity:
            raise BriskError(f"Saved cache {path} belongs to model {state.get('model')}, not {identity.get('model')}")
        self.layers, self.tokens = layers, list(state["tokens"])
        self.shift, self.dense_from = state["shift"], state["dense_from"]
        self.layer_shifts = state["layer_shifts"]
        self.mode = tuple(state["mode"]) if state["mode"] else None


def _read_signed(path, key: bytes) -> tuple[list, dict]:
    """The layers and state of a saved cache whose MAC is right and whose fields have their
    types; BriskError when the MAC is missing or wrong."""
    from mlx_lm.models.cache import load_prompt_cache

    from brisk.engine.kv.signing import cache_mac, same_mac

    layers, meta = load_prompt_cache(str(path), return_metadata=True)
    state = json.loads(meta["brisk"])
    if not isinstance(state, dict):
        raise ValueError("its state is not an object")
    # Signed by this installation, over tokens and KV alike: a file spliced from two chats,
    # or edited to claim more tokens than its KV holds, answered from the wrong context.
    if not same_mac(state.get("mac"), cache_mac(key, state, layers)):
        raise BriskError(
            f"Saved cache {path} does not match its own tokens and KV under this Brisk's key (altered, damaged, "
            "or spliced from another chat); it was not used"
        )
    # Signed means written by us; the checks below keep a bug from becoming a crash.
    tokens, shifts, mode = state["tokens"], state["layer_shifts"], state["mode"]
    if not (isinstance(tokens, list) and all(type(t) is int and t >= 0 for t in tokens)):
        raise ValueError("its tokens are not token ids")
    if not all(type(state[k]) is int and state[k] >= 0 for k in ("shift", "dense_from")):
        raise ValueError("its position map is not counts")
    if shifts is not None and not (isinstance(shifts, list) and len(shifts) == len(layers)):
        raise ValueError("its layer shifts do not match its layers")
    if mode is not None and not (isinstance(mode, list) and len(mode) == 3):
        raise ValueError("its KV mode is not (k_bits, v_bits, group_size)")
    return layers, state
