"""Per-turn metrics, and KV-cache bytes measured two ways."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from brisk.engine.api.literal_types import FinishReason, SparseOutcome


@dataclass
class TurnMetrics:
    ttft_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # reused from the session's prompt cache
    prefilled_tokens: int = 0  # actually run through the model this turn
    prefill_tps: float = 0.0  # new prompt tokens served (computed, or skipped by sparse prefill) per TTFT second
    generated_tokens: int = 0
    decode_tps: float = 0.0
    # From the prompt read (all but its last token) to the last answer token: every answer
    # token's cost, the first one's included (a draft cycle yields its first token with the
    # rest, so first-to-last token rates flatter speculative decoding).
    generation_s: float = 0.0
    kv_bytes: int = 0  # measured from the cache arrays, for the tokens they hold
    kv_bytes_formula: int = 0  # 2·layers·kv_heads·head_dim·tokens·bytes, the cross-check
    kv_bytes_allocated: int = 0  # what the buffers reserve (mlx-lm grows them in 256-token steps)
    kv_bits: int = 16  # 16 = unpacked float16 (engine/kv/half.py); 8 or 4 = packed
    k_bits: int = 16  # keys and values as used, each chosen separately (kv_bits is the shorthand)
    v_bits: int = 16
    kv_check: str = ""  # what this model's packed-KV self-test said about them (engine/kv/fidelity.py)
    peak_memory_bytes: int = 0
    finish_reason: FinishReason | Literal[""] = ""  # "" until the turn ends
    total_s: float = 0.0
    sparse_prefill: str = "off"  # what sparse prefill did, in words (with counts, or why not)
    sparse_outcome: SparseOutcome = "off"  # the same, as a value to branch on
    kept_tokens: int = 0  # new prompt tokens the target prefilled under sparse prefill
    scoring_s: float = 0.0  # draft prefill + lookahead scoring
    sparse_prefill_s: float = 0.0  # target prefill of the kept tokens
    prefill_method: str = "dense"  # dense | specprefill | uniprefill (engine/accel/router.py)
    prefill_route: str = ""  # why the router chose it
    uniprefill_s: float = 0.0  # the layer-by-layer prefill under UniPrefill
    drops: list = field(default_factory=list)  # UniPrefill, per drop layer: [layer, tokens in, tokens kept]
    flops_saved: float = 0.0  # share of dense prefill FLOPs UniPrefill skipped (from the kept counts)
    # What a sparse prefill read at full depth (engine/accel/coverage.py): the app's coverage map.
    coverage: dict = field(default_factory=dict)
    spec_decode: str = "off"  # mode and rule, or off and why
    decode_step: str = ""  # plain decoding's step: "compiled", or "mlx-lm: why not" (engine/decode/plain.py)
    acceptance_rate: float = 0.0  # accepted / proposed draft tokens
    draft_tokens: int = 0  # target tokens proposed by the draft
    accepted_tokens: int = 0
    lookup_tokens: int = 0  # tokens proposed by lookup in the context (no draft model)
    lookup_accepted: int = 0
    lookup_acceptance: float = 0.0
    mean_accepted_run: float = 0.0  # proposed tokens kept per verify pass (either source)
    tokens_per_cycle: float = 0.0  # tokens per target forward pass
    mean_k: float = 0.0  # draft tokens per drafting cycle
    draft_time_share: float = 0.0  # share of decode time spent in the draft
    draft_prefill_s: float = 0.0  # bringing the draft's cache up to the prompt
    draft_cost_ratio: float = 0.0  # a draft step's measured cost in target steps (0: not measured)
    sources: list = field(default_factory=list)  # per generated token: "draft", "lookup" or "" (the target's)
    extra: dict = field(default_factory=dict)
    # Where the wait for the first token went, each part measured where it happens (the
    # parts from model_load_s on add up to the engine's share of TTFT, ttft_s being the last
    # three): loading the model (and draft) this turn needed, restoring the chat's saved
    # prompt cache from disk, the packed-KV self-test, template and tokenizing, reading the
    # new prompt tokens, and the first decode step.
    model_load_s: float = 0.0
    cache_restore_s: float = 0.0
    restored_tokens: int = 0  # prompt tokens the restored cache held
    kv_check_s: float = 0.0
    prepare_s: float = 0.0
    prefill_s: float = 0.0
    first_step_s: float = 0.0
    # Set by a client that measured it (the app): Send to the engine taking the turn up, and
    # Send to the first token on screen (what the user waited).
    queue_s: float = 0.0
    waited_s: float = 0.0
    engine_started_at: float = 0.0  # time.monotonic() when the engine took the turn up (0: not known)
    model_id: str = ""
    context_length: int = 0  # the model's, for the KV gauge

    def to_dict(self) -> dict:
        return asdict(self)

    def update(self, values: dict) -> None:
        """Set the named fields (a phase's results); an unknown name is a bug, not a new field."""
        unknown = set(values) - set(self.__dataclass_fields__)
        if unknown:
            raise AttributeError(f"TurnMetrics has no field {', '.join(sorted(unknown))}")
        for name, value in values.items():
            setattr(self, name, value)


def turn_rates(
    metrics: TurnMetrics, *, generated: int, start: float, prompt_read_at: float, first_at: float | None, end: float
) -> dict:
    """A finished turn's totals and rates, from its clock readings."""
    rates: dict = {"total_s": end - start, "generation_s": end - prompt_read_at, "generated_tokens": generated}
    if first_at is None:
        return rates
    # The prompt tokens this turn served (read or, under sparse prefill, skipped) per second
    # of TTFT: a sparse turn is compared with a dense one on the same footing.
    rates["prefill_tps"] = (metrics.prompt_tokens - metrics.cached_tokens) / max(metrics.ttft_s, 1e-9)
    if metrics.draft_tokens:
        # A draft cycle yields its tokens together: first-to-last intervals can be ~0 (8,685
        # tok/s was reported), so drafting turns divide by the whole generation.
        rates["decode_tps"] = generated / max(rates["generation_s"], 1e-9)
    elif generated > 1:
        rates["decode_tps"] = (generated - 1) / max(end - first_at, 1e-9)
    return rates


def kv_measurements(layers, config: dict) -> dict:
    """The cache's bytes: measured on its arrays, as allocated, and by the formula."""
    from brisk.engine.kv.packed_cache import kv_shape

    measured = {"kv_bytes": kv_bytes_measured(layers), "kv_bytes_allocated": kv_bytes_allocated(layers)}
    shape = kv_shape(config)
    if shape:
        measured["kv_bytes_formula"] = kv_bytes_formula(layers, **shape, itemsize=_unpacked_itemsize(layers))
    return measured


def _unpacked_itemsize(cache) -> int:
    """Bytes per element of the unpacked layers (packed layers' formula does not use it)."""
    import mlx.core as mx

    for layer in cache:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, mx.array):
            return keys.dtype.size
    return 4


def kv_bytes_measured(cache) -> int:
    from brisk.engine.kv.packed_cache import held_arrays

    return sum(a.nbytes for layer in cache for a in held_arrays(layer))


def kv_bytes_allocated(cache) -> int:
    return sum(c.nbytes for c in cache)


def kv_bytes_formula(cache, *, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """The formula, layer by layer (packed layers count bits plus group scales/biases)."""
    from brisk.engine.kv.packed_cache import layer_bytes_formula

    return sum(layer_bytes_formula(c, kv_heads=kv_heads, head_dim=head_dim, itemsize=itemsize) for c in cache)
