"""A turn's prompt read: everything but the last prompt token into the prompt cache, by
the prefill the router picks (engine/accel/router.py): dense chunks, SpecPrefill's kept
runs, or UniPrefill's layer-by-layer drops. Progress events come out between chunks or
layers, where cancellation is checked; a half-built sparse cache is never kept."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Generator, Iterator, TypeVar

import brisk.engine.runtime.info
from brisk.engine.accel.coverage import coverage_map
from brisk.engine.accel.router import route_prefill_steps
from brisk.engine.accel.specprefill.scoring import sparse_prefill
from brisk.engine.accel.uniprefill.flops import flops_saved
from brisk.engine.accel.uniprefill.plan import make_uniprefill
from brisk.engine.accel.uniprefill.prefill import UniPrefillUnsupported
from brisk.engine.api.events import EngineWarned, PrefillProgressed
from brisk.engine.turn.dense_prefill import check_prefill_memory, prefill_chunks
from brisk.engine.turn.prefill_eta import LayerEta, PrefillEta, attention_ratio

Result = TypeVar("Result")


class TurnPrefill:
    """The prompt read in two phases, `route` then `read`; each returns what it did as
    TurnMetrics fields (a dict the session applies) rather than writing into the metrics."""

    def __init__(self, lm, cache, pair, *, clock=time.perf_counter):
        self.lm, self.cache, self.pair = lm, cache, pair  # target, its PromptCache, the DraftPair or None
        self._clock = clock
        ratio = attention_ratio(lm.config)
        draft = attention_ratio(pair.draft.config) if pair is not None else ratio
        # each progress event carries the phase's time left (engine/turn/prefill_eta.py); `base`
        # (the cached tokens, whose keys every new token reads) is set when the read starts
        self.eta = PrefillEta({"prompt": ratio, "kept": ratio, "draft": draft})

    def _progress(self, done: int, total: int, phase: str = "prompt") -> PrefillProgressed:
        return PrefillProgressed(done, total, phase, self.eta.update(self._clock(), done, total, phase))

    def _estimated(self, steps: Generator[object, None, Result]) -> Generator[object, None, Result]:
        """`steps`' events, their progress with this turn's estimate; its return value passed on."""
        try:
            while True:
                try:
                    event = next(steps)
                except StopIteration as stop:
                    return stop.value
                if isinstance(event, PrefillProgressed):
                    left = self.eta.update(self._clock(), event.done, event.total, event.phase)
                    event = replace(event, seconds_left=left)
                yield event
        finally:
            steps.close()

    def route(self, tokens, cached, settings, *, asked=()) -> Generator[object, None, tuple[object, dict]]:
        """Which prefill reads this prompt (engine/accel/router.py; SpecPrefill scores here),
        and that choice as metrics fields, known before the read starts (a cancelled read
        still reports its method). `asked`: the question kinds of the chat (router.asked_kinds)."""
        step = min(settings.prefill_step_size, max(len(tokens) - cached - 1, 1))
        check_prefill_memory(self.lm, step, len(tokens), brisk.engine.runtime.info.memory_available())
        self.eta.base = cached
        route = yield from self._estimated(
            route_prefill_steps(self.pair, self.lm, self.cache.layers, tokens, cached, settings, asked=asked)
        )
        plan = route.spec
        if plan.warning:
            yield EngineWarned(plan.warning, "sparse_prefill")
        return route, {
            "sparse_prefill": plan.note,
            "sparse_outcome": plan.outcome,
            "scoring_s": plan.scoring_s,
            "prefill_method": route.method,
            "prefill_route": route.reason,
        }

    def read(self, route, tokens, cached, settings, cancel, pack) -> Generator[object, None, dict]:
        """All prompt tokens but the last into the cache (generate_step runs the last one):
        dense chunks, SpecPrefill's kept runs or UniPrefill's layer-by-layer drops."""
        results: dict = {}
        if route.method == "uniprefill":
            ran, results = yield from self._uniprefill(tokens, cached, settings, cancel, pack, route)
            if ran:
                return results
            cached = results.get("cached_tokens", cached)  # UniPrefill declined: dense from what the cache holds
        if route.method == "specprefill":
            return (yield from self._specprefill(route, tokens, cached, settings, cancel, pack))
        yield from self._dense(tokens, cached, settings, cancel, pack)
        return results

    def _dense(self, tokens, cached, settings, cancel, pack) -> Iterator[object]:
        total = len(tokens) - cached
        self.eta.base = cached
        self._progress(0, total)  # the phase's clock starts (the session said 0 already)
        for done in prefill_chunks(
            self.cache.model_view(), self.cache.layers, tokens[cached:-1], settings.prefill_step_size
        ):
            self.cache.tokens = tokens[: cached + done]
            pack()
            yield self._progress(done, total)
            cancel.check()

    def _specprefill(self, route, tokens, cached, settings, cancel, pack) -> Generator[object, None, dict]:
        selection, suffix = route.spec.selection, tokens[cached:]
        started = time.perf_counter()
        runs = [(s, min(e, len(suffix) - 1)) for s, e in selection.runs if s < len(suffix) - 1]
        self.eta.base = cached
        yield self._progress(0, selection.kept, "kept")
        try:
            for done in sparse_prefill(
                self.lm.model, self.cache.layers, suffix, runs, base=cached, step=settings.prefill_step_size
            ):
                pack()
                yield self._progress(done, selection.kept, "kept")
                cancel.check()
        except BaseException:
            self.cache.reset()  # a half-built sparse cache has no consistent prefix to keep
            raise
        self.cache.mark_sparse(tokens[:-1])
        return {
            "sparse_prefill_s": time.perf_counter() - started,
            "prefilled_tokens": selection.kept,
            "kept_tokens": selection.kept,
            "coverage": coverage_map(
                self.lm.tokenizer, suffix[:-1], [(-1, runs)], method="specprefill", focus=route.focus
            ),
        }

    def _uniprefill(self, tokens, cached, settings, cancel, pack, route) -> Generator[object, None, tuple[bool, dict]]:
        """UniPrefill of tokens[cached:-1]: (True, its results), or (False, why) when it
        cannot run on this model: the turn is warned and the caller prefills densely from
        what the cache still holds (all of it when the model was declined before any layer
        ran, as it usually is; else the cache starts over and the results say so)."""
        new = len(tokens) - 1 - cached
        runner = make_uniprefill(self.lm, self.cache.layers, settings)
        if route.keep_focus:  # `auto` reads the passages the question points at in full
            runner.keep_runs([(cached + s, cached + e) for s, e in route.focus])
        started = time.perf_counter()
        layers = len(self.lm.model.layers)
        eta = LayerEta(attention_ratio(self.lm.config), layers=layers, drop_layers=[], base=cached)
        eta.start(self._clock(), new)
        try:
            for done in runner.run(tokens[cached:-1], base=cached):
                eta.drop_layers = sorted(runner.drop_layers or [])  # chosen once the run has started
                report = runner.reports[-1] if runner.reports and runner.reports[-1].layer == done - 1 else None
                left = eta.update(self._clock(), done, runner.layer_tokens[-1], report.kept if report else None)
                yield PrefillProgressed(new * done // layers, len(tokens) - cached, seconds_left=left)
                cancel.check()
        except UniPrefillUnsupported as exc:
            declined = {"prefill_method": "dense", "prefill_route": f"dense: UniPrefill unsupported ({exc})"}
            if runner.layer_tokens:  # some layers ran: their caches hold tokens the others lack
                declined.update(self._restart_cache(tokens, settings))
            yield EngineWarned(f"UniPrefill cannot run on this model, reading the prompt densely: {exc}", "uniprefill")
            return False, declined
        except BaseException:
            self.cache.reset()  # layers hold different numbers of tokens: no consistent prefix to keep
            raise
        self.cache.mark_sparse(tokens[:-1])
        pack()
        return True, {
            "uniprefill_s": time.perf_counter() - started,
            "drops": [[r.layer, r.before, r.kept] for r in runner.reports],
            "coverage": coverage_map(
                self.lm.tokenizer,
                tokens[cached:-1],
                [(r.layer, r.kept_runs) for r in runner.reports],
                method="uniprefill",
                focus=route.focus,
            ),
            "kept_tokens": runner.reports[-1].kept if runner.reports else new,
            "flops_saved": flops_saved(self.lm.config, runner.layer_tokens, cached),
        }

    def _restart_cache(self, tokens, settings) -> dict:
        """Start the cache over after a sparse prefill half-filled it."""
        self.cache.reset()
        self.cache.ensure_mode(settings.kv_mode())
        cached = self.cache.reuse(tokens)
        return {"cached_tokens": cached, "prefilled_tokens": len(tokens) - cached}
