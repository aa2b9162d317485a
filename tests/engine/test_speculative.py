"""Speculative decoding: greedy exactness on every architecture, exact sampling (chi-square),
cache rollback, cross-tokenizer translation, fallbacks, and the adaptive controller driving a
decoder (its model-free tests: test_draft_controller.py)."""

import math

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from brisk.engine.accel.speculative import decoder as speculative
from brisk.engine.accel.speculative.autopilot import SpeculationAutopilot
from brisk.engine.accel.speculative.controller import DraftLengthController, PairCosts
from brisk.engine.accel.speculative.decoder import SpeculativeDecoder
from brisk.engine.accel.speculative.drafters import SameTokenizerDrafter, TranslatingDrafter
from brisk.engine.api.events import EngineWarned, TokenEmitted, TurnFinished
from brisk.engine.api.session import CancelToken, Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.decode.sampling import TokenDistribution
from brisk.engine.kv import PromptCache
from brisk.engine.models.loader import load_folder
from tests.engine.test_draft_controller import losing_pilot
from tests.tiny_models import make_tiny_model, make_tiny_model_by_key

# "-q4"/"-q8": the same architecture with quantized weights (MLX's quantized layers)
ARCHS = ["llama", "qwen2", "qwen3", "gemma3_text", "gpt_oss", "nemotron_h", "llama-q4", "qwen3-q8", "qwen2-q5"]
PROMPTS = ["Tell me about the quick brown fox and the lazy dog.", "Zażółć gęślą jaźń, w Warszawie? 東京 🙂"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    out = {}
    for arch in ARCHS:
        out[arch] = load_folder(make_tiny_model_by_key(root / arch, arch, seed=1, context_length=2048))
        out[arch + "-draft"] = load_folder(
            make_tiny_model_by_key(root / f"{arch}-d", arch, seed=2, context_length=2048)
        )
    # another vocabulary: a cross-tokenizer draft for any target
    out["cross"] = load_folder(
        make_tiny_model(root / "cross", "qwen2", seed=3, context_length=2048, tokenizer_vocab=300)
    )
    out["short"] = load_folder(make_tiny_model(root / "short", "llama", seed=2, context_length=40))
    return out


def settings(**kw):
    # lookup off: these tests are about the draft model (tests/engine/test_lookup.py: both)
    return ChatSettings(
        **{"model": "m", "temperature": 0.0, "max_tokens": 24, "prefill_step_size": 64, "lookup": False, **kw}
    )


def chat(session, texts):
    outs = []
    for text in texts:
        events = list(session.send(text))
        done = [e for e in events if isinstance(e, TurnFinished)]
        assert done, events
        outs.append((done[0], events))
    return outs


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("draft_kind", ["self", "other", "cross"])
def test_greedy_speculative_equals_plain_over_turns(models, arch, draft_kind):
    target = models[arch]
    draft = {"self": target, "other": models[arch + "-draft"], "cross": models["cross"]}[draft_kind]
    plain = chat(Session(target, settings(spec_decode="off")), PROMPTS)
    spec = chat(Session(target, settings(spec_decode="on", num_draft=3), draft=draft), PROMPTS)
    for (p, _), (s, events) in zip(plain, spec):
        assert s.token_ids == p.token_ids
        assert s.text == p.text
        m = s.metrics
        assert m.draft_tokens > 0, m.spec_decode
        assert m.spec_decode == ("on (match)" if draft_kind == "cross" else "on (rejection)")
        assert m.sources.count("draft") <= m.accepted_tokens and len(m.sources) == len(s.token_ids)
        assert set(m.sources) <= {"", "draft"}
        assert [e.source for e in events if isinstance(e, TokenEmitted) and e.token_id >= 0] == m.sources
    if draft_kind == "self":  # the target drafting for itself: every token is accepted
        assert spec[0][0].metrics.acceptance_rate == 1.0
        assert spec[0][0].metrics.tokens_per_cycle > 3


def test_greedy_speculative_with_int4_cache_equals_int4_plain(models):
    target, draft = models["gemma3_text"], models["gemma3_text-draft"]  # head_dim 32: packable
    plain = chat(Session(target, settings(spec_decode="off", kv_bits=4)), PROMPTS)
    spec = chat(Session(target, settings(spec_decode="on", kv_bits=4), draft=target), PROMPTS)
    other = chat(Session(target, settings(spec_decode="on", kv_bits=4), draft=draft), PROMPTS)
    assert [s.token_ids for s, _ in spec] == [p.token_ids for p, _ in plain]
    # rejections with a packed cache: the top-1 may move within int4 rounding, so compare loosely
    for (p, _), (o, _) in zip(plain, other):
        agree = sum(a == b for a, b in zip(p.token_ids, o.token_ids)) / max(1, len(p.token_ids))
        assert agree >= 0.8
        assert o.metrics.kv_bits == 4


def test_cancel_mid_answer_keeps_cache_consistent(models):
    target = models["qwen2"]
    cold = chat(Session(target, settings(spec_decode="off", max_tokens=40)), PROMPTS[:1])[0][0]
    session = Session(target, settings(spec_decode="on", max_tokens=40), draft=target)
    cancel = CancelToken()
    for event in session.send(PROMPTS[0], cancel=cancel):
        if isinstance(event, TokenEmitted) and event.token_id >= 0:
            cancel.cancel()
    assert session.messages[-1].finish_reason == "cancelled"
    events = list(session.regenerate())
    again = [e for e in events if isinstance(e, TurnFinished)][0]
    assert again.token_ids == cold.token_ids
    assert again.metrics.cached_tokens > 0  # the prompt came from the cache the decoder left


def test_auto_mode_is_exact_and_reports_its_choices(models):
    target = models["gemma3_text"]
    plain = chat(Session(target, settings(spec_decode="off", max_tokens=40)), PROMPTS)
    auto = chat(Session(target, settings(spec_decode="auto", max_tokens=40), draft=target), PROMPTS)
    assert [a.token_ids for a, _ in auto] == [p.token_ids for p, _ in plain]
    assert auto[1][0].metrics.spec_decode.startswith("auto (rejection)")


def test_draft_too_short_for_the_conversation_warns_and_decodes_plainly(models):
    target = models["llama"]
    long = PROMPTS[0] * 3
    plain = chat(Session(target, settings(spec_decode="off")), [long])[0][0]
    done, events = chat(Session(target, settings(spec_decode="on"), draft=models["short"]), [long])[0]
    warnings = [e for e in events if isinstance(e, EngineWarned)]
    assert warnings and "draft holds 40 tokens" in warnings[0].message
    assert done.token_ids == plain.token_ids
    assert done.metrics.spec_decode.startswith("off: the draft holds 40")


def test_draft_failing_mid_turn_costs_speed_not_the_answer(models, monkeypatch):
    target = models["qwen3"]
    plain = chat(Session(target, settings(spec_decode="off")), PROMPTS[:1])[0][0]
    calls = {"n": 0}
    original = SameTokenizerDrafter.propose

    def flaky(self, k, stop_below=0.0):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("draft exploded")
        return original(self, k, stop_below)

    monkeypatch.setattr(SameTokenizerDrafter, "propose", flaky)
    done, events = chat(Session(target, settings(spec_decode="on"), draft=models["qwen3-draft"]), PROMPTS[:1])[0]
    assert any(isinstance(e, EngineWarned) and "draft exploded" in e.message for e in events)
    assert done.token_ids == plain.token_ids


def test_absorbed_draft_text_takes_a_plain_step(models, monkeypatch):
    """A draft whose text the context swallows (nothing new to verify) must not stall."""
    target = models["llama"]
    plain = chat(Session(target, settings(spec_decode="off")), PROMPTS[:1])[0][0]
    monkeypatch.setattr("brisk.engine.accel.speculative.drafters._continuation", lambda *a: "")
    done, _ = chat(Session(target, settings(spec_decode="on"), draft=models["cross"]), PROMPTS[:1])[0]
    assert done.token_ids == plain.token_ids
    assert done.metrics.draft_tokens == 0 and done.metrics.generated_tokens == len(plain.token_ids)


# --- exact sampling --------------------------------------------------------------


def _critical_chi2(df: int, z: float = 3.09) -> float:
    """Wilson–Hilferty upper quantile (z = 3.09: significance 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _exact_pairs(target, prompt, dist):
    """P(first two tokens) under plain sampling, over the pairs with non-zero probability."""
    cache = make_prompt_cache(target.model)
    p1 = dist.probs(target.model(mx.array(prompt)[None], cache=cache)[0, -1:], prompt, [])[0].tolist()
    pairs = {}
    for t1, a in enumerate(p1):
        if a > 0:
            c = make_prompt_cache(target.model)
            logits = target.model(mx.array(prompt + [t1])[None], cache=c)[0, -1:]
            for t2, b in enumerate(dist.probs(logits, prompt + [t1], [])[0].tolist()):
                if b > 0:
                    pairs[(t1, t2)] = a * b
    return pairs


def _sampled_pairs(target, draft, prompt, dist, rule, n):
    cache = make_prompt_cache(target.model)
    target.model(mx.array(prompt[:-1])[None], cache=cache)
    drafter = SameTokenizerDrafter(draft, dist, None, 64)
    counts = {}
    held = PromptCache(target.model)
    held.layers = cache
    for _ in range(n):
        controller = SpeculationAutopilot("on", 1, has_draft=True, lookup=False)
        decoder = SpeculativeDecoder(target.model, held, drafter, controller, dist, rule=rule, max_tokens=2)
        pair = tuple(t for t, _ in decoder.steps(prompt))
        counts[pair] = counts.get(pair, 0) + 1
        for layer in cache:  # back to the prompt for the next sample
            layer.trim(layer.offset - (len(prompt) - 1))
    return counts


def _chi2(counts, exact, n):
    observed, expected, rest_o, rest_e = [], [], 0, 0.0
    for pair, prob in exact.items():
        if prob * n >= 5:
            observed.append(counts.get(pair, 0))
            expected.append(prob * n)
        else:
            rest_o, rest_e = rest_o + counts.get(pair, 0), rest_e + prob * n
    rest_o += sum(c for pair, c in counts.items() if pair not in exact)  # impossible pairs count against
    observed.append(rest_o)
    expected.append(max(rest_e, 1e-9))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return stat, len(observed) - 1


@pytest.mark.parametrize("rule", ["rejection", "match"])
def test_sampled_tokens_follow_the_target_distribution(models, rule, monkeypatch):
    target, draft = models["llama"], models["llama-draft"]
    dist = TokenDistribution(settings(temperature=1.0, top_k=4))
    prompt = target.tokenizer.encode(PROMPTS[0])
    exact = _exact_pairs(target, prompt, dist)
    n = 1500
    mx.random.seed(0)
    stat, df = _chi2(_sampled_pairs(target, draft, prompt, dist, rule, n), exact, n)
    assert stat < _critical_chi2(df), (stat, df)
    # the same test catches a wrong rule: accepting every draft token samples from q, not p
    monkeypatch.setattr(speculative, "accept_rejection", lambda p, q, toks: (len(toks), int(mx.argmax(p[-1]))))
    monkeypatch.setattr(speculative, "accept_match", lambda p, toks, greedy: (len(toks), int(mx.argmax(p[-1]))))
    mx.random.seed(0)
    stat, df = _chi2(_sampled_pairs(target, draft, prompt, dist, rule, n), exact, n)
    assert stat > _critical_chi2(df)


def test_rejection_sampling_accepts_more_than_matching(models):
    """Σ min(p, q) ≥ Σ p·q: at temperature 0.7 the exact rejection rule keeps more drafts."""
    target, draft = models["qwen2"], models["qwen2-draft"]
    rates = {}
    for rule in ("rejection", "match"):
        mx.random.seed(1)
        session = Session(
            target, settings(temperature=0.7, spec_decode="on", spec_rule=rule, max_tokens=48), draft=draft
        )
        accepted = proposed = 0
        for text in PROMPTS * 3:
            m = chat(session, [text])[0][0].metrics
            accepted, proposed = accepted + m.accepted_tokens, proposed + m.draft_tokens
        rates[rule] = accepted / proposed
    assert rates["rejection"] > rates["match"], rates


# --- translation across tokenizers ------------------------------------------------

HARD_TEXT = [
    "Zażółć gęślą jaźń, w Warszawie",
    "東京は日本の首都です。",
    "Emoji: 🙂🚀 done",
    "def main():\n\treturn 42  # tabs\n",
    "numbers 1234567890",
    "   leading spaces",
    "quickbrownfox",
]


@pytest.mark.parametrize("text", HARD_TEXT)
def test_translation_round_trips_hard_text_at_every_boundary(models, text):
    from brisk.engine.accel.speculative.drafters import _continuation, _continuation_ids
    from brisk.engine.accel.translate import decode_text, encode_with_spans

    target, draft = models["llama"].tokenizer, models["cross"].tokenizer
    for cut in range(1, len(text)):
        head, tail = text[:cut], text[cut:]
        context = encode_with_spans(target, head)[0]
        ids = _continuation_ids(target, context, tail)
        assert decode_text(target, context + ids) == text
        draft_ctx, draft_new = encode_with_spans(draft, head)[0], encode_with_spans(draft, tail)[0]
        assert _continuation(draft, draft_ctx, draft_new) == tail


def test_translating_drafter_keeps_draft_tokens_in_step_with_the_text(models):
    from brisk.engine.accel.translate import decode_text

    target, draft = models["llama"], models["cross"]
    drafter = TranslatingDrafter(draft, target.tokenizer, TokenDistribution(settings()), None, 64, prefix=3)
    prompt = target.tokenizer.encode("Hello")
    drafter.start(prompt)
    for piece in HARD_TEXT:
        for token in target.tokenizer.encode(piece):
            drafter.observe_tokens([token])
        answer = decode_text(target.tokenizer, drafter.target[drafter.answer_from :]).rstrip("\ufffd")
        assert decode_text(draft.tokenizer, drafter.answer_ids) == answer
        assert drafter.tc.tokens + drafter.pending == drafter.base + drafter.answer_ids


# --- the controller in the decoder -----------------------------------------------


def test_auto_does_not_draft_when_the_draft_costs_as_much_as_the_target(models):
    target = models["llama"]
    done = chat(Session(target, settings(spec_decode="auto", max_tokens=30), draft=target), PROMPTS[:1])[0][0]
    assert done.metrics.draft_tokens == 0 and done.metrics.draft_prefill_s == 0
    assert "drafting cannot pay" in done.metrics.spec_decode


def test_auto_does_not_pay_a_long_catch_up_for_a_draft_that_is_not_paying(models):
    """After a plain stretch the draft must read every token it missed before it can scout
    or propose. On code a 0.5B draft's catch-ups (after 64- and 105-token plain runs) cost
    Qwen-1.5B 12% of a turn it never drafted in: a draft measured to lose is not caught up,
    one measured to win is; one not yet measured in this turn is (new content, new α) when
    it reads at most a quarter as many tokens as are left to answer."""
    target, draft = models["llama"], models["llama-draft"]
    session = Session(target, settings(spec_decode="auto"), draft=draft)
    decoder = session.pair.make_decoder(
        PromptCache(target.model), session.settings, max_tokens=200, costs=PairCosts(), index=None
    )
    prompt = target.tokenizer.encode(PROMPTS[0])
    assert decoder.drafter.start(prompt) == len(prompt) - 1  # what the draft read (the catch-up timed)
    assert decoder.drafter.start(prompt) == 0  # ... and again: all of it cached
    decoder._draft_ready, decoder._catch_up_s = True, 0.01  # 10 ms a missed token
    decoder.drafter.observe_tokens(list(range(1, 51)))  # 50 plain tokens it did not read
    assert decoder.drafter.unseen() == 50
    decoder.controller = losing_pilot()
    assert decoder._catch_up_pays(left=200)  # α is an earlier turn's: this turn scouts once
    assert not decoder._catch_up_pays(left=199)  # ... if it reads at most a quarter as many tokens as are left
    decoder._alpha_this_turn = True  # (as its scout or a cycle sets it)
    assert not decoder._catch_up_pays(left=200)  # 0.5 s to read, nothing to win back
    for _ in range(20):
        decoder.controller.observe_cycle(drafted=3, proposed=3, accepted=3, draft_s=0.09, verify_s=0.14)
    assert decoder._catch_up_pays(left=200)  # 0.5 s against 200 tokens' saving
    assert not decoder._catch_up_pays(left=2)  # ... but not against two tokens' saving
    decoder._note_pace(0.1, 3)  # lookups have been giving three tokens in a plain step's time
    assert not decoder._catch_up_pays(left=200)  # the draft must beat them, and cannot
    decoder.controller = losing_pilot()
    decoder.drafter.pending = decoder.drafter.pending[-5:]
    assert decoder._catch_up_pays(left=200)  # four missed tokens: the next proposal feeds them


class _TimedDraft:
    """A loaded draft whose model calls advance a fake clock: 1 ms a call, 1 ms a token fed."""

    def __init__(self, draft, clock):
        self._draft, self.clock, self.fed = draft, clock, []

    def __getattr__(self, name):
        return getattr(self._draft, name)

    @property
    def model(self):
        def call(tokens, cache):
            self.fed.append(tokens.shape[1])
            self.clock[0] += 0.001 * (1 + tokens.shape[1])
            return self._draft.model(tokens, cache=cache)

        return call


def test_a_draft_cycle_times_the_missed_tokens_it_reads_as_a_catch_up(models, monkeypatch):
    """After plain steps or lookups the draft reads every token it missed before drafting.
    Read in the proposal's first step, that reading counted as drafting: after ~160 looked-up
    tokens a 0.5B draft's step measured 4.9x its 1.5B target's, and `auto` kept (and stored)
    "drafting cannot pay". The reading is a catch-up of its own now, and a draft step costs
    what one costs."""
    target, draft = models["llama"], models["llama-draft"]
    prompt = target.tokenizer.encode(PROMPTS[0])
    cache = make_prompt_cache(target.model)
    logits = target.model(mx.array(prompt[:-1])[None], cache=cache)
    sequence = list(prompt)
    for _ in range(40):  # the target's own greedy tokens, which the draft misses
        logits = target.model(mx.array(sequence[-1:])[None], cache=cache)
        sequence.append(int(mx.argmax(logits[0, -1]).item()))
    expected = []
    for token in sequence[-1:] * 4:  # what the target says next: the cycle must say it too
        logits = target.model(mx.array([expected[-1] if expected else token])[None], cache=cache)
        expected.append(int(mx.argmax(logits[0, -1]).item()))
    for layer in cache:
        layer.trim(4)
    held = PromptCache(target.model)
    held.layers = cache
    clock = [0.0]
    monkeypatch.setattr(speculative.time, "perf_counter", lambda: clock[0])
    drafter = SameTokenizerDrafter(draft, TokenDistribution(settings()), None, 64)
    controller = SpeculationAutopilot("on", 3, has_draft=True, lookup=False)
    decoder = SpeculativeDecoder(target.model, held, drafter, controller, TokenDistribution(settings()), max_tokens=9)
    drafter.start(prompt)
    drafter.observe_tokens(sequence[len(prompt) :])
    decoder._draft_ready, decoder._held = True, len(sequence) - 1
    assert drafter.unseen() == 40
    drafter.draft = _TimedDraft(draft, clock)  # from here its calls are timed
    steps = decoder._draft_cycle(sequence, 3)
    assert [token for token, _ in steps] == expected[: len(steps)]
    assert drafter.draft.fed == [40, 1, 1, 1]  # the catch-up, then one token a draft step
    assert controller.t_draft.value == pytest.approx(0.002)  # a step's cost, not the catch-up's
    assert decoder._catch_up_s == pytest.approx(0.041 / 40)
    assert decoder.stats.draft_s == pytest.approx(0.041 + 0.006)


def test_auto_skips_a_draft_that_would_read_a_long_prompt_for_a_short_answer(models):
    target, draft = models["llama"], models["llama-draft"]
    session = Session(target, settings(spec_decode="auto", max_tokens=2), draft=draft)
    # a cheap draft: it could pay
    controller = SpeculationAutopilot("auto", 3, has_draft=True, lookup=False, cost_ratio=0.1)
    session.pair.controller, session.pair.controller_key = controller, ("auto", 3, False)
    done = chat(session, [PROMPTS[0] * 4])[0][0]
    assert done.metrics.spec_decode.startswith("off: the draft would first read")
    assert done.metrics.draft_prefill_s == 0 and session.pair.cache.tokens == []


def test_scout_scores_the_draft_on_the_targets_plain_tokens(models):
    """A target drafting for itself would have proposed every token it decoded (greedy);
    another draft fewer. Scouting leaves the draft caught up but for the last token."""
    target, other = models["llama"], models["llama-draft"]
    prompt = target.tokenizer.encode(PROMPTS[0])
    cache, answer = make_prompt_cache(target.model), []
    logits = target.model(mx.array(prompt)[None], cache=cache)
    for _ in range(12):  # the target's own greedy continuation
        answer.append(int(mx.argmax(logits[0, -1]).item()))
        logits = target.model(mx.array(answer[-1:])[None], cache=cache)
    for draft, expect_all in ((target, True), (other, False)):
        drafter = SameTokenizerDrafter(draft, TokenDistribution(settings()), None, 64)
        drafter.start(prompt)
        for token in answer:
            drafter.observe_tokens([token])
        hits, positions = drafter.scout()
        assert positions == len(answer)
        assert (hits == positions) if expect_all else (hits < positions)
        assert drafter.tc.tokens == prompt + answer[:-1] and drafter.pending == answer[-1:]
        assert drafter.scout() == (0.0, 0)  # nothing new to read


def test_pipelined_plain_runs_report_their_mean_step_time(models, monkeypatch):
    """A pipelined run's single intervals alternate (a read may wait for the next queued
    step too), so the controller gets each run's mean over all its steps, timed from the
    first one's queueing: the same total time, one value. The turn's first run traces the
    compiled step and reports nothing; steps taken one at a time are reported one by one."""
    seen, runs = [], []
    observe, after, run = (
        DraftLengthController.observe_plain,
        SpeculativeDecoder._after_plain,
        SpeculativeDecoder._plain_run,
    )

    def observe_spy(self, seconds, count=1):
        seen.append((seconds, count))
        observe(self, seconds, count)

    def after_spy(self, sequence, token, elapsed, **kw):
        runs[-1].append(elapsed) if not kw.get("timed", True) else runs.append(["one", elapsed])
        after(self, sequence, token, elapsed, **kw)

    def run_spy(self, sequence, count):
        runs.append(["run"])
        yield from run(self, sequence, count)

    monkeypatch.setattr(DraftLengthController, "observe_plain", observe_spy)
    monkeypatch.setattr(SpeculativeDecoder, "_after_plain", after_spy)
    monkeypatch.setattr(SpeculativeDecoder, "_plain_run", run_spy)
    session = Session(models["llama"], settings(spec_decode="auto", max_tokens=30), draft=models["llama-draft"])
    done = chat(session, PROMPTS[:1])[0][0]
    assert done.metrics.decode_step == "compiled"
    assert any(count > 1 for _, count in seen)  # runs were pipelined, each reported once
    pipelined = [steps[1:] for steps in runs if steps[0] == "run" and len(steps) > 1]
    reported = pipelined[1:] + [steps[1:] for steps in runs if steps[0] == "one"]  # (the first traced)
    assert sum(count for _, count in seen) == sum(len(steps) for steps in reported)
    assert sum(s * count for s, count in seen) == pytest.approx(sum(sum(steps) for steps in reported), rel=1e-6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafting_stops_after_a_token_the_draft_is_unsure_of(models, monkeypatch, temperature):
    """`auto` drafts stop at the first token the draft gave less than the threshold (its
    softmax when greedy: the one-hot distribution says nothing); `on` drafts all k."""
    target, draft = models["llama"], models["llama-draft"]
    prompt = target.tokenizer.encode(PROMPTS[0])
    seen = []
    original = TokenDistribution.confidence
    monkeypatch.setattr(TokenDistribution, "confidence", lambda self, *a: seen.append(original(self, *a)) or seen[-1])

    def propose(stop_below):
        mx.random.seed(5)
        drafter = SameTokenizerDrafter(draft, TokenDistribution(settings(temperature=temperature)), None, 64)
        drafter.start(prompt)
        return drafter.propose(6, stop_below)

    full = propose(0.0)
    assert full.drafted == 6 and seen == []  # no threshold: nothing computed
    assert propose(1e-12).tokens == full.tokens
    confidences = list(seen)
    assert len(confidences) == 5 and all(0 < c < 1 for c in confidences)
    assert propose(1.01).drafted == 1
    threshold = sorted(confidences)[2] + 1e-9
    stop = next(i for i, c in enumerate(confidences) if c < threshold)
    cut = propose(threshold)
    assert cut.drafted == stop + 1 and cut.tokens == full.tokens[: stop + 1]
    assert DraftLengthController("auto", 3).stop_below() > 0 and DraftLengthController("on", 3).stop_below() == 0


def test_only_a_same_tokenizer_draft_scouts(models):
    """A translating draft's scout overstated acceptance (hits in its own tokens, not target
    tokens that survive re-tokenization): `auto` measures it with real cycles instead."""
    target = models["llama"]
    prompt = target.tokenizer.encode(PROMPTS[0])
    dist = TokenDistribution(settings())
    scouted = {}
    for name, drafter in (
        ("same", SameTokenizerDrafter(target, dist, None, 64)),
        ("cross", TranslatingDrafter(models["cross"], target.tokenizer, dist, None, 64)),
    ):
        cache = make_prompt_cache(target.model)
        target.model(mx.array(prompt[:-1])[None], cache=cache)
        controller = SpeculationAutopilot("auto", 3, has_draft=True, lookup=False, cost_ratio=0.01)
        held = PromptCache(target.model)
        held.layers = cache
        # (120 tokens: the tiny cross draft's near-character tokens miss 17 in the first 8 plain
        # steps, and a first catch-up may read at most a quarter of what is left to answer)
        decoder = SpeculativeDecoder(target.model, held, drafter, controller, dist, rule="match", max_tokens=120)
        list(decoder.steps(prompt))
        scouted[name] = decoder.stats.scouted
        assert decoder.stats.cycles > 0  # both drafted
    assert scouted["same"] > 0 and scouted["cross"] == 0


def test_a_drafting_turn_reports_the_draft_steps_measured_cost(models):
    """The app ranks drafts by this: a draft step's time over a target step's, both measured."""
    target, draft = models["qwen2"], models["qwen2-draft"]
    events = list(Session(target, settings(spec_decode="on", max_tokens=40, num_draft=4), draft=draft).send(PROMPTS[0]))
    done = next(e for e in events if isinstance(e, TurnFinished))
    assert done.metrics.draft_tokens and 0.0 < done.metrics.draft_cost_ratio < 10.0
    plain = list(Session(target, settings(spec_decode="off", max_tokens=8)).send(PROMPTS[0]))
    assert next(e for e in plain if isinstance(e, TurnFinished)).metrics.draft_cost_ratio == 0.0
