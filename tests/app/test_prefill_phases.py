"""The prefill bar: a sparse prefill's phases each with their own progress, the KV check
named while it runs, and an ETA from the measured cost per token."""

import pytest

from app.widgets.prefill_bar import PrefillBar, estimate_left
from engine.events import PrefillProgressed
from engine.worker import ConversationEvent
from tests.app.test_window import send


def cost_until(position, base=1e-3, slope=1e-6):
    """Seconds to read tokens [0, position) when each costs base + slope * its position."""
    return base * position + slope / 2 * position**2


def test_the_eta_follows_a_cost_that_grows_with_position():
    total = 8000
    samples = [(0.0, 0)] + [(cost_until(d) + 2.0, d) for d in range(500, 2001, 500)]  # +2 s: a slow first chunk
    true_left = cost_until(total) - cost_until(2000)
    left = estimate_left(samples, total)
    assert left == pytest.approx(true_left, rel=0.05)
    elapsed, done = samples[-1]
    averaged = elapsed * (total - done) / done  # the old estimate: the phase's mean rate
    assert abs(averaged - true_left) / true_left > 0.2


def test_one_chunk_gives_a_constant_rate_and_none_gives_no_eta():
    assert estimate_left([(0.0, 0), (2.0, 100)], 300) == pytest.approx(4.0)
    assert estimate_left([(0.0, 0)], 300) is None


def test_each_phase_has_its_own_words_count_and_clock(qtbot):
    now = [0.0]
    bar = PrefillBar(clock=lambda: now[0])
    qtbot.addWidget(bar)
    bar.start()
    bar.progress(0, 4000, "draft")
    now[0] = 10.0
    bar.progress(2000, 4000, "draft")
    assert bar.format() == "Step 1 of 3: The draft reads the prompt: 50% of 4,000 tokens · about 10 s left"
    assert bar.value() == 500
    bar.progress(0, 4000, "select")
    assert bar.format() == "Step 2 of 3: The draft chooses what to keep…" and bar.isVisible()
    now[0] = 20.0
    bar.progress(0, 1200, "kept")
    now[0] = 23.0
    bar.progress(300, 1200, "kept")  # its rate, not the draft's: 100 tok/s
    assert bar.format() == "Step 3 of 3: The model reads the kept part: 25% of 1,200 tokens · about 9 s left"
    bar.progress(1200, 1200, "prompt")
    assert not bar.isVisible()


def test_the_window_names_the_kv_check_and_the_sparse_phases(qtbot, make_window, engine):
    w = make_window()
    cid = send(qtbot, w).conversation_id
    engine.play(ConversationEvent(cid, PrefillProgressed(0, 64, "kv_check")))
    assert w.prefill_bar.isVisibleTo(w) and "Checking packed KV" in w.prefill_bar.format()
    engine.play(
        ConversationEvent(cid, PrefillProgressed(0, 900, "draft")),
        ConversationEvent(cid, PrefillProgressed(450, 900, "draft")),
    )
    assert w.prefill_bar.format().startswith("Step 1 of 3: The draft reads the prompt: 50% of 900 tokens")
    engine.play(ConversationEvent(cid, PrefillProgressed(0, 270, "kept")))
    assert w.prefill_bar.format().startswith("Step 3 of 3: The model reads the kept part: 0% of 270 tokens")
