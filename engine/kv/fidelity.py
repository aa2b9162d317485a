"""Does a packed KV cache keep this model's answers? Measured, stored with the model, used.

The measurement (also `brisk bench kv-quality`'s): prefill the same tokens into an
unquantized and a packed cache, decode greedily in lockstep feeding both the unquantized
model's token, and compare the next-token choices (top-1 agreement) and distributions
(KL(p_16 || p_packed)).

The self-test runs it on a short fixed text (resources/text/kv_selftest.txt, ~1,300
tokens) over 64 positions the first time a model is used with packed KV. A precision
passes with top-1 agreement >= 0.99 (all 64) and mean KL <= 0.05. Results go to
models/<id>/kv_fidelity.json, keyed by precision and packing method, so a new packing
method tests again. `auto` takes the smallest precision that passes, trying them from
the smallest and stopping at the first pass (more bits are assumed at least as good);
none passing means 16-bit KV.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import brisk.resources as resources
from brisk.engine.runtime.mx_values import item_float, item_int

log = logging.getLogger(__name__)

SELFTEST_TEXT = ("text", "kv_selftest.txt")  # in the resources package
POSITIONS = 64
TOP1_MIN = 0.99
KL_MAX = 0.05
CANDIDATES = ((4, 4), (8, 4), (8, 8))  # smallest first
METHOD = "keys-per-channel-v1"  # results measured with another packing are not reused
RESULTS_FILE = "kv_fidelity.json"
PREFILL_STEP = 512


@dataclass(frozen=True)
class PackedMode:
    k_bits: int
    v_bits: int
    key_layout: str = "channel"

    @property
    def label(self) -> str:
        return f"K{self.k_bits}/V{self.v_bits}" + ("" if self.key_layout == "channel" else " token keys")


def prefill(lm, tokens: list[int], mode: PackedMode | None, group_size: int, step: int = PREFILL_STEP):
    """A cache holding `tokens` (packed as a chat packs it, chunk by chunk) and the logits after them."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from brisk.engine.kv.packed_cache import maybe_quantize_kv_cache
    from brisk.engine.turn.dense_prefill import prefill_chunks

    def pack():
        if mode is not None:
            maybe_quantize_kv_cache(
                cache,
                k_bits=mode.k_bits,
                v_bits=mode.v_bits,
                group_size=group_size,
                start=0,
                key_layout=mode.key_layout,
            )

    cache = make_prompt_cache(lm.model)
    for _ in prefill_chunks(lm.model, cache, tokens[:-1], step):
        pack()
    logits = lm.model(mx.array(tokens[-1:])[None], cache=cache)[0, -1]
    pack()
    return cache, logits


def reference_run(lm, tokens: list[int], positions: int, group_size: int) -> list:
    """The unquantized run: each greedy token and the log-probabilities it was chosen from."""
    import mlx.core as mx

    cache, logits = prefill(lm, tokens, None, group_size)
    out = []
    for _ in range(positions):
        logp = logits - mx.logsumexp(logits)
        token = mx.argmax(logits)
        mx.eval(logp, token)
        out.append((token.item(), logp))
        logits = lm.model(token.reshape(1, 1), cache=cache)[0, -1]
    return out


def compare(
    lm,
    tokens: list[int],
    mode: PackedMode,
    reference: list,
    *,
    group_size: int,
    free_run: bool = True,
    cancelled: Callable[[], bool] = lambda: False,
) -> dict:
    """Top-1 agreement and KL of `mode` against `reference` (and, with `free_run`, where
    free-running packed greedy output first differs)."""
    import mlx.core as mx

    cache, logits = prefill(lm, tokens, mode, group_size)
    agree, kls = 0, []
    for token, d_logp in reference:
        if cancelled():
            raise InterruptedError("the KV check was cancelled")
        p_logp = logits - mx.logsumexp(logits)
        kl = mx.sum(mx.exp(d_logp) * (d_logp - p_logp))
        same = mx.argmax(logits) == token
        mx.eval(kl, same)
        kls.append(max(item_float(kl), 0.0))
        agree += item_int(same)
        logits = lm.model(mx.array([[token]]), cache=cache)[0, -1]
    del cache
    result = {
        "prompt_tokens": len(tokens),
        "generated": len(reference),
        "mode": mode.label,
        "k_bits": mode.k_bits,
        "v_bits": mode.v_bits,
        "key_layout": mode.key_layout,
        "top1_agreement": agree / len(reference),
        "mean_kl": sum(kls) / len(kls),
        "max_kl": max(kls),
    }
    if free_run:
        free = _free_running(lm, tokens, len(reference), mode, group_size)
        result["free_running_first_difference"] = next(
            (i for i, ((a, _), b) in enumerate(zip(reference, free)) if a != b), None
        )
    return result


def _free_running(lm, tokens: list[int], gen: int, mode: PackedMode, group_size: int) -> list[int]:
    import mlx.core as mx

    cache, logits = prefill(lm, tokens, mode, group_size)
    out = []
    for _ in range(gen):
        token = mx.argmax(logits)
        out.append(item_int(token))
        logits = lm.model(token.reshape(1, 1), cache=cache)[0, -1]
    return out


# --- the self-test and its stored results ----------------------------------------------


def result_key(k_bits: int, v_bits: int, group_size: int) -> str:
    return f"K{k_bits}/V{v_bits} g{group_size}"


def verdict(result: dict) -> tuple[bool, str]:
    """Whether a measured precision passes, and why (in words for the app)."""
    top1, kl = result["top1_agreement"], result["mean_kl"]
    changed = round((1 - top1) * result["generated"])
    if top1 >= TOP1_MIN and kl <= KL_MAX:
        return True, f"kept {result['generated'] - changed} of {result['generated']} next-token choices (KL {kl:.3f})"
    why = f"changed {changed} of {result['generated']} next-token choices" if top1 < TOP1_MIN else ""
    if kl > KL_MAX:
        why += ("; " if why else "") + f"shifted the word probabilities (KL {kl:.3f} > {KL_MAX})"
    return False, why


class FidelityStore:
    """models/<id>/kv_fidelity.json: results by precision, for the current packing method."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / RESULTS_FILE

    def load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # damaged: measure again rather than trust it
            log.warning("ignoring %s: %s", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("method") != METHOD or not isinstance(data.get("results"), dict):
            return {}
        return {k: v for k, v in data["results"].items() if isinstance(v, dict) and _well_formed(v)}

    def save(self, results: dict) -> None:
        staged = self.path.with_name(self.path.name + ".tmp")
        try:
            staged.write_text(json.dumps({"method": METHOD, "results": results}, indent=1))
            os.replace(staged, self.path)
        except OSError as exc:  # a read-only model folder: the results hold for this run only
            log.warning("cannot store KV self-test results in %s: %s", self.path, exc)


def _well_formed(result: dict) -> bool:
    try:
        return 0 <= float(result["top1_agreement"]) <= 1 and float(result["mean_kl"]) >= 0 and result["generated"] > 0
    except (KeyError, TypeError, ValueError):
        return False


def selftest_tokens(lm) -> list[int]:
    tokens = lm.tokenizer.encode(resources.read_text(*SELFTEST_TEXT))
    return tokens[: max(2, lm.context_length - POSITIONS - 1)]


def run_selftest(
    lm,
    store: FidelityStore,
    precisions,
    *,
    group_size: int,
    until_pass: bool = False,
    progress: Callable[[str], None] = lambda message: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> dict:
    """Measure each precision not measured yet (in order; with `until_pass`, stop at the
    first that passes), store and return every result."""
    results = store.load()
    reference = None
    for k_bits, v_bits in packable(lm.config, precisions, group_size):
        key = result_key(k_bits, v_bits, group_size)
        if key not in results:
            progress(f"Checking {k_bits}-bit keys / {v_bits}-bit values on {lm.id} (once per model)…")
            tokens = selftest_tokens(lm)
            reference = reference or reference_run(lm, tokens, POSITIONS, group_size)
            result = compare(
                lm,
                tokens,
                PackedMode(k_bits, v_bits),
                reference,
                group_size=group_size,
                free_run=False,
                cancelled=cancelled,
            )
            result["passed"], result["why"] = verdict(result)
            results[key] = result
            store.save(results)
        if until_pass and results[key]["passed"]:
            break
    return results


def packable(config: dict, precisions, group_size: int) -> list[tuple[int, int]]:
    """The precisions this model can hold at all (packed values need groups dividing the
    head dimension): the others are never measured nor chosen."""
    from brisk.engine.api.errors import InvalidSettings
    from brisk.engine.kv.packed_cache import check_kv_packable

    fits = []
    for k_bits, v_bits in precisions:
        try:
            check_kv_packable(config, v_bits=v_bits, group_size=group_size)
        except InvalidSettings:
            continue
        fits.append((k_bits, v_bits))
    return fits


def needs_measuring(results: dict, precisions, group_size: int, until_pass: bool) -> bool:
    """Whether run_selftest would measure anything."""
    for k_bits, v_bits in precisions:
        result = results.get(result_key(k_bits, v_bits, group_size))
        if result is None:
            return True
        if until_pass and result["passed"]:
            return False
    return False


def auto_precision(results: dict, group_size: int) -> tuple[int, int]:
    """The smallest candidate that passed; 16-bit KV when none did."""
    for k_bits, v_bits in CANDIDATES:
        result = results.get(result_key(k_bits, v_bits, group_size))
        if result and result.get("passed"):
            return k_bits, v_bits
    return 16, 16


def checked_kv_settings(lm, settings, cancelled: Callable[[], bool]):
    """A turn's settings with packed KV as far as the model's self-test allows (a generator
    of events; returns the settings and what the test said, for the metrics' `kv_check`):
    `auto` takes the smallest precision that passed; a fixed one that failed is used and
    warned about."""
    from dataclasses import replace

    from brisk.engine.api.errors import TurnCancelled
    from brisk.engine.api.events import EngineWarned, PrefillProgressed

    precision, auto = settings.kv_precision(), settings.kv_auto
    if not auto and precision == (16, 16):
        return settings, ""
    group = settings.kv_group_size
    wanted = packable(lm.config, CANDIDATES if auto else [precision], group)
    store = FidelityStore(lm.path)
    if needs_measuring(store.load(), wanted, group, until_pass=auto):
        yield EngineWarned(
            f"Checking how packed KV changes {lm.id}'s answers (once per model, about {POSITIONS} tokens)…",
            kind="notice",
        )
        yield PrefillProgressed(0, POSITIONS, "kv_check")
    try:
        results = run_selftest(lm, store, wanted, group_size=group, until_pass=auto, cancelled=cancelled)
    except InterruptedError:
        raise TurnCancelled() from None
    if auto:
        precision = auto_precision(results, group)
        settings = replace(settings, k_bits=precision[0], v_bits=precision[1], kv_auto=False)
    result = results.get(result_key(precision[0], precision[1], group))
    if result is None:  # auto found nothing that passed, or this model cannot pack that precision
        return settings, "auto: no packed precision passed the self-test; 16-bit KV" if auto else ""
    said = f"K{precision[0]}/V{precision[1]} {'passed' if result['passed'] else 'failed'}: {result['why']}"
    if not result["passed"]:
        yield EngineWarned(
            f"{precision[0]}-bit keys / {precision[1]}-bit values on {lm.id}: the self-test "
            f"{result['why']}. Answers may differ from 16-bit KV; `auto` picks a precision that "
            "keeps them."
        )
    return settings, said
