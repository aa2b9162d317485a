"""Speculation weighs a verify pass by the costs of the device the kernel plan names
(engine/accel/speculative/device_costs.py): priors per kind, measured once on a GPU. Costs
are injected here; nothing is timed by the wall clock."""

from types import SimpleNamespace

import mlx.core as mx
import pytest

from brisk.engine.accel.speculative import device_costs
from brisk.engine.accel.speculative.autopilot import SpeculationAutopilot
from brisk.engine.accel.speculative.device_costs import (
    KINDS,
    PRIORS,
    cost_key,
    device_kind,
    extra_position_from,
    measure_extra_position,
    verify_cost,
)
from brisk.engine.accel.speculative.lookup import LookupOffer
from brisk.engine.accel.speculative.pair import position_cost
from brisk.kernels import plan as kernel_plan
from brisk.kernels.plan import Cpu, decide

ZEN4 = Cpu("test CPU", "x86_64", frozenset("avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni".split()))


def _plan(device: str, **environ: str):
    return decide(device=device, cpu=ZEN4, environ=environ)


@pytest.fixture(autouse=True)
def _fresh_measurements():
    device_costs.forget_measured()
    yield
    device_costs.forget_measured()


def test_each_plan_names_its_kind():
    assert device_kind(_plan("cpu")) == "cpu"
    assert device_kind(_plan("cpu", BRISK_KERNELS="off")) == "cpu-mlx"
    assert device_kind(_plan("cpu", BRISK_NATIVE_KERNELS="0")) == "cpu"  # float32 on the BLAS: compute-bound too
    assert device_kind(_plan("gpu")) == "gpu"
    assert device_kind(_plan("gpu", BRISK_KERNELS="portable")) == "gpu"
    assert set(PRIORS) == set(KINDS)


def test_a_gpu_is_measured_once_per_model_and_the_cpus_use_their_priors():
    calls = []

    def measure(model):
        calls.append(model)
        return 0.02

    for kind_plan in (_plan("cpu"), _plan("cpu", BRISK_KERNELS="off")):
        assert verify_cost("m", "model", plan=kind_plan, measure=measure) == PRIORS[device_kind(kind_plan)]
    assert calls == []  # seconds of a CPU model's passes are not spent on a prior
    gpu = _plan("gpu")
    first = verify_cost("m", "model", plan=gpu, measure=measure)
    assert first.extra_position == 0.02 and first.source.startswith("measured")
    assert verify_cost("m", "model", plan=gpu, measure=measure) is first
    assert verify_cost("other", "model 2", plan=gpu, measure=measure).extra_position == 0.02
    assert calls == ["model", "model 2"]


def test_a_measurement_that_fails_falls_back_to_the_prior_once():
    calls = []

    def broken(model):
        calls.append(model)
        raise RuntimeError("no such kernel")

    gpu = _plan("gpu")
    assert verify_cost("m", "model", plan=gpu, measure=broken) == PRIORS["gpu"]
    assert verify_cost("m", "model", plan=gpu, measure=broken) == PRIORS["gpu"]
    assert calls == ["model"]


def test_the_measurement_compares_medians_of_one_and_several_positions():
    """A fake model whose pass of n positions advances a fake clock by 10 + 3 (n - 1) ms,
    with a stall in one round: 0.3 of a step per extra position."""
    clock = SimpleNamespace(now=0.0, passes=[])

    class Model:
        layers: list = []

        def make_cache(self):
            return []

        def __call__(self, tokens, cache=None):
            n = tokens.shape[1]
            clock.passes.append(n)
            stall = 0.5 if len(clock.passes) == 4 else 0.0  # the first timed pass of one position
            clock.now += 0.010 + 0.003 * (n - 1) + stall
            return mx.zeros((1, n, 4))

    got = measure_extra_position(Model(), positions=5, rounds=3, clock=lambda: clock.now)
    assert got == pytest.approx(0.3)
    assert clock.passes == [device_costs.PROBE_PREFIX, 1, 5, 1, 1, 1, 5, 5, 5]
    assert extra_position_from(0.01, 0.005, 5) == 0.0  # a wider pass timed faster: noise
    with pytest.raises(ValueError):
        extra_position_from(0.01, 0.02, 1)


def test_lookups_verify_long_on_a_gpu_shorter_on_the_cpu_kernels_and_not_on_mlx_s_cpu():
    """The same acceptance and plain step: only the device's verify cost differs."""
    offer = LookupOffer(list(range(12)), 8)
    picks = {}
    for kind in KINDS:
        pilot = SpeculationAutopilot("auto", 4, has_draft=False, lookup=True, position_cost=PRIORS[kind].extra_position)
        for _ in range(3):
            pilot.observe_plain(0.010)
        for hit in [1, 1, 1, 0] * 5:  # a lookup right three times in four
            pilot.observe_lookup_scout(offer, offer.tokens[0] if hit else -1)
        picks[kind] = pilot.pick(offer, draft_usable=False)
    assert picks["gpu"][0] == picks["cpu"][0] == "lookup"
    assert picks["gpu"][1] > picks["cpu"][1] >= 1
    assert picks["cpu-mlx"] == ("plain", 0)


def test_the_pair_asks_the_plan_s_device(monkeypatch):
    target = SimpleNamespace(id="tiny", model="the model")
    monkeypatch.setitem(kernel_plan._current, "plan", _plan("gpu"))
    monkeypatch.setattr(device_costs, "measure_extra_position", lambda model: 0.07)
    assert position_cost(target) == 0.07
    assert cost_key(target.model) == "gpu"  # costs timed on a CPU say nothing about a GPU's
    monkeypatch.setitem(kernel_plan._current, "plan", _plan("cpu", BRISK_KERNELS="off"))
    assert position_cost(target) == PRIORS["cpu-mlx"].extra_position
    assert cost_key(target.model) == "cpu-mlx"  # not the float32 BLAS path's "blas"
