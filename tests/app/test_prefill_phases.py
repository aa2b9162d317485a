"""The prefill bar: a sparse prefill's phases each with their own progress, the KV check
named while it runs, and the engine's ETA for the phase (engine/turn/prefill_eta.py; the bar runs
the same estimator itself only for events that carry none)."""

import pytest

from brisk.app.widgets.prefill_bar import PrefillBar
from brisk.engine.api.events import PrefillProgressed
from brisk.engine.host.worker import ConversationEvent
from brisk.engine.turn.prefill_eta import PrefillEta
from tests.app.test_window import send


def cost_until(position, base=1e-3, slope=1e-6):
    """Seconds to read tokens [0, position) when each costs base + slope * its position."""
    return base * position + slope / 2 * position**2


def test_the_eta_follows_a_cost_that_grows_with_position():
    total = 8000
    eta = PrefillEta()
    for done in range(0, 2001, 500):
        left = eta.update(cost_until(done), done, total)
    true_left = cost_until(total) - cost_until(2000)
    # the model-free prior expects 4x less attention cost than this one: the fit moves most of the way
    assert left == pytest.approx(true_left, rel=0.2)
    averaged = cost_until(2000) * (total - 2000) / 2000  # the old estimate: the phase's mean rate
    assert abs(averaged - true_left) / true_left > 0.2


def test_no_chunk_read_gives_no_eta():
    assert PrefillEta().update(0.0, 0, 300) is None


def test_each_phase_has_its_own_words_count_and_clock(qtbot):
    now = [0.0]
    bar = PrefillBar(clock=lambda: now[0])
    qtbot.addWidget(bar)
    bar.start()
    bar.progress(0, 4000, "draft")
    now[0] = 10.0
    bar.progress(2000, 4000, "draft", 12.0)  # the engine's estimate is shown as given
    assert bar.format() == "Step 1 of 3: The draft reads the prompt: 50% of 4,000 tokens · about 12 s left"
    assert bar.value() == 500
    bar.progress(0, 4000, "select")
    assert bar.format() == "Step 2 of 3: The draft chooses what to keep…" and bar.isVisible()
    now[0] = 20.0
    bar.progress(0, 1200, "kept")
    now[0] = 23.0
    bar.progress(300, 1200, "kept")  # no estimate sent: the bar's own, from this phase's chunks alone
    own = PrefillEta()
    own.update(20.0, 0, 1200, "kept")
    expected = own.update(23.0, 300, 1200, "kept")
    assert 9 <= expected < 13  # 100 tok/s so far, later tokens dearer; the draft's 200 tok/s is not used
    assert bar.format() == (
        f"Step 3 of 3: The model reads the kept part: 25% of 1,200 tokens · about {expected:.0f} s left"
    )
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
