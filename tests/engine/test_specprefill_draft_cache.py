"""SpecPrefill's draft cache across turns: the lookahead tokens come back out of it, also
for layers that cannot trim (recurrent state, a sliding window that has wrapped), and also
when scoring fails, so the next turn's draft reads only the new tokens."""

import contextlib

import mlx.core as mx
import pytest

from brisk.engine.accel.specprefill import scoring
from brisk.engine.accel.specprefill.scoring import OBSERVATION_WINDOW, DraftScorer
from brisk.engine.api.events import PrefillProgressed
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
    assert kept.cache.tokens == first
    got, reads = score(kept, both, len(first))
    want, fresh_reads = score(DraftScorer(draft), both, len(first))
    assert reads == [len(both) - OBSERVATION_WINDOW - len(first)]  # the conversation is not read again
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
    assert scorer.cache.tokens == first
    got, reads = score(scorer, both, len(first))
    want, _ = score(DraftScorer(draft), both, len(first))
    assert reads == [len(both) - OBSERVATION_WINDOW - len(first)]
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
    assert scorer.cache.tokens == first
    assert all(layer.offset == len(first) for layer in scorer.cache.layers if hasattr(layer, "offset"))
    got, _ = score(scorer, both, len(first))
    want, _ = score(DraftScorer(draft), both, len(first))
    assert mx.allclose(got, want, rtol=2e-2, atol=1e-6).item()
