"""Sessions: greedy parity with mlx-lm, prompt-cache reuse, edits, cancellation, overflow."""

import mlx.core as mx
import pytest

from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.events import ContextTruncated, EngineErrored, PrefillProgressed, TokenEmitted, TurnFinished
from brisk.engine.api.session import CancelToken, Message, Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.turn.prompt import encode_messages

GREEDY = dict(temperature=0.0, max_tokens=24)


def run(events):
    events = list(events)
    finished = [e for e in events if isinstance(e, TurnFinished)]
    errors = [e for e in events if isinstance(e, EngineErrored)]
    return events, (finished[0] if finished else None), errors


def mlx_lm_greedy(lm, tokens, max_tokens):
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(mx.array(tokens), lm.model, max_tokens=max_tokens):
        if token in lm.tokenizer.eos_token_ids:
            break
        out.append(token)
    return out


def test_greedy_answer_equals_mlx_lm(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY))
    events, done, errors = run(session.send("The quick brown fox"))
    assert not errors
    expected = mlx_lm_greedy(tiny_llama, encode_messages(tiny_llama, session.messages[:1]), 24)
    assert done.token_ids == expected
    assert done.text == tiny_llama.tokenizer.decode(expected)
    assert "".join(e.text for e in events if isinstance(e, TokenEmitted)) == done.text


def test_plain_decoding_takes_the_compiled_step_with_mlx_lm_answers(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", spec_decode="off", **GREEDY))
    _, done, errors = run(session.send("The quick brown fox"))
    assert not errors
    assert done.token_ids == mlx_lm_greedy(tiny_llama, encode_messages(tiny_llama, session.messages[:1]), 24)
    assert done.metrics.decode_step == "compiled"  # engine/decode/compiled.py


def test_a_packed_kv_turn_decodes_with_generate_step_and_says_why(tiny_llama):
    settings = ChatSettings(model="tiny", spec_decode="off", k_bits=8, v_bits=16, kv_quant_start=0, **GREEDY)
    session = Session(tiny_llama, settings)
    _, done, errors = run(session.send("The quick brown fox"))
    assert not errors and done.token_ids
    assert done.metrics.decode_step == "mlx-lm: a packed KV cache (it is repacked between tokens)"


def test_second_turn_prefills_only_new_tokens_and_matches_a_cold_run(tiny_llama):
    warm = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY))
    _, first, _ = run(warm.send("The quick brown fox"))
    _, second, _ = run(warm.send("jumps over the lazy dog"))
    m = second.metrics
    # Independently of the session's bookkeeping: the cache held the first prompt and the
    # answer's tokens; the second prompt shares a prefix with that, and only the rest runs.
    held = encode_messages(tiny_llama, warm.messages[:1]) + first.token_ids
    prompt = encode_messages(tiny_llama, warm.messages[:3])
    common = next((i for i, (a, b) in enumerate(zip(held, prompt)) if a != b), min(len(held), len(prompt)))
    assert m.prompt_tokens == len(prompt)
    assert m.cached_tokens == min(common, len(prompt) - 1) >= first.metrics.prompt_tokens
    assert m.prefilled_tokens == len(prompt) - m.cached_tokens

    cold = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY), messages=warm.messages[:3])
    _, cold_second, _ = run(cold.answer())
    assert cold_second.metrics.cached_tokens == 0
    assert cold_second.token_ids == second.token_ids


def test_cache_holds_exactly_the_tracked_tokens(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY))
    run(session.send("Zażółć gęślą jaźń"))
    assert all(c.offset == session.cached_tokens for c in session.cache.layers)


def test_edit_trims_the_cache_to_the_common_prefix(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY))
    run(session.send("first question"))
    run(session.send("second question"))
    _, edited, _ = run(session.edit(2, "second question, reworded"))
    assert len(session.messages) == 4
    assert session.messages[2].content == "second question, reworded"
    fresh = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY), messages=session.messages[:3])
    _, cold, _ = run(fresh.answer())
    assert edited.metrics.cached_tokens > 0
    assert edited.token_ids == cold.token_ids


def test_regenerate_replaces_the_last_answer(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", temperature=1.0, max_tokens=8, seed=1))
    run(session.send("hello"))
    session.settings.seed = 2
    _, again, _ = run(session.regenerate())
    assert [m.role for m in session.messages] == ["user", "assistant"]
    assert session.messages[-1].content == again.text


def test_cancel_during_prefill_keeps_a_consistent_cache(tiny_llama):
    settings = ChatSettings(model="tiny", prefill_step_size=16, **GREEDY)
    session = Session(tiny_llama, settings)
    cancel = CancelToken()
    events = []
    for event in session.send("The quick brown fox jumps over the lazy dog. " * 8, cancel=cancel):
        events.append(event)
        if isinstance(event, PrefillProgressed) and event.done >= 32:
            cancel.cancel()
    done = [e for e in events if isinstance(e, TurnFinished)][0]
    assert done.metrics.finish_reason == "cancelled"
    assert not any(isinstance(e, TokenEmitted) for e in events)
    assert 0 < session.cached_tokens < done.metrics.prompt_tokens
    assert all(c.offset == session.cached_tokens for c in session.cache.layers)
    # The retry reuses what was prefilled and answers as a cold run would.
    session.messages.pop()  # the empty cancelled answer
    _, retry, _ = run(session.answer())
    cold = Session(tiny_llama, settings, messages=session.messages[:1])
    _, reference, _ = run(cold.answer())
    assert retry.metrics.cached_tokens >= 32
    assert retry.token_ids == reference.token_ids


def test_cancel_during_decode_keeps_the_partial_answer_marked(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", temperature=0.0, max_tokens=64))
    cancel = CancelToken()
    n = 0
    for event in session.send("hello", cancel=cancel):
        if isinstance(event, TokenEmitted):
            n += 1
            if n == 5:
                cancel.cancel()
    answer = session.messages[-1]
    assert answer.role == "assistant" and answer.finish_reason == "cancelled"
    assert len(answer.token_ids) == 5
    assert all(c.offset == session.cached_tokens for c in session.cache.layers)


def test_context_overflow_is_refused_with_both_numbers(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY))
    events, done, errors = run(session.send("fox " * 600))
    assert done is None and errors[0].kind == "context_overflow"
    needed = len(encode_messages(tiny_llama, session.messages)) + 1
    assert "512" in errors[0].message and str(needed) in errors[0].message


def test_truncate_oldest_drops_whole_turns_and_says_so(tiny_llama):
    history = []
    for i in range(6):
        history += [Message("user", f"question {i} " + "fox " * 40), Message("assistant", "answer " * 20)]
    session = Session(
        tiny_llama, ChatSettings(model="tiny", context_overflow="truncate_oldest", **GREEDY), messages=history
    )
    events, done, errors = run(session.send("last question"))
    truncated = [e for e in events if isinstance(e, ContextTruncated)]
    assert not errors and truncated and truncated[0].dropped_messages % 2 == 0
    assert done.metrics.prompt_tokens <= 512
    assert len(session.messages) == 14  # the saved conversation keeps everything


def test_answer_stops_at_the_context_limit(tiny_llama, monkeypatch):
    # No end-of-sequence token: the answer can only end at the context limit.
    monkeypatch.setattr(tiny_llama.tokenizer, "_eos_token_ids", set())
    session = Session(tiny_llama, ChatSettings(model="tiny", temperature=0.0, max_tokens=10_000))
    _, done, _ = run(session.send("hello"))
    m = done.metrics
    assert m.finish_reason == "context"
    assert m.prompt_tokens + m.generated_tokens == 512


def test_kv_bytes_measured_equals_the_formula(tiny_llama):
    session = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY))
    _, done, _ = run(session.send("The quick brown fox"))
    m = done.metrics
    # 2 (K, V) * 2 layers * 2 kv heads * 16 head dim * tokens * 2 bytes (stored float16)
    assert m.kv_bytes == m.kv_bytes_formula == 2 * 2 * 2 * 16 * session.cached_tokens * 2
    assert m.kv_bytes_allocated >= m.kv_bytes
    assert m.peak_memory_bytes > 0 and m.ttft_s > 0
    # generation runs from the prompt read to the last token: it holds the first-to-last
    # token span and the first token's own step, and sits inside the turn
    assert m.generated_tokens > 1
    assert (m.generated_tokens - 1) / m.decode_tps < m.generation_s < m.total_s


def test_invalid_settings_are_refused():
    with pytest.raises(InvalidSettings, match="top_p"):
        ChatSettings(top_p=0).validate()
    with pytest.raises(InvalidSettings, match="context_overflow"):
        ChatSettings(context_overflow="wrap").validate()
    restored = ChatSettings.from_dict({"temperature": 0.3, "from_a_newer_version": True})
    assert restored.temperature == 0.3


def test_a_crash_inside_generation_becomes_an_error_event(tiny_llama, monkeypatch):
    session = Session(tiny_llama, ChatSettings(model="tiny", **GREEDY))

    def boom(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr("brisk.engine.turn.prefill_phase.prefill_chunks", boom)
    _, done, errors = run(session.send("hello"))
    assert done is None and "simulated kernel failure" in errors[0].message
    assert session.messages[0].content == "hello"  # the user's message survives
    monkeypatch.undo()
    _, done, errors = run(session.regenerate())
    assert done is not None and not errors


def test_turn_metrics_take_only_their_own_fields():
    from brisk.engine.api.metrics import TurnMetrics

    metrics = TurnMetrics()
    metrics.update({"decode_tps": 12.5, "generated_tokens": 3})
    assert (metrics.decode_tps, metrics.generated_tokens) == (12.5, 3)
    with pytest.raises(AttributeError, match="decode_tsp"):
        metrics.update({"decode_tsp": 1.0})  # a misspelt phase result is caught, not stored
    assert not hasattr(metrics, "decode_tsp")


def test_drafting_turns_divide_by_the_whole_generation():
    from brisk.engine.api.metrics import TurnMetrics, turn_rates

    clock = dict(start=0.0, prompt_read_at=1.0, first_at=2.0, end=5.0)
    plain = turn_rates(TurnMetrics(prompt_tokens=10, ttft_s=2.0), generated=7, **clock)
    assert plain["decode_tps"] == 6 / 3.0 and plain["prefill_tps"] == 5.0 and plain["generation_s"] == 4.0
    drafted = turn_rates(TurnMetrics(prompt_tokens=10, ttft_s=2.0, draft_tokens=4), generated=7, **clock)
    assert drafted["decode_tps"] == 7 / 4.0  # a cycle's tokens arrive together: first-to-last would flatter it
    assert "decode_tps" not in turn_rates(TurnMetrics(), generated=3, **{**clock, "first_at": None})
