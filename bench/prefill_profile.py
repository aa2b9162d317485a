"""`brisk bench prefill-profile`: where one real prefill's time goes, part by part.

Unlike bench/profile.py (each piece of a layer timed alone on random inputs), this
runs the engine's own chunked prefill (engine/turn/dense_prefill.py) of N tokens on the loaded model,
native kernels and all, with every part of every decoder layer wrapped in a timer that
evaluates the part's output: embedding, norms, the q/k/v/o projections, attention itself
(RoPE, the cache write and the attention kernel: the attention block less its projections),
the MLP's matmuls and its activation (the MLP less its matmuls). What no wrapper covers
(residual adds, the final norm, each chunk's cache evaluation) is "other". Evaluating each
part on its own costs a little (a lazy graph would fuse nothing here, but each part waits
for the one before it), so the table also gives the same prefill unwrapped, timed first.
"""

from __future__ import annotations

import time
from typing import Any

PARTS = ("embedding", "norms", "projections", "attention", "mlp matmuls", "activation", "other")
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_MATMULS = ("gate_proj", "up_proj", "down_proj")
_NORMS = ("input_layernorm", "post_attention_layernorm")


class _Timed:
    """Stands in for one child module: evaluates its inputs, then times the call and the
    evaluation of what it returns."""

    def __init__(self, inner, part: str, clock: dict[str, float]):
        self.inner, self.part, self.clock = inner, part, clock

    def __call__(self, *args, **kwargs):
        import mlx.core as mx

        # Inputs still lazy (o_proj's: the attention itself) belong to the enclosing block.
        mx.eval([a for a in (*args, *kwargs.values()) if isinstance(a, mx.array)])
        started = time.perf_counter()
        out = self.inner(*args, **kwargs)
        mx.eval(out)
        self.clock[self.part] = self.clock.get(self.part, 0.0) + time.perf_counter() - started
        return out

    def __getattr__(self, name):  # the parent may read the child's fields (e.g. a weight's shape)
        return getattr(self.inner, name)


def _wrap(parent, name: str, part: str, clock: dict[str, float], undo: list) -> bool:
    child = getattr(parent, name, None)
    if child is None:
        return False
    # An instance attribute is found before the module's own child of that name.
    object.__setattr__(parent, name, _Timed(child, part, clock))
    undo.append((parent, name))
    return True


def _decoder(lm):
    """The model's body and its layers, or SystemExit when they are not mlx-lm's usual ones."""
    body = getattr(lm.model, "model", None)
    layers = getattr(body, "layers", None)
    if not layers or not all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in layers):
        raise SystemExit(f"{lm.id}: not the standard decoder layout (layers with self_attn and mlp)")
    return body, layers


def _instrument(lm, clock: dict[str, float]) -> list:
    body, layers = _decoder(lm)
    undo: list = []
    _wrap(body, "embed_tokens", "embedding", clock, undo)
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        for name in _PROJECTIONS:
            _wrap(attn, name, "projections", clock, undo)
        for name in _MLP_MATMULS:
            _wrap(mlp, name, "mlp matmuls", clock, undo)
        for name in _NORMS:
            _wrap(layer, name, "norms", clock, undo)
        # whole blocks last: their time less their parts' is attention itself, the activation
        _wrap(layer, "self_attn", "attention block", clock, undo)
        _wrap(layer, "mlp", "mlp block", clock, undo)
    return undo


def _restore(undo: list) -> None:
    for parent, name in reversed(undo):
        object.__delattr__(parent, name)


def _prefill_seconds(lm, tokens: list[int], step: int) -> float:
    import mlx.core as mx

    from brisk.engine.kv.half import make_layers
    from brisk.engine.turn.dense_prefill import prefill_chunks

    cache = make_layers(lm.model)
    started = time.perf_counter()
    for _ in prefill_chunks(lm.model, cache, tokens, step):
        pass
    elapsed = time.perf_counter() - started
    del cache
    mx.clear_cache()
    return elapsed


def profile_prefill(lm, tokens: list[int], step: int) -> dict[str, Any]:
    """One unwrapped prefill of `tokens`, then one with every part timed: seconds per part."""
    _decoder(lm)
    plain = _prefill_seconds(lm, tokens, step)
    clock: dict[str, float] = {}
    undo = _instrument(lm, clock)
    try:
        wrapped = _prefill_seconds(lm, tokens, step)
    finally:
        _restore(undo)
    parts = {
        "embedding": clock.get("embedding", 0.0),
        "norms": clock.get("norms", 0.0),
        "projections": clock.get("projections", 0.0),
        "attention": max(clock.get("attention block", 0.0) - clock.get("projections", 0.0), 0.0),
        "mlp matmuls": clock.get("mlp matmuls", 0.0),
        "activation": max(clock.get("mlp block", 0.0) - clock.get("mlp matmuls", 0.0), 0.0),
    }
    parts["other"] = max(wrapped - sum(parts.values()), 0.0)
    return {"tokens": len(tokens), "step": step, "plain_s": plain, "wrapped_s": wrapped, "parts": parts}


def run_prefill_profile(model_id: str, prompt_tokens: list[int], *, step: int, as_json: bool) -> dict:
    from brisk.bench.common import filler_text, print_table
    from brisk.engine.models.loader import load_model

    lm = load_model(model_id)
    _prefill_seconds(lm, lm.tokenizer.encode(filler_text(lm.tokenizer, 64)), step)  # warm-up: kernels, pools
    payload: dict[str, Any] = {"model": model_id, "step": step, "runs": []}
    rows = []
    for n in prompt_tokens:
        tokens = lm.tokenizer.encode(filler_text(lm.tokenizer, n))
        got = profile_prefill(lm, tokens, step)
        payload["runs"].append(got)
        for part in PARTS:
            seconds = got["parts"][part]
            rows.append([len(tokens), part, seconds * 1e3, 100 * seconds / got["wrapped_s"]])
        rows.append([len(tokens), "total (parts timed)", got["wrapped_s"] * 1e3, 100.0])
        rows.append([len(tokens), "total (unwrapped)", got["plain_s"] * 1e3, 100 * got["plain_s"] / got["wrapped_s"]])
    print_table(
        f"brisk bench prefill-profile: {model_id}, chunks of {step}, one prefill per prompt length",
        ["tokens", "part", "ms", "% of timed"],
        rows,
        payload,
        as_json,
    )
    return payload
