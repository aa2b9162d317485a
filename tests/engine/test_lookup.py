"""Lookup decoding: the context index (longest match, trimming), the decoder with lookup
proposals (greedy exactness on every architecture, exact sampling by chi-square), the
autopilot's choices between plain, lookup and the draft model, and the session keeping the
index in step with the prompt cache."""

import random

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from brisk.engine.accel.speculative import decoder as speculative
from brisk.engine.accel.speculative.autopilot import SpeculationAutopilot
from brisk.engine.accel.speculative.controller import EXTRA_POSITION_COST
from brisk.engine.accel.speculative.decoder import SpeculativeDecoder
from brisk.engine.accel.speculative.lookup import ContextIndex, LookupOffer
from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.events import TokenEmitted
from brisk.engine.api.session import Message, Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.decode.sampling import TokenDistribution
from brisk.engine.kv import PromptCache
from brisk.engine.models.loader import load_folder
from tests.engine.test_speculative import _chi2, _critical_chi2, _exact_pairs, chat
from tests.tiny_models import make_tiny_model_by_key

ARCHS = ["llama", "qwen2", "gemma3_text", "gpt_oss", "nemotron_h", "llama-q4"]
PROMPT = "Tell me about the quick brown fox and the lazy dog."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookup")
    out = {arch: load_folder(make_tiny_model_by_key(root / arch, arch, seed=1, context_length=2048)) for arch in ARCHS}
    out["llama-draft"] = load_folder(make_tiny_model_by_key(root / "draft", "llama", seed=2, context_length=2048))
    return out


def settings(**kw):
    return ChatSettings(**{"model": "m", "temperature": 0.0, "max_tokens": 40, "prefill_step_size": 64, **kw})


# --- the index ------------------------------------------------------------------


def test_proposes_what_followed_the_longest_earlier_match():
    index = ContextIndex()
    # "7 8 9" occurs twice; only the first occurrence also matches the "6" before it
    index.extend([5, 6, 7, 8, 9, 10, 11, 12, 1, 7, 8, 9, 20, 21, 3, 6, 7, 8, 9])
    offer = index.propose(3)
    assert offer == LookupOffer([10, 11, 12], 4)


def test_prefers_the_most_recent_of_equally_long_matches():
    index = ContextIndex()
    index.extend([1, 2, 3, 4, 50, 9, 2, 3, 4, 60, 9, 2, 3, 4])
    assert index.propose(2) == LookupOffer([60, 9], 4)


def test_a_single_shared_token_proposes_nothing():
    index = ContextIndex()
    index.extend([1, 2, 3, 4, 5, 6, 3])
    assert index.propose(4) is None
    assert ContextIndex().propose(4) is None


def test_a_continuation_stops_at_the_end_of_the_context():
    index = ContextIndex()
    index.extend([1, 2, 1, 2, 1, 2])  # a loop: the match overlaps the suffix
    assert index.propose(8) == LookupOffer([1, 2], 4)


def _tables(index):
    return {n: {k: list(v) for k, v in t.items()} for n, t in index._tables.items()}


@pytest.mark.parametrize("seed", range(5))
def test_a_synced_index_equals_one_built_fresh(seed):
    """An edit or a regenerate trims the index to the shared prefix and appends the rest:
    nothing of the replaced tokens may stay behind to be proposed."""
    rng = random.Random(seed)
    first = [rng.randrange(6) for _ in range(300)]  # a small vocabulary: many repeated n-grams
    second = first[: rng.randrange(300)] + [rng.randrange(6) for _ in range(rng.randrange(200))]
    index = ContextIndex()
    index.extend(first)
    kept = index.sync(second)
    fresh = ContextIndex()
    fresh.extend(second)
    shared = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
    assert index.tokens == second and kept == shared
    assert _tables(index) == _tables(fresh)
    assert index.propose(8) == fresh.propose(8)


# --- decoding with lookup proposals -----------------------------------------------


class OracleIndex(ContextIndex):
    """Proposes the plain answer's next tokens, every 7th one wrong: lookup cycles that are
    mostly kept and sometimes rejected, on models too small to quote anything."""

    def __init__(self, answer: list[int], vocab: int):
        super().__init__()
        self.answer, self.vocab, self.prompt_len, self.turns = answer, vocab, 0, 0

    def sync(self, tokens):
        self.prompt_len, self.turns = len(tokens), self.turns + 1
        return super().sync(tokens)

    def propose(self, k):
        if self.turns > 1:  # it knows the first answer only
            return None
        at = len(self.tokens) - self.prompt_len
        future = self.answer[at : at + k]
        wrong = [(t + 1) % self.vocab if (at + i) % 7 == 3 else t for i, t in enumerate(future)]
        return LookupOffer(wrong, 16) if wrong else None


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["on", "auto"])
def test_greedy_lookup_decoding_equals_plain(models, arch, mode):
    target = models[arch]
    plain, plain_next = (done for done, _ in chat(Session(target, settings(spec_decode="off")), [PROMPT, "And then?"]))
    session = Session(target, settings(spec_decode=mode, num_draft=4))
    session.context_index = OracleIndex(plain.token_ids, target.model.args.vocab_size)
    if mode == "auto":  # verifies priced as cheap before they are timed (a tiny model's are), so the
        # turn's first lookups are long enough to hit a wrong token whatever this machine's timings
        session.lookup_only.controller = SpeculationAutopilot(
            "auto", 4, has_draft=False, lookup=True, position_cost=EXTRA_POSITION_COST
        )
        session.lookup_only.controller_key = ("auto", 4)
    done, events = chat(session, [PROMPT])[0]
    assert done.token_ids == plain.token_ids
    m = done.metrics
    assert m.spec_decode.startswith(f"{mode} (lookup)"), m.spec_decode
    assert m.lookup_tokens > 0 and 0 < m.lookup_accepted < m.lookup_tokens  # kept and rejected both
    assert m.sources.count("lookup") == m.lookup_accepted and m.draft_tokens == 0
    assert [e.source for e in events if isinstance(e, TokenEmitted) and e.token_id >= 0] == m.sources
    assert m.tokens_per_cycle > 1.2
    # the decoder left the cache plain decoding leaves: the next turn reuses as much of it
    again = chat(session, ["And then?"])[0][0]
    assert again.metrics.cached_tokens == plain_next.metrics.cached_tokens
    assert again.token_ids == plain_next.token_ids


def test_lookup_and_draft_together_stay_exact(models):
    target = models["llama"]
    plain = chat(Session(target, settings(spec_decode="off")), [PROMPT, "More."])
    session = Session(target, settings(spec_decode="on", num_draft=3), draft=models["llama-draft"])
    session.context_index = OracleIndex(plain[0][0].token_ids, target.model.args.vocab_size)
    both = chat(session, [PROMPT, "More."])
    assert [b.token_ids for b, _ in both] == [p.token_ids for p, _ in plain]
    first = both[0][0].metrics
    assert first.spec_decode.startswith("on (lookup + draft")
    assert first.lookup_accepted > 0
    # the oracle offers nothing in the second turn: the draft proposes, in step with the lookups before
    assert both[1][0].metrics.draft_tokens > 0


class FixedIndex(ContextIndex):
    def __init__(self, tokens):
        super().__init__()
        self.offer = tokens

    def propose(self, k):
        return LookupOffer(self.offer[:k], 16)


def _lookup_sampled_pairs(target, prompt, dist, proposal, n):
    cache = make_prompt_cache(target.model)
    target.model(mx.array(prompt[:-1])[None], cache=cache)
    held = PromptCache(target.model)
    held.layers = cache
    counts = {}
    controller = SpeculationAutopilot("on", 2, has_draft=False, lookup=True)
    for _ in range(n):
        decoder = SpeculativeDecoder(
            target.model, held, None, controller, dist, rule="rejection", max_tokens=3, index=FixedIndex(proposal)
        )
        steps = decoder.steps(prompt)
        pair = (next(steps)[0], next(steps)[0])
        steps.close()
        counts[pair] = counts.get(pair, 0) + 1
        for layer in cache:
            layer.trim(layer.offset - (len(prompt) - 1))
    return counts


def test_sampled_lookup_tokens_follow_the_target_distribution(models, monkeypatch):
    """A lookup proposal is one-hot: kept with probability p(x), else the target's own
    token from p without x. Two proposed positions, checked against exact pair odds."""
    target = models["llama"]
    dist = TokenDistribution(settings(temperature=1.0, top_k=4))
    prompt = target.tokenizer.encode(PROMPT)
    exact = _exact_pairs(target, prompt, dist)
    # propose the second most likely first token and its likeliest follower: kept and rejected often
    by_first = {}
    for (a, b), prob in exact.items():
        by_first.setdefault(a, {})[b] = prob
    firsts = sorted(by_first, key=lambda a: -sum(by_first[a].values()))
    x1 = firsts[1]
    x2 = max(by_first[x1], key=by_first[x1].get)
    n = 1500
    mx.random.seed(0)
    counts = _lookup_sampled_pairs(target, prompt, dist, [x1, x2], n)
    stat, df = _chi2(counts, exact, n)
    assert stat < _critical_chi2(df), (stat, df)
    assert 0.05 < counts.get((x1, x2), 0) / n < 0.95  # the proposal was both kept and rejected
    # the same test catches a rule that keeps every proposal
    monkeypatch.setattr(speculative, "accept_match", lambda p, toks, greedy: (len(toks), int(mx.argmax(p[-1]))))
    mx.random.seed(0)
    stat, df = _chi2(_lookup_sampled_pairs(target, prompt, dist, [x1, x2], n), exact, n)
    assert stat > _critical_chi2(df)


# --- the autopilot ----------------------------------------------------------------

QUOTE, COINCIDENCE = LookupOffer(list(range(12)), 20), LookupOffer(list(range(12)), 2)


def _warmed(**kw):
    pilot = SpeculationAutopilot("auto", 3, **{"has_draft": False, "lookup": True, **kw})
    pilot.observe_plain(0.1, 3)
    return pilot


def test_lookup_pays_where_the_target_keeps_choosing_what_it_proposes():
    pilot = _warmed()
    for _ in range(30):  # plain steps where the lookup's token was the target's (quote)
        pilot.observe_lookup_scout(QUOTE, QUOTE.tokens[0])
        pilot.observe_lookup_scout(COINCIDENCE, -1)  # ... and where it was not
    for k in (1, 4, 8):
        pilot.observe_verify(k, 0.1 + 0.01 * k)
    source, k = pilot.pick(QUOTE, draft_usable=False)
    assert source == "lookup" and k >= 8
    assert pilot.pick(COINCIDENCE, draft_usable=False) == ("plain", 0)
    assert pilot.lookup_pays(QUOTE) and not pilot.lookup_pays(COINCIDENCE) and not pilot.lookup_pays(None)


def test_a_costly_verify_needs_more_acceptance():
    """On a CPU where a verify pass costs 2 plain steps, 60% acceptance does not pay."""
    pilot = _warmed()
    for i in range(40):
        pilot.observe_lookup_scout(QUOTE, QUOTE.tokens[0] if i % 5 < 3 else -1)
    for k in (1, 4, 8):
        pilot.observe_verify(k, 0.2 + 0.01 * k)
    assert pilot.pick(QUOTE, draft_usable=False) == ("plain", 0)
    for k in (1, 4, 8):
        pilot.observe_verify(k, 0.1 + 0.001 * k)  # a cheap verify (the EMA moves towards it)
        pilot.observe_verify(k, 0.1 + 0.001 * k)
        pilot.observe_verify(k, 0.1 + 0.001 * k)
    assert pilot.pick(QUOTE, draft_usable=False)[0] == "lookup"


def test_before_any_verify_is_timed_a_cpu_turn_does_not_bet_on_a_long_lookup(models):
    """A turn's first lookup has no verify timing yet. A 12-token verify assumed to cost
    1.6 plain steps (the GPU prior) looked worth it at even odds; on this CPU it cost about
    4-5 (Qwen-1.5B q4), so a default turn lost to plain decoding on structured text. The
    decoder's autopilot is priced for the device it runs on."""
    from brisk.engine.accel.speculative.controller import PairCosts
    from brisk.engine.accel.speculative.pair import LookupOnly

    target = models["llama"]
    decoder = LookupOnly(target).make_decoder(
        PromptCache(target.model), settings(), max_tokens=8, costs=PairCosts(), index=ContextIndex()
    )
    pilot = decoder.controller
    pilot.observe_plain(0.1, 3)
    even_odds = LookupOffer(list(range(12)), 20)  # a long match: the prior says 50/50
    assert pilot.lookup_alpha(even_odds) == pytest.approx(0.5, abs=0.1)
    source, k = pilot.pick(even_odds, draft_usable=False)
    assert source == "plain" or k <= 2
    gpu = _warmed()  # the GPU prior: long verifies are nearly free
    assert gpu.pick(even_odds, draft_usable=False)[1] >= 4


def _run_decoder(models, *, indexed=False):
    """A lookup-only decoder on the tiny llama, its cache as a turn's prefill leaves it (the
    prompt but its last token), and the prompt; `indexed`: the prompt in its context index."""
    from brisk.engine.accel.speculative.controller import PairCosts
    from brisk.engine.accel.speculative.pair import LookupOnly

    target = models["llama"]
    cache = PromptCache(target.model)
    prompt = target.tokenizer.encode(PROMPT)
    list(cache.sync(prompt[:-1], 64))
    index = ContextIndex()
    if indexed:
        index.extend(prompt)
    decoder = LookupOnly(target).make_decoder(cache, settings(), max_tokens=32, costs=PairCosts(), index=index)
    decoder._held = len(prompt) - 1  # as steps() starts
    return decoder, list(prompt)


@pytest.mark.parametrize("count", [2, 3, 8])
def test_a_short_pipelined_run_times_its_steps_at_their_cost(models, monkeypatch, count):
    """Reading a pipelined token back may wait for the step queued after it too: a run's
    first read takes two steps, its last none. Timed from the first read, a lookup-ended run
    of 2-4 steps read SmolLM2's 7 ms step as 4-6 ms (2 steps: as nothing), and every verify
    pass then looked dearer than it was. The run is timed from its first step's queueing;
    a run that traced the step is not timed at all."""
    decoder, sequence = _run_decoder(models, indexed=True)
    step, clock, reads = 0.01, [0.0], [0]

    def read_back(token):  # the stream: the first read waits two steps, the last one none
        reads[0] += 1
        clock[0] += {1: 2 * step, run: 0.0}.get(reads[0], step)
        return int(token.item())

    monkeypatch.setattr(speculative.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(speculative, "item_int", read_back)
    run = count
    list(decoder._plain_run(sequence, count))  # the turn's first run traces the step: untimed
    assert decoder.metrics()["decode_step"] == "compiled"
    assert decoder.controller.plain_samples == 0 and decoder.controller.t_plain.value is None
    reads[0] = 0
    list(decoder._plain_run(sequence, count))
    assert decoder.controller.plain_samples == count
    assert decoder.controller.t_plain.value == pytest.approx(step)


def _counting_queue(decoder):
    queued = []
    original = decoder._queue_step

    def queue(token):
        queued.append(token)
        return original(token)

    decoder._queue_step = queue
    return queued


def test_a_plain_run_queues_no_step_behind_a_token_a_lookup_would_follow(models):
    """A pipelined run queues the next step before it reads a token. When the context's
    offer says a lookup would pay right after the token in flight, that step would cost a
    plain step for one token the lookup's verify pass checks for a row's cost: the run
    queues nothing behind it, and ends at once when the lookup does pay."""
    decoder, sequence = _run_decoder(models)
    queued = _counting_queue(decoder)
    decoder._lookup_offer = lambda: LookupOffer([1, 2, 3], 8)
    decoder.controller.lookup_pays = lambda offer: offer is not None
    assert len(list(decoder._plain_run(sequence, 8))) == 1  # the old run read the queued step too: 2
    assert len(queued) == 1
    assert decoder._held == len(sequence) - 1  # no step beyond the token read went into the cache


def test_a_lookup_that_does_not_come_leaves_the_run_unpipelined_and_its_tokens_unchanged(models):
    """The offer predicts its first token; when the target chose another, the lookup does not
    pay after all and the run goes on, queuing each step after its token is read: the same
    tokens as a pipelined run."""
    pipelined, sequence = _run_decoder(models)
    pipelined._lookup_offer = lambda: LookupOffer([1, 2, 3], 8)
    pipelined.controller.lookup_pays = lambda offer: False
    expected = [token for token, _ in pipelined._plain_run(list(sequence), 8)]

    decoder, sequence = _run_decoder(models)
    queued = _counting_queue(decoder)
    decoder._lookup_offer = lambda: LookupOffer([1, 2, 3], 8)
    decoder.controller.lookup_pays = lambda offer: offer is not None and offer.match == 9  # the predicted one only
    assert [token for token, _ in decoder._plain_run(sequence, 8)] == expected
    assert len(queued) == 8
    assert decoder._held == len(sequence) - 1


def test_a_plain_run_traces_its_compiled_step_once(models, monkeypatch):
    """The run's first token went in as int32 and the rest as argmax's uint32: each dtype was
    a trace of its own (~6.5 ms for SmolLM2), twice a turn."""
    from brisk.engine.decode import compiled as compiled_decode

    slots = []
    real = compiled_decode._FixedSlot.__init__

    def counting(self, *args):
        slots.append(1)  # made only while the step is traced
        real(self, *args)

    monkeypatch.setattr(compiled_decode._FixedSlot, "__init__", counting)
    decoder, sequence = _run_decoder(models)
    assert len(list(decoder._plain_run(sequence, 4))) == 4
    assert decoder.metrics()["decode_step"] == "compiled"
    assert len(slots) == len(decoder.cache)  # one trace: a slot per layer


def test_a_turn_asks_once_whether_its_plain_runs_can_be_compiled(models, monkeypatch):
    """The check walks the model's modules (~1.6 ms for SmolLM2); a grounded answer's
    lookups split a turn into ~20 plain runs, and each run asked again."""
    asked = []
    real = speculative.why_not_compiled

    def counting(*args, **kwargs):
        asked.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(speculative, "why_not_compiled", counting)
    decoder, sequence = _run_decoder(models)
    for _ in range(3):
        assert len(list(decoder._plain_run(sequence, 2))) == 2
    assert decoder.metrics()["decode_step"] == "compiled"
    assert asked == [1]


def test_a_verify_pass_is_dispatched_ahead_through_the_targets_cache(models, monkeypatch):
    """Its first layers run while Python builds the rest (engine/decode/dispatch_ahead.py)."""
    decoder, sequence = _run_decoder(models)
    entered = []
    real = speculative.dispatching_ahead

    def recording(layers):
        entered.append(layers)
        return real(layers)

    monkeypatch.setattr(speculative, "dispatching_ahead", recording)
    decoder._lookup_cycle(sequence, LookupOffer([1, 2, 3], 8), 3)
    assert entered == [decoder.cache]


def test_an_offer_continuing_a_fully_kept_lookup_has_an_acceptance_of_its_own():
    """A copied file's first lookups were verified 1, 1, 1, 2, 5 tokens at a time, pooled with
    every other offer of their match length, while 12 would have been kept each time."""
    pilot = _warmed()
    tokens = list(range(12))
    for _ in range(20):  # offers of 4-7 matched tokens are mostly wrong elsewhere in the text
        pilot.observe_lookup_scout(LookupOffer(tokens, 5), -1)
    for k in (1, 4, 8):
        pilot.observe_verify(k, 0.1 + 0.01 * k)
    fresh = LookupOffer(tokens, 6)
    assert pilot.pick(fresh, draft_usable=False) == ("plain", 0)
    pilot.observe_lookup_cycle(LookupOffer(tokens, 2), proposed=3, accepted=3, verify_s=0.13)
    continuing = LookupOffer(tokens, 6)  # the same place: 2 + 3 kept + the target's own
    source, k = pilot.pick(continuing, draft_usable=False)
    assert source == "lookup" and k >= 6
    pilot.observe_lookup_cycle(continuing, proposed=k, accepted=1, verify_s=0.2)
    # kept in part: the offer with the match a continuation would have (6 + 1 + 1) is an offer of its class
    after_it, fresh_of_its_class = LookupOffer(tokens, 8), LookupOffer(tokens, 9)
    assert pilot.pick(after_it, draft_usable=False) == pilot.pick(fresh_of_its_class, draft_usable=False)


def test_lookups_measured_in_draft_cycles_win_back_the_choice():
    """While the draft's cycles run, no plain step scouts the lookup, and a lookup left at its
    prior never beat the draft: on structured output Qwen-1.5B drafted (31-32 tok/s) where
    lookups alone ran at 36-38. What a cycle produced says how much the lookup would have kept."""
    pilot = _warmed(has_draft=True, cost_ratio=0.3)
    for _ in range(20):  # the draft keeps 3 of 4 tokens, at 0.3 of a target step each
        pilot.observe_cycle(drafted=4, proposed=4, accepted=3, draft_s=0.12, verify_s=0.15)
    for k in (1, 4, 8):
        pilot.observe_verify(k, 0.11 + 0.01 * k)
    assert pilot.pick(COINCIDENCE, draft_usable=True)[0] == "draft"  # short matches start pessimistic
    for _ in range(10):  # the target said what the lookup proposed, five tokens each cycle
        pilot.observe_lookup_outcome(COINCIDENCE, COINCIDENCE.tokens[:5])
    assert pilot.pick(COINCIDENCE, draft_usable=True)[0] == "lookup"
    before = list(pilot.lookup_counts[0])
    pilot.observe_lookup_outcome(COINCIDENCE, [0, 1, 99, 3])  # kept two, then a miss
    assert pilot.lookup_counts[0] == pytest.approx([0.95**3 * before[0] + 2, 0.95**3 * before[1] + 1])


def test_a_draft_cycle_tells_the_autopilot_what_the_lookup_would_have_kept(models, monkeypatch):
    from brisk.engine.accel.speculative.controller import PairCosts
    from brisk.engine.accel.speculative.pair import DraftPair

    target = models["llama"]
    cache = PromptCache(target.model)
    prompt = target.tokenizer.encode(PROMPT)
    list(cache.sync(prompt[:-1], 64))
    pair = DraftPair.make(target, models["llama-draft"])
    index = ContextIndex()
    decoder = pair.make_decoder(cache, settings(spec_decode="on"), max_tokens=32, costs=PairCosts(), index=index)
    decoder._held = len(prompt) - 1
    sequence = list(prompt)
    assert decoder._start_draft(prompt, sequence) is None
    told = []
    monkeypatch.setattr(decoder.controller, "observe_lookup_outcome", lambda *call: told.append(call))
    offer = LookupOffer([1, 2, 3], 4)
    steps = decoder._draft_cycle(sequence, 3, offer)
    assert decoder.stats.draft_cycles == 1
    assert told == [(offer, [token for token, _ in steps])]


def test_a_faster_draft_wins_over_a_weak_lookup_and_loses_to_a_quote():
    pilot = _warmed(has_draft=True, cost_ratio=0.05)
    for _ in range(20):  # the draft keeps 90% of its tokens, at 5% of a target step
        pilot.observe_cycle(drafted=4, proposed=4, accepted=4, draft_s=0.02, verify_s=0.11)
        pilot.observe_cycle(drafted=4, proposed=4, accepted=3, draft_s=0.02, verify_s=0.11)
    for _ in range(30):
        pilot.observe_lookup_scout(QUOTE, QUOTE.tokens[0])
        pilot.observe_lookup_scout(COINCIDENCE, COINCIDENCE.tokens[0])  # right half of the time
        pilot.observe_lookup_scout(COINCIDENCE, -1)
    assert pilot.pick(QUOTE, draft_usable=True)[0] == "lookup"
    assert pilot.pick(COINCIDENCE, draft_usable=True)[0] == "draft"
    assert pilot.pick(COINCIDENCE, draft_usable=False)[0] in ("plain", "lookup")  # the draft dropped out


def test_on_mode_takes_every_offer():
    pilot = SpeculationAutopilot("on", 5, has_draft=False, lookup=True)
    assert pilot.pick(COINCIDENCE, draft_usable=False) == ("lookup", 5)
    assert pilot.pick(None, draft_usable=False) == ("plain", 0)


# --- the session ------------------------------------------------------------------


def test_the_index_follows_edits_and_regenerates(models):
    session = Session(models["qwen2"], settings(spec_decode="auto"))
    chat(session, [PROMPT, "Tell me more about the dog."])
    index = session.context_index
    assert index.tokens[: len(session.cache.tokens)] == session.cache.tokens
    list(session.answer([Message("user", "Something else entirely.")]))  # an edit of the first message
    fresh = ContextIndex()
    fresh.extend(index.tokens)
    assert index.tokens[: len(session.cache.tokens)] == session.cache.tokens
    assert _tables(index) == _tables(fresh)
    assert len(index.tokens) <= len(session.cache.tokens) + 1


def test_lookup_off_decodes_without_it(models):
    done = chat(Session(models["llama"], settings(spec_decode="auto", lookup=False)), [PROMPT])[0][0]
    assert done.metrics.spec_decode == "off" and done.metrics.lookup_tokens == 0


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_lookup_setting_must_be_a_boolean(bad):
    with pytest.raises(InvalidSettings, match="lookup must be true or false"):
        settings(lookup=bad).validate()


@pytest.mark.parametrize("kw", [{"repetition_penalty": 1.3}, {"temperature": 0.8, "seed": 7, "top_k": 1}])
def test_logits_processors_and_sampling_settings_see_the_same_history(models, kw):
    """A repetition penalty reads the tokens before each verified position; top-k 1 at a
    temperature is greedy through the sampling path: both must give plain's tokens."""
    target = models["llama"]
    plain = chat(Session(target, settings(spec_decode="off", **kw)), [PROMPT])[0][0]
    session = Session(target, settings(spec_decode="on", num_draft=4, **kw))
    session.context_index = OracleIndex(plain.token_ids, target.model.args.vocab_size)
    done = chat(session, [PROMPT])[0][0]
    assert done.token_ids == plain.token_ids
    assert done.metrics.lookup_accepted > 0
