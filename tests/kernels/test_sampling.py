"""The native temperature sampler draws from softmax(logits / t), as mlx-lm's does."""

import math

import mlx.core as mx
import numpy as np
import pytest

from brisk.engine.api.settings import ChatSettings
from brisk.engine.decode.sampling import make_sampling
from brisk.kernels import mlx_extension
from brisk.kernels.sampling import sample_softmax_native, sample_softmax_reference, temperature_sampler

pytestmark = pytest.mark.skipif(
    mlx_extension.load() is None, reason="the MLX primitives module does not build here (no compiler or headers)"
)


def _chi2_against(tokens: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """Pearson's statistic of the draws against `probs`, and its 0.001 critical value
    (Wilson-Hilferty); categories expected fewer than 5 times are pooled."""
    n = len(tokens)
    counts = np.bincount(tokens, minlength=len(probs))
    big = probs * n >= 5
    observed = [*counts[big], counts[~big].sum()]
    expected = [*(probs[big] * n), max(probs[~big].sum() * n, 1e-9)]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return stat, df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.6])
def test_draws_follow_the_softmax_at_the_temperature(temperature):
    rng = np.random.default_rng(int(temperature * 10))
    logits = rng.normal(0, 2, 37).astype(np.float32)  # 37: four blocks of 8 and a scalar tail
    probs = np.exp(logits / temperature - np.max(logits / temperature))
    probs /= probs.sum()
    mx.random.seed(7)
    tokens = np.asarray(sample_softmax_native(mx.broadcast_to(mx.array(logits), (30000, 37)), temperature))
    stat, critical = _chi2_against(tokens, probs)
    assert stat < critical, (stat, critical)
    # and a wrong temperature is told apart: the test has the power to fail
    wrong = np.exp(logits / (temperature * 1.5) - np.max(logits / (temperature * 1.5)))
    assert _chi2_against(tokens, wrong / wrong.sum())[0] > critical


def test_masked_and_nan_logits_are_never_drawn_anywhere_in_the_row():
    v = 1003  # the vector passes and the scalar tail both hold candidates
    logits = np.full(v, -np.inf, np.float32)
    logits[[4, 500, 1001]] = [1.0, 1.0, 1.0]
    logits[[7, 1002]] = np.nan
    mx.random.seed(3)
    tokens = np.asarray(sample_softmax_native(mx.broadcast_to(mx.array(logits), (3000, v)), 0.8))
    assert set(tokens.tolist()) == {4, 500, 1001}
    alone = np.full((1, v), -np.inf, np.float32)
    alone[0, 1001] = 5.0
    assert sample_softmax_native(mx.array(alone), 0.8).item() == 1001
    assert sample_softmax_native(mx.full((1, 9), -np.inf), 0.8).item() == 0  # nothing to draw


def test_the_seed_fixes_the_draws_and_shapes_match_mlx_lm():
    logits = mx.random.normal((2, 151936)) * 3  # Qwen's vocabulary
    mx.random.seed(11)
    first = sample_softmax_native(logits, 0.7)
    mx.random.seed(11)
    again = sample_softmax_native(logits, 0.7)
    assert mx.array_equal(first, again).item()
    want = sample_softmax_reference(logits, 0.7)
    assert first.shape == want.shape == (2,) and first.dtype == want.dtype == mx.uint32


def test_the_node_stays_lazy_inside_a_graph():
    logits = mx.random.normal((1, 64))
    token = sample_softmax_native(logits * 2.0, 0.7)  # built on an unevaluated product
    mx.async_eval(token)
    assert 0 <= token.item() < 64


def test_plain_decoding_samples_natively_at_a_bare_temperature_only():
    native, _ = make_sampling(ChatSettings(model="x", temperature=0.7))
    assert native.__module__ == "brisk.kernels.sampling"
    for filtered in (dict(top_p=0.9), dict(min_p=0.05), dict(top_k=20), dict(temperature=0.0)):
        sampler, _ = make_sampling(ChatSettings(model="x", **{"temperature": 0.7, **filtered}))
        assert sampler.__module__.startswith("mlx_lm"), filtered
    assert temperature_sampler(0.0) is None


def test_choosing_the_sampler_draws_nothing():
    """Picking the sampler must not advance MLX's random state: a seeded turn's draws would shift."""
    mx.random.seed(5)
    want = mx.random.uniform(shape=(4,))
    mx.random.seed(5)
    make_sampling(ChatSettings(model="x", temperature=0.7))
    assert mx.array_equal(mx.random.uniform(shape=(4,)), want).item()


@pytest.mark.parametrize("penalty", [1.0, 1.5])
def test_the_speculative_decoders_draws_follow_its_own_probabilities(penalty):
    """TokenDistribution.draw (the speculative decoder's plain and one-off steps) takes the
    kernel at a bare temperature, after the processors: its draws follow `probs`, the law
    the rejection test uses."""
    from brisk.engine.decode.sampling import TokenDistribution

    dist = TokenDistribution(ChatSettings(model="x", temperature=0.8, repetition_penalty=penalty))
    assert dist._native is not None
    rng = np.random.default_rng(3)
    logits = mx.array(rng.normal(0, 1.5, (1, 23)).astype(np.float32))
    history = [2, 5, 5, 9]
    probs = np.asarray(dist.probs(logits, history, []))[0].astype(np.float64)
    mx.random.seed(2)
    tokens = np.array([dist.draw(logits, history, []).item() for _ in range(6000)])
    stat, critical = _chi2_against(tokens, probs / probs.sum())
    assert stat < critical, (stat, critical)
