"""A turn's prompt read: everything but the last prompt token into the prompt cache, by
the prefill the router picks (engine/accel/router.py): dense chunks, SpecPrefill's kept
runs, or UniPrefill's layer-by-layer drops. Progress events come out between chunks or
layers, where cancellation is checked; a half-built sparse cache is never kept."""

from __future__ import annotations

import time
from typing import Generator, Iterator

import engine.info
from engine.accel.coverage import coverage_map
from engine.accel.router import route_prefill_steps
from engine.accel.specprefill.scoring import sparse_prefill
from engine.accel.uniprefill.flops import flops_saved
from engine.accel.uniprefill.plan import make_uniprefill
from engine.accel.uniprefill.prefill import UniPrefillUnsupported
from engine.events import EngineWarned, PrefillProgressed
from engine.prefill import check_prefill_memory, prefill_chunks


class TurnPrefill:
    def __init__(self, lm, cache, pair):
        self.lm, self.cache, self.pair = lm, cache, pair  # target, its PromptCache, the DraftPair or None

    def run(self, tokens, cached, settings, metrics, cancel, pack) -> Iterator[object]:
        """All prompt tokens but the last into the cache (generate_step runs the last one):
        dense chunks, SpecPrefill's kept runs or UniPrefill's layer-by-layer drops, as the
        router picks (engine/accel/router.py)."""
        step = min(settings.prefill_step_size, max(len(tokens) - cached - 1, 1))
        check_prefill_memory(self.lm, step, len(tokens), engine.info.memory_available())
        route = yield from route_prefill_steps(self.pair, self.lm, self.cache.layers, tokens, cached, settings)
        plan = route.spec
        metrics.sparse_prefill, metrics.sparse_outcome, metrics.scoring_s = plan.note, plan.outcome, plan.scoring_s
        metrics.prefill_method, metrics.prefill_route = route.method, route.reason
        if plan.warning:
            yield EngineWarned(plan.warning, "sparse_prefill")
        if route.method == "uniprefill" and (
            yield from self._uniprefill(tokens, cached, settings, metrics, cancel, pack)
        ):
            return
        if route.method == "specprefill":
            yield from self._specprefill(plan.selection, tokens, cached, settings, metrics, cancel, pack)
        else:  # dense, or UniPrefill declined: from what the cache holds now
            yield from self._dense(tokens, metrics.cached_tokens, settings, metrics, cancel, pack)

    def _dense(self, tokens, cached, settings, metrics, cancel, pack) -> Iterator[object]:
        for done in prefill_chunks(
            self.cache.model_view(), self.cache.layers, tokens[cached:-1], settings.prefill_step_size
        ):
            self.cache.tokens = tokens[: cached + done]
            pack()
            yield PrefillProgressed(done, metrics.prefilled_tokens)
            cancel.check()

    def _specprefill(self, selection, tokens, cached, settings, metrics, cancel, pack) -> Iterator[object]:
        suffix = tokens[cached:]
        started = time.perf_counter()
        runs = [(s, min(e, len(suffix) - 1)) for s, e in selection.runs if s < len(suffix) - 1]
        yield PrefillProgressed(0, selection.kept, "kept")
        try:
            for done in sparse_prefill(
                self.lm.model, self.cache.layers, suffix, runs, base=cached, step=settings.prefill_step_size
            ):
                pack()
                yield PrefillProgressed(done, selection.kept, "kept")
                cancel.check()
        except BaseException:
            self.cache.reset()  # a half-built sparse cache has no consistent prefix to keep
            raise
        self.cache.mark_sparse(tokens[:-1])
        metrics.sparse_prefill_s = time.perf_counter() - started
        metrics.prefilled_tokens = selection.kept
        metrics.kept_tokens = selection.kept
        metrics.coverage = coverage_map(self.lm.tokenizer, suffix[:-1], [(-1, runs)])

    def _uniprefill(self, tokens, cached, settings, metrics, cancel, pack) -> Generator[object, None, bool]:
        """UniPrefill of tokens[cached:-1]; returns False when it cannot run on this model:
        the turn is warned and the caller prefills densely from what the cache still holds
        (all of it when the model was declined before any layer ran, as it usually is)."""
        new = len(tokens) - 1 - cached
        runner = make_uniprefill(self.lm, self.cache.layers, settings)
        started = time.perf_counter()
        layers = len(self.lm.model.layers)
        try:
            for done in runner.run(tokens[cached:-1], base=cached):
                yield PrefillProgressed(new * done // layers, metrics.prefilled_tokens)
                cancel.check()
        except UniPrefillUnsupported as exc:
            if runner.layer_tokens:  # some layers ran: their caches hold tokens the others lack
                self._restart_cache(tokens, settings, metrics)
            metrics.prefill_method, metrics.prefill_route = "dense", f"dense: UniPrefill unsupported ({exc})"
            yield EngineWarned(f"UniPrefill cannot run on this model, reading the prompt densely: {exc}", "uniprefill")
            return False
        except BaseException:
            self.cache.reset()  # layers hold different numbers of tokens: no consistent prefix to keep
            raise
        self.cache.mark_sparse(tokens[:-1])
        pack()
        metrics.uniprefill_s = time.perf_counter() - started
        metrics.drops = [[r.layer, r.before, r.kept] for r in runner.reports]
        metrics.coverage = coverage_map(
            self.lm.tokenizer, tokens[cached:-1], [(r.layer, r.kept_runs) for r in runner.reports]
        )
        metrics.kept_tokens = runner.reports[-1].kept if runner.reports else new
        metrics.flops_saved = flops_saved(self.lm.config, runner.layer_tokens, cached)
        return True

    def _restart_cache(self, tokens, settings, metrics) -> None:
        """Start the cache over after a sparse prefill half-filled it."""
        self.cache.reset()
        self.cache.ensure_mode(settings.kv_mode())
        metrics.cached_tokens = self.cache.reuse(tokens)
        metrics.prefilled_tokens = len(tokens) - metrics.cached_tokens
