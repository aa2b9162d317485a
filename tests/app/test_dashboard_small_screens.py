"""The dashboard on small screens (a trial at 1366x768 and 1280x800): the TTFT box's wrapped
lines must not be squeezed over each other, the speed chart's legend must not be cut off, the
window must fit a 1024-wide screen, and a first message's model load is said as happening."""

from tests.app.test_dashboard_ttft import finish, turn
from tests.app.test_window import send

PARTS = dict(
    engine_started_at=1.0,
    queue_s=2.0,
    waited_s=15.6,
    model_load_s=6.4,
    cache_restore_s=1.2,
    restored_tokens=17_000,
    prepare_s=0.05,
    prefill_s=3.9,
    first_step_s=0.2,
    prompt_tokens=18_000,
    cached_tokens=17_000,
    prefilled_tokens=1_000,
)


def shown_small(qtbot, w, width=1366, height=768, scale=1.3):
    """A few turns with every part of the wait, on a small screen with a larger font (a
    desktop's scaling), the window laid out."""
    font = w.dashboard.font()
    font.setPointSizeF(font.pointSizeF() * scale)
    w.dashboard.setFont(font)
    w.dashboard.set_chat_models("big", "tiny")
    w.dashboard.show_history([turn(**PARTS, decode_tps=10.0 + i).to_dict() for i in range(4)], model="big")
    w.resize(width, height)
    qtbot.wait(50)  # the layout and the scroll area settle


def test_ttft_box_lines_get_the_height_their_wrapped_text_needs(qtbot, make_window):
    w = make_window()
    shown_small(qtbot, w)
    d = w.dashboard
    labels = [d.ttft, d.breakdown, d.saved, d.recent]
    assert all(label.text() for label in labels)
    for label in labels:
        needed = label.heightForWidth(label.width()) if label.wordWrap() else label.sizeHint().height()
        assert label.height() >= needed, label.text()
        if not label.wordWrap():  # a line that cannot wrap is never wider than its room
            assert label.sizeHint().width() <= label.width(), label.text()
    for above, below in zip(labels, labels[1:]):
        assert above.geometry().bottom() < below.geometry().top()  # drawn over each other before


def test_speed_legend_lies_inside_the_chart_and_the_chart_inside_its_box(qtbot, make_window):
    w = make_window()
    shown_small(qtbot, w)
    chart = w.dashboard.chart
    box = chart.parentWidget()
    assert box.rect().contains(chart.geometry())  # was pushed out of its squeezed box: legend gone
    metrics = chart.fontMetrics()
    rects = chart.legend_rects()
    assert [text for text, _ in rects] == ["● prefill", "● decode", "turn"]
    for text, rect in rects:
        assert chart.rect().toRectF().contains(rect), text
        assert rect.width() >= metrics.horizontalAdvance(text) and rect.height() >= metrics.height()
    for (_, a), (_, b) in zip(rects, rects[1:]):
        assert not a.intersects(b)


def test_legend_wraps_in_a_narrow_chart_and_the_chart_grows_for_it(qtbot, make_window):
    w = make_window()
    chart = w.dashboard.chart
    chart.setFixedWidth(150)  # narrower than one row of the legend
    qtbot.wait(20)
    rows = {rect.top() for _, rect in chart.legend_rects()}
    assert len(rows) > 1
    assert all(chart.rect().toRectF().contains(rect) for _, rect in chart.legend_rects())


def test_model_line_says_loading_while_the_first_message_waits(qtbot, make_window, engine):
    w = make_window()
    d = w.dashboard
    assert d.model_state.text() == "big loads at this chat's next message"
    cid = send(qtbot, w).conversation_id  # the model is not loaded: this message loads it
    assert d.model_state.text() == "Loading big for this message…"
    finish(engine, cid, turn())
    assert d.model_state.text().startswith("big loaded")


def test_window_fits_a_1024_wide_screen(make_window):
    w = make_window()
    assert w.minimumSizeHint().width() <= 1000  # 1065 before: the tint box's long label, the dashboard
