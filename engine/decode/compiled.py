"""Plain decoding with the model's step compiled once per turn (`mx.compile`).

mlx-lm's `generate_step` rebuilds a decode step's graph in Python for every token: for a
30-layer model about 4 ms of a ~20 ms step, on a core the kernels want (issue 17). A
compiled step is traced once, then replayed from C++, with MLX fusing its elementwise ops.

A traced step must keep its shapes and constants from token to token, which mlx-lm's
KVCache does not: its offset is a Python int and its views grow by one key per token. So
each layer's keys and values stay in their fixed-size buffer (grown 256 positions at a
time, as KVCache grows them, which retraces), the new token is written at an offset given
as an array, and attention reads only the first `length` positions
(kernels/fused_attention.py passes a cache's `length` to the kernel, or masks the rest).

Sampling stays outside the compiled step and runs as in `generate_step` (processors on the
token history, log-probabilities, the sampler), so the two paths choose the same tokens.
Which turns take this path: `why_not_compiled`; any other turn runs `generate_step`. The
speculative decoder's plain runs replay the same step through `CompiledRun`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Generator, Iterator

import mlx.core as mx

from brisk.engine.kv.half import DENSE_CACHES
from brisk.kernels.fused_attention import attends_through_here

# Architectures whose attention only reads `cache.offset` as RoPE's offset and calls
# `update_and_fetch` then `scaled_dot_product_attention(..., cache=cache)`: each is checked
# token for token against generate_step (tests/engine/test_compiled_decode.py).
ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3"})
GROWTH = 256  # positions a buffer grows by when full (mlx-lm's KVCache.step)


class _Switch:
    enabled = True


SWITCH = _Switch()


@contextmanager
def generate_step_only() -> Iterator[None]:
    """Plain decoding uses mlx-lm's generate_step inside this block (the A/B partner)."""
    before, SWITCH.enabled = SWITCH.enabled, False
    try:
        yield
    finally:
        SWITCH.enabled = before


def why_not_compiled(model, layers: list | None, *, kv_bits: tuple[int, int]) -> str | None:
    """None when this turn can decode with the compiled step, else the reason it cannot."""
    if not SWITCH.enabled:
        return "turned off (generate_step_only)"
    model_type = getattr(model, "model_type", None)
    if model_type not in ARCHITECTURES:
        return f"the {model_type} architecture is not one the compiled step is checked on"
    if not attends_through_here(model):
        return "attention that does not go through Brisk's (it would read the buffers' spare positions)"
    if kv_bits != (16, 16):
        return "a packed KV cache (it is repacked between tokens)"
    if not layers or any(type(layer) not in DENSE_CACHES or layer.keys is None for layer in layers):
        return "a cache that is not one plain, filled KVCache per layer"
    if layers[0].keys.shape[0] != 1:
        return "a batch of more than one sequence"
    return None


class _FixedSlot:
    """One layer's cache inside the traced step: its buffers, where this token goes (an int32
    array of one), and how many positions attention reads (one more)."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array, length: mx.array):
        self.keys, self.values, self.offset, self.length = keys, values, offset, length

    def update_and_fetch(self, keys: mx.array, values: mx.array):  # stored as the buffers store (float16)
        self.keys = mx.slice_update(self.keys, keys.astype(self.keys.dtype), self.offset, axes=(2,))
        self.values = mx.slice_update(self.values, values.astype(self.values.dtype), self.offset, axes=(2,))
        return self.keys, self.values


def traced_step(model, *, normalize: bool):
    """token (1,), then per layer its offset, length, keys and values buffers -> the last
    logits (1, V), as log-probabilities when `normalize` (no processor needs the logits
    first), then the buffers. Offsets and lengths come in as inputs, not computed in the
    step: each op computed would be one more node per layer to evaluate every token."""

    def step(token: mx.array, *per_layer: mx.array):
        slots = [_FixedSlot(*per_layer[i + 2 : i + 4], *per_layer[i : i + 2]) for i in range(0, len(per_layer), 4)]
        logits = model(token[None], cache=slots)[:, -1, :]
        if normalize:
            logits = logits - mx.logsumexp(logits, keepdims=True)
        return (logits, *[b for slot in slots for b in (slot.keys, slot.values)])

    return mx.compile(step)


def _grown(buffer: mx.array) -> mx.array:
    b, h, _, d = buffer.shape
    return mx.concatenate([buffer, mx.zeros((b, h, GROWTH, d), buffer.dtype)], axis=2)


class CompiledRun:
    """Steps of one traced `step` (from `traced_step`) written into `layers`' buffers, which
    the run holds (the layers' keys and values are None) until `release()` puts them back."""

    def __init__(self, step, layers: list):
        self.step, self.layers = step, layers
        # KVCache's own buffers, spare positions and all: attention reads only `length` of them
        self.buffers = [a for layer in layers for a in (layer.keys, layer.values)]
        # positions each layer holds once the built steps have run (UniPrefill leaves them unequal)
        self.written = [layer.offset for layer in layers]
        self.grown = 0  # layers whose buffers grew (the step is traced anew for their shapes)
        for layer in layers:  # nothing else may hold the buffers: each step writes them in place
            layer.keys = layer.values = None

    def __call__(self, token: mx.array) -> mx.array:
        """The step for `token` (1,), built, not run: its logits (1, V) (or log-probabilities)."""
        buffers, written = self.buffers, self.written
        for i, held in enumerate(written):
            if held >= buffers[2 * i].shape[2]:
                buffers[2 * i : 2 * i + 2] = [_grown(b) for b in buffers[2 * i : 2 * i + 2]]
                self.grown += 1
        # offset and length arrays, shared by the layers that hold as many tokens (all, mostly)
        places = {held: (mx.array([held], dtype=mx.int32), mx.array([held + 1], dtype=mx.int32)) for held in written}
        out = self.step(
            token, *[a for i, held in enumerate(written) for a in (*places[held], *buffers[2 * i : 2 * i + 2])]
        )
        self.buffers, self.written = list(out[1:]), [held + 1 for held in written]  # the old buffers go
        return out[0]

    def release(self) -> None:
        for i, layer in enumerate(self.layers):
            layer.keys, layer.values, layer.offset = self.buffers[2 * i], self.buffers[2 * i + 1], self.written[i]


def compiled_steps(
    model, layers: list, first: int, *, max_tokens: int, sampler, processors, normalize: bool = True
) -> Generator[int, None, None]:
    """Tokens as `generate_step(mx.array([first]), model, prompt_cache=layers, ...)` yields them.

    The layers (KVCache, as `why_not_compiled` requires) hold the prompt but `first`; each
    token is run before it is yielded (the next step is built ahead), so at every yield, and
    after the generator closes, the layers hold every yielded token as generate_step's would.
    `normalize=False` hands the sampler logits, not log-probabilities, for samplers that pick
    the same token either way (engine/decode/sampling.py: `needs_log_probabilities`): normalizing
    costs an exp over the vocabulary, ~4 ms a token for Qwen's 152K.
    """
    run = CompiledRun(traced_step(model, normalize=normalize and not processors), layers)
    history: mx.array | None = None

    def build(token: mx.array):
        nonlocal history
        logprobs = run(token)
        if processors:  # on the logits, then normalized, as in generate_step
            history = token if history is None else mx.concatenate([history, token])
            logits = logprobs
            for processor in processors:
                logits = processor(history, logits)
            logprobs = logits - mx.logsumexp(logits, keepdims=True) if normalize else logits
        sampled = sampler(logprobs)
        mx.async_eval(sampled)
        return sampled

    try:
        y = build(mx.array([first], dtype=mx.uint32))
        for n in range(max_tokens):
            following = build(y)  # y's own keys go in before y is yielded, as in generate_step
            yield y.item()
            if n % 256 == 0:
                mx.clear_cache()
            y = following
    finally:
        run.release()
