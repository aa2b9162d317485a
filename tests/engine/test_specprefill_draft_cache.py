"""SpecPrefill's draft cache across turns: the lookahead tokens come back out of it, also
for layers that cannot trim (recurrent state, a sliding window that has wrapped), and also
when scoring fails, so the next turn's draft reads only the new tokens."""

import contextlib

import mlx.core as mx
import pytest

from brisk.engine.accel.specprefill import scoring
from brisk.engine.accel.specprefill.scoring import OBSERVATION_WINDOW, DraftScorer
from brisk.engine.api.events import PrefillProgressed, TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model_by_key

DOC = (
    "Report on regional water use. The northern districts used more water while the southern "
    "reservoirs stayed full. Engineers proposed new pipes. "
) * 6
FOLLOW_UP = " Which districts used more water, and what did the engineers propose? " + DOC[:300]
# nemotron_h: recurrent (Mamba) layers beside attention; gemma3_text: a 16-token sliding
# window, wrapped long before DOC ends; llama: every layer trims
ARCHS = ["llama", "nemotron_h", "gemma3_text"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft-cache")
    return {arch: load_folder(make_tiny_model_by_key(root / arch, arch, seed=1, context_length=2048)) for arch in ARCHS}


def held(arch, tokens):
    """What the draft holds after scoring `tokens`: all of them where every layer trims, else
    all but the last, as the drafter reads a prompt (its first proposal feeds the last)."""
    return tokens if arch == "llama" else tokens[:-1]


def score(scorer, tokens, start):
    """The scores and how many tokens the draft said it had to read."""
    steps, reads = scorer.importance_steps(tokens, start, 64), []
    while True:
        try:
            event = next(steps)
        except StopIteration as stop:
            return stop.value, reads
        if isinstance(event, PrefillProgressed) and event.phase == "draft" and event.done == 0:
            reads.append(event.total)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_next_turn_reads_only_its_new_tokens_and_scores_as_a_fresh_draft(models, arch):
    draft = models[arch]
    first = draft.tokenizer.encode(DOC)
    both = first + draft.tokenizer.encode(FOLLOW_UP)
    kept = DraftScorer(draft)
    score(kept, first, 0)
    assert kept.cache.tokens == held(arch, first)
    got, reads = score(kept, both, len(first))
    want, fresh_reads = score(DraftScorer(draft), both, len(first))
    # the conversation is not read again
    assert reads == [len(both) - OBSERVATION_WINDOW - len(held(arch, first))]
    assert fresh_reads == [len(both) - OBSERVATION_WINDOW]
    assert got.shape == want.shape == (len(both) - len(first),)
    assert mx.allclose(got, want, rtol=2e-2, atol=1e-6).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_scoring_failure_leaves_the_draft_cache_holding_the_prompt(models, arch, monkeypatch):
    """The lookahead ran, then scoring failed: the cache must not keep the lookahead's tokens
    while saying it holds the prompt (the next turn would read on from a state no prompt gives)."""
    draft = models[arch]
    first = draft.tokenizer.encode(DOC)
    both = first + draft.tokenizer.encode(FOLLOW_UP)
    scorer = DraftScorer(draft)

    def fails(*args, **kwargs):
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(scoring, "layer_importance", fails)
    with pytest.raises(RuntimeError, match="scoring failed"):
        score(scorer, first, 0)
    monkeypatch.undo()
    assert scorer.cache.tokens == held(arch, first)
    got, reads = score(scorer, both, len(first))
    want, _ = score(DraftScorer(draft), both, len(first))
    assert reads == [len(both) - OBSERVATION_WINDOW - len(held(arch, first))]
    assert mx.allclose(got, want, rtol=2e-2, atol=1e-6).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_lookahead_step_that_fails_partway_leaves_no_layer_holding_its_token(models, arch, monkeypatch):
    """The second lookahead step fails inside the draft's forward, after its first attention
    layer took the token: that layer must not keep it (trimming one token per finished step
    left it there, and the next turn scored from a cache no prompt gives)."""
    draft = models[arch]
    first = draft.tokenizer.encode(DOC)
    both = first + draft.tokenizer.encode(FOLLOW_UP)
    scorer = DraftScorer(draft)
    real, forwards = scoring.capture_attention, []

    @contextlib.contextmanager
    def failing_in_the_second_step(model, sink):
        forwards.append(model)  # the observation window, then one forward per lookahead step

        class Sink(list):
            def append(self, item):
                if len(forwards) == 3 and self:  # the step's second attention call
                    raise RuntimeError("failed partway")
                super().append(item)
                sink.append(item)

        with real(model, Sink()):
            yield

    monkeypatch.setattr(scoring, "capture_attention", failing_in_the_second_step)
    with pytest.raises(RuntimeError, match="failed partway"):
        score(scorer, first, 0)
    monkeypatch.undo()
    assert scorer.cache.tokens == held(arch, first)
    assert all(layer.offset == len(held(arch, first)) for layer in scorer.cache.layers if hasattr(layer, "offset"))
    got, _ = score(scorer, both, len(first))
    want, _ = score(DraftScorer(draft), both, len(first))
    assert mx.allclose(got, want, rtol=2e-2, atol=1e-6).item()


@pytest.mark.parametrize("arch", ["nemotron_h", "gemma3_text"])
def test_speculative_decoding_after_a_sparse_prefill_does_not_read_the_prompt_again(models, arch, monkeypatch):
    """Scoring and drafting share the draft's cache. The drafter holds a prompt but its last
    token; a scorer that left the last one in a cache that cannot trim made the drafter's
    first step start the draft over and read the whole conversation a second time."""
    target, draft = models["llama"], models[arch]
    model_class, reads = type(draft.model), []
    real_call = model_class.__call__

    def counting(self, inputs, *args, **kwargs):
        if self is draft.model and inputs.shape[1] > 1:
            reads.append(inputs.shape[1])  # a prefill (drafting feeds a token or a few at a time)
        return real_call(self, inputs, *args, **kwargs)

    monkeypatch.setattr(model_class, "__call__", counting)
    settings = ChatSettings(
        model="m",
        temperature=0.0,
        max_tokens=8,
        prefill_step_size=64,
        sparse_prefill="on",
        sparse_keep=0.3,
        spec_decode="on",
        num_draft=4,
    )
    events = list(Session(target, settings, draft=draft).send(DOC))
    done = next(e for e in events if isinstance(e, TurnFinished))
    assert done.metrics.sparse_outcome == "used"
    assert sum(r for r in reads if r >= 16) <= done.metrics.prompt_tokens  # each prompt token read once


@pytest.mark.parametrize("arch", ARCHS)
def test_an_observation_window_read_that_fails_partway_leaves_the_cache_as_it_was(models, arch, monkeypatch):
    """The read of the prompt's last tokens fails after the draft's first attention layer took
    them: the cache must hold what it says (the prompt before them), not a layer ahead."""
    draft = models[arch]
    first = draft.tokenizer.encode(DOC)
    both = first + draft.tokenizer.encode(FOLLOW_UP)
    scorer = DraftScorer(draft)
    real = scoring.capture_attention

    @contextlib.contextmanager
    def failing_after_one_layer(model, sink):
        class Sink(list):
            def append(self, item):
                if self:
                    raise RuntimeError("failed partway")
                super().append(item)

        with real(model, Sink()):
            yield

    monkeypatch.setattr(scoring, "capture_attention", failing_after_one_layer)
    with pytest.raises(RuntimeError, match="failed partway"):
        score(scorer, first, 0)
    monkeypatch.undo()
    assert scorer.cache.tokens == first[:-OBSERVATION_WINDOW]
    assert all(layer.offset == len(scorer.cache.tokens) for layer in scorer.cache.layers if hasattr(layer, "offset"))
    got, _ = score(scorer, both, len(first))
    want, _ = score(DraftScorer(draft), both, len(first))
    assert mx.allclose(got, want, rtol=2e-2, atol=1e-6).item()
