"""What a verify pass costs on the device the kernel plan names, before a conversation times
one: the one place speculation asks (pair.py hands it to the autopilot, controller.py).

A verify pass over k + 1 positions costs one plain step plus `extra_position` of a step per
extra position. How much that is depends on where the products run:

- `cpu`: float32 on the CPU, Brisk's native kernels (or the BLAS where they are switched
  off). Few-row products are compute-bound: each extra position cost 0.26 (SmolLM2) to
  0.41 (Qwen-1.5B q4) of a compiled plain step on this project's AMD EPYC (Zen 4), and a
  prior of 0.05 sent a turn's first lookups long.
- `cpu-mlx`: MLX's own kernels on the CPU in the stored dtype (`BRISK_KERNELS=off`, the
  GPU plan's stand-in): MLX's CPU runs half-precision products a row at a time.
  SmolLM2-135M (q4, float16) on the same EPYC, model calls on a 512-token cache: one
  position 257 ms, 5 positions 1.06 s, 9 positions 1.69 s: 0.70-0.78 of a step per
  extra position (a reading on a machine loaded 7x over gave 1.3).
- `gpu`: MLX on Metal or CUDA. Decode streams the weights once whatever the number of
  positions, so a few more rows cost little: 0.05 until measured. Measured instead, once
  per model in a process, by `measure_extra_position` (a few passes of the target on a
  scratch cache: milliseconds on a GPU, where the CPU kinds would spend seconds).

The autopilot replaces the figure with each verify length's own timing as soon as it has
one, and keeps those per (target, draft, `cost_key`) across conversations (costs_file.py).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

KINDS = ("cpu", "cpu-mlx", "gpu")


@dataclass(frozen=True)
class VerifyCost:
    kind: str  # one of KINDS
    extra_position: float  # a verify pass's cost per extra position, in plain steps
    source: str  # where the figure comes from (logged when measured)


PRIORS = {
    "cpu": VerifyCost("cpu", 0.3, "prior: Brisk's CPU kernels, 0.26-0.41 measured on Zen 4"),
    "cpu-mlx": VerifyCost("cpu-mlx", 0.75, "prior: MLX's CPU kernels in float16, SmolLM2 measured on Zen 4"),
    "gpu": VerifyCost("gpu", 0.05, "prior: a GPU streams the weights once for any few positions"),
}
MEASURED_KINDS = frozenset({"gpu"})  # where measuring costs milliseconds, not seconds
PROBE_POSITIONS = 5  # a verify of 4 drafted tokens: the autopilot's usual k
PROBE_PREFIX = 64  # keys the scratch cache holds (attention is not free either)
PROBE_ROUNDS = 3  # timed passes of each length, after one untimed (kernels built, buffers sized)


def device_kind(plan=None) -> str:
    """The kind of device the plan's products run on."""
    if plan is None:
        from brisk.kernels import plan as kernel_plan

        plan = kernel_plan.current()
    if plan.device != "cpu":
        return "gpu"
    return "cpu" if plan.compute_dtype == "float32" else "cpu-mlx"


def cost_key(model, plan=None) -> str:
    """The verify path that a pair's stored costs are kept under: in float32 on the CPU
    which path few-row products take ("native" or "blas", as stored before the GPU plan),
    else the kind: costs timed in float32 on a CPU say nothing about a GPU's or float16's."""
    kind = device_kind(plan)
    if kind != "cpu":
        return kind
    from brisk.kernels.native_layers import verify_path

    return verify_path(model)


_lock = threading.Lock()
_measured: dict[tuple[str, str], VerifyCost] = {}


def verify_cost(
    model_id: str,
    model,
    *,
    plan=None,
    measure: Callable[[object], float] | None = None,
) -> VerifyCost:
    """The cost for `model` on the plan's device: measured once per (model, kind) where the
    kind is cheap to measure on, else the kind's prior. A failed measurement falls back to
    the prior (and is not retried this process)."""
    kind = device_kind(plan)
    if kind not in MEASURED_KINDS:
        return PRIORS[kind]
    with _lock:
        known = _measured.get((model_id, kind))
        if known is not None:
            return known
        try:
            extra = (measure or measure_extra_position)(model)
            known = VerifyCost(kind, extra, f"measured: {model_id} on this {kind.upper()}")
            log.info("a verify pass of %s costs %.3f of a step per extra position here", model_id, extra)
        except Exception as exc:  # a cost prior is never worth a turn
            known = PRIORS[kind]
            log.warning("could not time a verify pass of %s: %s; assuming %s", model_id, exc, known.extra_position)
        _measured[(model_id, kind)] = known
        return known


def extra_position_from(step_s: float, verify_s: float, positions: int) -> float:
    """Per extra position, in steps: a pass of `positions` took `verify_s` where one took
    `step_s` (never below 0: a wider pass timed faster than a step is noise)."""
    if positions < 2 or step_s <= 0:
        raise ValueError("needs a step's time and a pass of at least two positions")
    return max(0.0, (verify_s / step_s - 1.0) / (positions - 1))


def measure_extra_position(
    model,
    *,
    positions: int = PROBE_POSITIONS,
    rounds: int = PROBE_ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Time passes of 1 and `positions` tokens after a short prefix, on a scratch cache
    (the conversation's is not touched), and compare their medians."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    layers = make_prompt_cache(model)
    mx.eval(model(mx.array([[(i * 7) % 97 + 3 for i in range(PROBE_PREFIX)]]), cache=layers))

    def timed(n: int) -> float:  # the cache grows by the ~30 tokens timed: no trim needed
        started = clock()
        mx.eval(model(mx.array([[11] * n]), cache=layers))
        return clock() - started

    timed(1), timed(positions)  # untimed: the first pass of a shape builds its kernels
    step = statistics.median(timed(1) for _ in range(rounds))
    verify = statistics.median(timed(positions) for _ in range(rounds))
    return extra_position_from(step, verify, positions)


def forget_measured() -> None:
    """Drop what was measured (tests; a model reloaded under another plan)."""
    with _lock:
        _measured.clear()
