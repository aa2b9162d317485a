"""The compiled decode step (engine/decode/compiled.py) chooses the tokens mlx-lm's
generate_step chooses and leaves the same cache, on every architecture it is enabled for."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from brisk.engine.api.settings import ChatSettings
from brisk.engine.decode import compiled as compiled_decode
from brisk.engine.decode.compiled import ARCHITECTURES, compiled_steps, why_not_compiled
from brisk.engine.decode.plain import plain_steps
from brisk.engine.decode.sampling import make_sampling, needs_log_probabilities
from brisk.engine.kv import PromptCache
from brisk.engine.models.loader import load_folder
from brisk.kernels.fused_attention import mlx_attention_only
from tests.tiny_models import make_tiny_model_by_key

PROMPT = 250  # the decode crosses a 256-position buffer boundary: the step is traced again


CHECKED = ["llama", "qwen2", "qwen3", "llama-q4", "qwen2-q5"]  # tiny models each parity test runs on


@pytest.fixture(scope="module", params=CHECKED)
def tiny(request, tmp_path_factory):
    key = request.param
    return load_folder(make_tiny_model_by_key(tmp_path_factory.mktemp(key) / key, key), model_id=key)


def _prefilled(model, n=PROMPT):
    layers = make_prompt_cache(model)
    prompt = mx.array([[(i * 37) % 300 + 3 for i in range(n)]])
    model(prompt, cache=layers)
    mx.eval([layer.state for layer in layers])
    return layers


def _prefilled_unequal(model):
    layers = _prefilled(model)
    layers[-1].trim(7)  # as UniPrefill leaves them: deeper layers hold fewer tokens
    return layers


def _reference(model, n, *, sampler, processors=None, seed=None, prefill=_prefilled):
    layers = prefill(model)
    if seed is not None:
        mx.random.seed(seed)
    steps = generate_step(
        mx.array([5]), model, max_tokens=n, sampler=sampler, logits_processors=processors, prompt_cache=layers
    )
    return [int(t) for t, _ in steps], layers


def _compiled(model, n, *, sampler, processors=(), seed=None, take=None, prefill=_prefilled, normalize=True):
    layers = prefill(model)
    if seed is not None:
        mx.random.seed(seed)
    steps = compiled_steps(
        model, layers, 5, max_tokens=n, sampler=sampler, processors=list(processors), normalize=normalize
    )
    tokens = [t for _, t in zip(range(take or n), steps)]
    steps.close()
    return tokens, layers


def _same_cache(a, b):
    assert [x.offset for x in a] == [y.offset for y in b]
    for x, y in zip(a, b):
        for u, v in ((x.keys, y.keys), (x.values, y.values)):
            u, v = u[..., : x.offset, :], v[..., : y.offset, :]
            assert mx.allclose(u, v, atol=1e-4, rtol=1e-4).item()


def test_every_enabled_architecture_is_checked_here():
    # enabling one more in engine/decode/compiled.py without a parity run here fails
    assert ARCHITECTURES == {key.partition("-q")[0] for key in CHECKED}


def test_greedy_tokens_and_cache_match_generate_step(tiny):
    greedy = lambda logprobs: mx.argmax(logprobs, axis=-1)  # noqa: E731
    assert why_not_compiled(tiny.model, _prefilled(tiny.model), kv_bits=(16, 16)) is None
    want, want_layers = _reference(tiny.model, 12, sampler=greedy)
    got, got_layers = _compiled(tiny.model, 12, sampler=greedy)
    assert got == want
    assert len(set(want)) > 1  # a model that varies its answer, or the test proves little
    _same_cache(got_layers, want_layers)
    assert got_layers[0].offset == PROMPT + 1 + 12  # the first token and every yielded one
    assert got_layers[0].keys.shape[2] == 512  # grown past 256 once


def test_layers_holding_unequal_counts_each_write_at_their_own_offset(tiny_llama):
    greedy = lambda logprobs: mx.argmax(logprobs, axis=-1)  # noqa: E731
    want, want_layers = _reference(tiny_llama.model, 10, sampler=greedy, prefill=_prefilled_unequal)
    got, got_layers = _compiled(tiny_llama.model, 10, sampler=greedy, prefill=_prefilled_unequal)
    assert got == want
    _same_cache(got_layers, want_layers)
    assert got_layers[0].offset - got_layers[-1].offset == 7


def test_sampling_with_a_penalty_matches_generate_step(tiny):
    sampler, processors = make_sampling(ChatSettings(model="x", temperature=0.9, repetition_penalty=1.3, top_p=0.95))
    want, _ = _reference(tiny.model, 10, sampler=sampler, processors=processors, seed=11)
    got, _ = _compiled(tiny.model, 10, sampler=sampler, processors=processors, seed=11)
    assert got == want


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0.0),
        dict(temperature=0.9),
        dict(temperature=0.9, min_p=0.05, top_k=20),
        dict(temperature=0.9, repetition_penalty=1.3),
    ],
)
def test_samplers_that_take_logits_choose_what_generate_step_chooses(tiny, settings):
    """The step skips normalizing the logits (an exp over the vocabulary per token) where
    the sampler picks the same tokens from logits: same seed, same tokens as generate_step."""
    chat = ChatSettings(model="x", **settings)
    assert not needs_log_probabilities(chat)
    sampler, processors = make_sampling(chat)
    want, _ = _reference(tiny.model, 10, sampler=sampler, processors=processors, seed=5)
    got, _ = _compiled(tiny.model, 10, sampler=sampler, processors=processors, seed=5, normalize=False)
    assert got == want


def test_only_top_p_needs_log_probabilities():
    assert needs_log_probabilities(ChatSettings(model="x", temperature=0.7, top_p=0.9))
    assert not needs_log_probabilities(ChatSettings(model="x", temperature=0.0, top_p=0.9))  # argmax
    assert not needs_log_probabilities(ChatSettings(model="x", temperature=0.7, top_p=1.0))


def test_plain_turns_hand_the_sampler_logits_unless_it_needs_log_probabilities(tiny_llama, monkeypatch):
    from brisk.engine.decode import plain as plain_decode

    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs["normalize"])
        return compiled_steps(*args, **kwargs)

    monkeypatch.setattr(plain_decode, "compiled_steps", recording)
    for top_p in (1.0, 0.9):
        _plain_turn(tiny_llama, ChatSettings(model="x", temperature=0.7, top_p=top_p), {})
    assert seen == [False, True]


def test_mlx_attention_masks_the_spare_positions(tiny_llama):
    greedy = lambda logprobs: mx.argmax(logprobs, axis=-1)  # noqa: E731
    want, _ = _reference(tiny_llama.model, 10, sampler=greedy)
    with mlx_attention_only():
        got, _ = _compiled(tiny_llama.model, 10, sampler=greedy)
    assert got == want


def test_closing_early_leaves_the_yielded_tokens_in_the_cache(tiny_llama):
    greedy = lambda logprobs: mx.argmax(logprobs, axis=-1)  # noqa: E731
    want, want_layers = _reference(tiny_llama.model, 4, sampler=greedy)
    got, got_layers = _compiled(tiny_llama.model, 50, sampler=greedy, take=4)
    assert got == want
    _same_cache(got_layers, want_layers)
    # and the cache goes on as an ordinary KVCache
    more = mx.array([[7, 8]])
    assert mx.allclose(
        tiny_llama.model(more, cache=got_layers), tiny_llama.model(more, cache=want_layers), atol=1e-4
    ).item()


def test_what_is_left_to_generate_step(tiny_llama, tmp_path):
    model = tiny_llama.model
    assert "packed KV" in why_not_compiled(model, _prefilled(model), kv_bits=(4, 16))
    assert "plain, filled KVCache" in why_not_compiled(model, make_prompt_cache(model), kv_bits=(16, 16))
    gemma = load_folder(make_tiny_model_by_key(tmp_path / "g", "gemma3_text"), model_id="g")
    assert "gemma3" in why_not_compiled(gemma.model, _prefilled(gemma.model, 20), kv_bits=(16, 16))


def _plain_turn(lm, settings, report):
    cache = PromptCache(lm.model)
    tokens = [(i * 37) % 300 + 3 for i in range(40)]
    cache.layers = make_prompt_cache(lm.model)
    lm.model(mx.array([tokens[:-1]]), cache=cache.layers)
    steps = plain_steps(tokens, cache, 8, settings, report)
    out = [t for t, _ in steps]
    return out, cache


def test_a_step_that_cannot_be_traced_falls_back_to_generate_step(tiny_llama, monkeypatch):
    settings = ChatSettings(model="x", temperature=0.0)
    compiled: dict = {}
    want, want_cache = _plain_turn(tiny_llama, settings, compiled)
    assert compiled["decode_step"] == "compiled"

    def untraceable(model, *, normalize):
        def step(*args):
            raise ValueError("[compile] an eval inside the trace")

        return step

    monkeypatch.setattr(compiled_decode, "traced_step", untraceable)
    fell_back: dict = {}
    got, got_cache = _plain_turn(tiny_llama, settings, fell_back)
    assert fell_back["decode_step"].startswith("mlx-lm: the compiled step failed (ValueError")
    assert got == want
    assert got_cache.tokens == want_cache.tokens and got_cache.tokens[40:] == got
    _same_cache(got_cache.layers, want_cache.layers)


def test_the_speculative_decoders_plain_runs_replay_the_compiled_step(tiny_llama):
    from brisk.engine.api.session import Session

    def answer(**kw):
        session = Session(tiny_llama, ChatSettings(model="tiny", temperature=0.0, max_tokens=30, **kw))
        return next(e for e in session.send("The quick brown fox") if type(e).__name__ == "TurnFinished")

    plain, lookup = answer(spec_decode="off"), answer(spec_decode="on", lookup=True)
    assert lookup.metrics.spec_decode.startswith("on (lookup)")
    assert lookup.metrics.decode_step == "compiled"
    assert lookup.token_ids == plain.token_ids
    packed = answer(spec_decode="on", lookup=True, k_bits=8, v_bits=16, kv_quant_start=0)
    assert packed.metrics.decode_step == "model calls: a packed KV cache (it is repacked between tokens)"


def test_the_overhead_bench_runs_brisk_without_speculation(tiny_llama):
    from brisk.bench.overhead import _brisk_run

    run = _brisk_run(tiny_llama, "The quick brown fox", 6, 512)
    assert run["spec_decode"] == "off" and run["decode_step"] == "compiled"
