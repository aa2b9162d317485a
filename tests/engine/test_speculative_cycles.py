"""The speculative decoder's seams: the loop runs the cycle the autopilot picks, and each
cycle strategy (draft_cycle.py, lookup_cycle.py) on its own yields the target's greedy tokens."""

import gc
import weakref

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from brisk.engine.accel.speculative.controller import PairCosts
from brisk.engine.accel.speculative.lookup import ContextIndex, LookupOffer
from brisk.engine.accel.speculative.pair import DraftPair, LookupOnly
from brisk.engine.api.settings import ChatSettings
from brisk.engine.kv import PromptCache
from brisk.engine.models.loader import load_folder
from tests.tiny_models import make_tiny_model_by_key

PROMPT = "Tell me about the quick brown fox and the lazy dog."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("cycles")
    return {
        name: load_folder(make_tiny_model_by_key(root / name, "llama", seed=seed, context_length=512))
        for name, seed in (("target", 1), ("draft", 2))
    }


def settings(**kw):
    return ChatSettings(**{"model": "m", "temperature": 0.0, "prefill_step_size": 64, "spec_decode": "on", **kw})


class FixedIndex(ContextIndex):
    """An index whose offer is always `tokens` (a long match)."""

    def __init__(self, tokens):
        super().__init__()
        self.offer = tokens

    def propose(self, k):
        return LookupOffer(self.offer[:k], 16)


def _decoder(models, *, draft: bool, index: ContextIndex | None):
    """A decoder whose target cache holds the prompt but its last token (as a turn starts)."""
    target = models["target"]
    cache = PromptCache(target.model)
    prompt = target.tokenizer.encode(PROMPT)
    list(cache.sync(prompt[:-1], 64))
    maker = DraftPair.make(target, models["draft"]) if draft else LookupOnly(target)
    decoder = maker.make_decoder(cache, settings(), max_tokens=40, costs=PairCosts(), index=index)
    decoder._held = len(prompt) - 1
    return decoder, list(prompt)


def _greedy(models, count):
    """The target's own greedy continuation of PROMPT, by plain mlx-lm calls."""
    target = models["target"]
    cache = make_prompt_cache(target.model)
    logits = target.model(mx.array(target.tokenizer.encode(PROMPT))[None], cache=cache)
    tokens = []
    for _ in range(count):
        tokens.append(int(mx.argmax(logits[0, -1]).item()))
        logits = target.model(mx.array(tokens[-1:])[None], cache=cache)
    return tokens


@pytest.mark.parametrize(
    ("pick", "expected"), [(("lookup", 3), ("lookup", 3)), (("draft", 2), ("draft", 2)), (("plain", 0), ("plain", 1))]
)
def test_the_loop_runs_the_cycle_the_autopilot_picks(models, pick, expected):
    """The autopilot's pick decides, in one place, which strategy's `run` the loop calls
    (a plain run in `on` mode is one step)."""
    decoder, prompt = _decoder(models, draft=True, index=FixedIndex([5, 6, 7, 8]))
    decoder.controller.pick = lambda offer, *, draft_usable: pick
    ran = []
    for name in ("plain", "draft", "lookup"):
        cycle = getattr(decoder, name)
        real = cycle.run
        cycle.run = lambda sequence, k, offer, name=name, real=real: ran.append((name, k)) or real(sequence, k, offer)
    steps = decoder.steps(prompt)
    next(steps)
    steps.close()
    assert ran == [expected]


def test_a_draft_cycle_on_its_own_yields_the_targets_greedy_tokens(models):
    greedy = _greedy(models, 12)
    decoder, sequence = _decoder(models, draft=True, index=None)
    prompt = list(sequence)
    assert decoder.draft.start(prompt, sequence) is None
    produced = []
    while len(produced) < 10:
        produced += [token for token, _ in decoder.draft.run(sequence, 3, None)]
    assert produced[:10] == greedy[:10]
    assert sequence == prompt + produced  # the loop's sequence holds what the cycles yielded
    assert decoder.stats.draft_cycles > 0


def test_a_lookup_cycle_keeps_an_offer_up_to_its_first_wrong_token(models):
    greedy = _greedy(models, 5)
    decoder, sequence = _decoder(models, draft=False, index=ContextIndex())
    assert decoder.lookup.run(sequence, 4, LookupOffer(greedy[:4], 8)) == [(t, "lookup") for t in greedy[:4]] + [
        (greedy[4], "")
    ]
    wrong = [greedy[0], greedy[1], greedy[2] - 1 if greedy[2] else 1, greedy[3]]
    decoder, sequence = _decoder(models, draft=False, index=ContextIndex())
    assert decoder.lookup.run(sequence, 4, LookupOffer(wrong, 8)) == [
        (greedy[0], "lookup"),
        (greedy[1], "lookup"),
        (greedy[2], ""),
    ]
    assert (decoder.stats.lookup_tokens, decoder.stats.lookup_accepted) == (4, 2)


def test_a_finished_decoder_is_freed_without_the_cyclic_collector(models):
    """The cycles hold their loop weakly: a strong reference back kept each turn's decoder,
    and the MLX arrays it held, until Python's cyclic collector happened to run."""
    decoder, prompt = _decoder(models, draft=True, index=ContextIndex())
    gc.disable()
    try:
        assert len(list(decoder.steps(prompt))) == 40
        gone = weakref.ref(decoder)
        del decoder
        assert gone() is None
    finally:
        gc.enable()
