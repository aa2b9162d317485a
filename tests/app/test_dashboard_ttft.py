"""Times as waited (issue 58 items 2 and 8), driven through the real window with a fake
engine: TTFT from Send to the first token on screen, split into the parts the engine
measured; a cache hit labelled, not plotted as a slow prefill; the model line and KV ring of
the open chat's own model; each chat's speed chart from its stored turns; API turns apart."""

import pytest

import brisk.app.chat_turns
from brisk.engine.api.events import EngineErrored, ModelLoaded, PrefillProgressed, TokenEmitted, TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import ConversationEvent
from tests.app.test_window import send


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """The app's clock (Send, the first token on screen), which the engine's stamp shares."""
    fake = Clock()
    monkeypatch.setattr(brisk.app.chat_turns.time, "monotonic", fake)
    return fake


def turn(**kw) -> TurnMetrics:
    base = dict(
        ttft_s=4.15,
        prompt_tokens=900,
        cached_tokens=0,
        prefilled_tokens=900,
        prefill_tps=216.9,
        generated_tokens=2,
        decode_tps=12.5,
        kv_bytes=3 * 2**20,
        finish_reason="stop",
        model_id="big",
        context_length=9030,
    )
    return TurnMetrics(**{**base, **kw})


def finish(engine, cid, m, clock=None, first_at=None):
    if first_at is not None:
        clock.now = first_at
    engine.play(ConversationEvent(cid, TokenEmitted("Hi", 1)))
    engine.play(ConversationEvent(cid, TurnFinished("Hi", [1], m)))


def test_ttft_is_what_was_waited_split_into_its_measured_parts(qtbot, make_window, engine, clock):
    w = make_window()
    cid = send(qtbot, w).conversation_id  # Send at 1000.0
    parts = dict(
        engine_started_at=1002.0,  # another job held the engine for 2 s
        model_load_s=6.4,
        cache_restore_s=1.2,
        restored_tokens=17_000,
        prepare_s=0.05,
        prefill_s=3.9,
        first_step_s=0.2,
    )
    finish(engine, cid, turn(**parts), clock, first_at=1015.6)
    d = w.dashboard
    assert d.ttft.text() == "15.60 s"  # the engine's own TTFT (4.15 s) was shown before
    assert d.breakdown.text() == (
        "waiting for the engine 2.00 s + model load 6.40 s + cache restore 1.20 s (17,000 tokens) + "
        "template 0.05 s + prefill 3.90 s + first step 0.20 s + on screen 1.85 s"
    )
    assert "Send to the first answer token on screen" in d.ttft.toolTip()
    stored = w.store.messages(cid)[-1].metrics
    assert stored["waited_s"] == pytest.approx(15.6) and stored["queue_s"] == pytest.approx(2.0)
    w.controller.open(cid)  # reopened: the same wait, from the store
    assert d.ttft.text() == "15.60 s" and "model load 6.40 s" in d.breakdown.text()


def test_a_cache_hit_is_labelled_not_plotted_as_a_slow_prefill(qtbot, make_window, engine, clock):
    w = make_window()
    cid = send(qtbot, w).conversation_id
    finish(engine, cid, turn())
    cid2 = send(qtbot, w, "again").conversation_id
    hit = turn(prompt_tokens=17_010, cached_tokens=17_000, prefilled_tokens=10, prefill_tps=2.2, restored_tokens=17_000)
    finish(engine, cid2, hit)
    d = w.dashboard
    assert d.chart.series["prefill"] == [216.9, None]  # a gap, not 2.2 tok/s
    assert d.chart.series["decode"] == [12.5, 12.5]
    assert "cache hit: restored 17,000 tokens from disk, read 10 new" in d.speed.text()
    assert "2.2" not in d.speed.text()


def test_the_model_line_and_kv_ring_follow_the_open_chats_model(qtbot, make_window, engine, clock):
    w = make_window()
    engine.play(ModelLoaded("big", {"architecture": "llama", "context_length": 9030}))
    qwen = w.store.create_conversation("qwen chat", {"model": "tiny"})
    w.controller.open(qwen)
    assert w.dashboard.model_state.text() == "tiny loads at this chat's next message"  # it said "big loaded"
    cid = send(qtbot, w).conversation_id
    # no ModelLoaded for the chat's model: the turn itself says which model ran, and its context
    finish(engine, cid, turn(model_id="tiny", context_length=32_768, prompt_tokens=1000, kv_bytes=2**20))
    assert w.dashboard.model_state.text() == "tiny loaded (32,768 tokens of context)"
    assert w.dashboard.kv.value == pytest.approx(1000 / 32_768, rel=0.05)  # it stayed empty
    assert "full 32,768-token context" in w.dashboard.kv_note.text()


def test_each_chat_keeps_its_own_speed_chart_and_api_turns_go_apart(qtbot, make_window, engine, clock):
    w = make_window()
    a = send(qtbot, w, "first chat").conversation_id
    for rate in (100.0, 120.0, 140.0):
        finish(engine, a, turn(prefill_tps=rate))
        if rate < 140:
            send(qtbot, w, f"more {rate}")
    b = w.controller.new_conversation()
    send(qtbot, w, "second chat")
    finish(engine, b, turn(prefill_tps=50.0))
    assert w.dashboard.chart.series["prefill"] == [50.0]
    w.controller.open(a)
    assert w.dashboard.chart.series["prefill"] == [100.0, 120.0, 140.0]  # it reset to one point
    assert w.dashboard.recent.text().count(" s") == 3
    # an API request: its own box; the open chat's chart and numbers stay
    before = w.dashboard.ttft.text()
    engine.play(ConversationEvent(-3, TurnFinished("x", [1], turn(prefill_tps=999.0, ttft_s=0.7))))
    assert w.dashboard.chart.series["prefill"] == [100.0, 120.0, 140.0]
    assert w.dashboard.ttft.text() == before and w.dashboard.chat_model.text().startswith("This chat:")
    assert w.dashboard.api_box.isVisibleTo(w) and w.dashboard.api_chart.series["prefill"] == [999.0]
    assert w.dashboard.api_note.text().startswith("Last API request (big): TTFT 0.70 s")


def test_stale_lines_clear_when_a_turn_starts_fails_or_stops_early(qtbot, make_window, engine, clock):
    w = make_window()
    d = w.dashboard
    cid = send(qtbot, w).conversation_id
    finish(engine, cid, turn(model_load_s=1.0, prefill_s=2.0))
    assert "model load 1.00 s" in d.breakdown.text()
    cid = send(qtbot, w, "again").conversation_id
    assert d.breakdown.text() == "" and d.ttft.text() == "…"  # the last turn's split is not this wait's
    engine.play(ConversationEvent(cid, EngineErrored("Generation failed", "internal")))
    assert d.breakdown.text() == "" and d.saved.text() == "" and d.ttft.text() == "–"
    cid = send(qtbot, w, "and stop").conversation_id
    engine.play(ConversationEvent(cid, TurnFinished("", [], turn(generated_tokens=0, finish_reason="cancelled"))))
    assert d.ttft.text() == "–" and d.breakdown.text() == ""


def test_the_prefill_bar_shows_the_engines_estimate(qtbot, make_window, engine, clock):
    w = make_window()
    cid = send(qtbot, w).conversation_id
    engine.play(ConversationEvent(cid, PrefillProgressed(0, 4000)))
    engine.play(ConversationEvent(cid, PrefillProgressed(1000, 4000, seconds_left=399.0)))
    assert w.prefill_bar.format() == "Reading the prompt: 25% of 4,000 tokens · about 7 min left"
