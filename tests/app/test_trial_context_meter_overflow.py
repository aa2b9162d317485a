"""The context meter past a full context (a real X server trial, 2026-11-27): a 16,000-word
document showed 'more than 9,778 of 8,192 tokens · documents 12,407' (the part above the
whole, and the documents' count not said to be a lower bound), and its amber bar hid the red
that says the context is full."""

from PySide6.QtGui import QColor
from test_settings_context_meter import CONTEXT, loaded_chat, measured

from brisk.app.widgets.context_meter import DOCUMENTS_COLOUR, FULL_COLOUR, ContextMeter
from brisk.engine.host.worker import DocumentChecked
from brisk.engine.turn.documents import Document, Fit


def colours(widget) -> set[str]:
    image = widget.grab().toImage()
    return {QColor(image.pixel(x, y)).name() for x in range(0, image.width(), 2) for y in range(image.height())}


def test_documents_counted_past_the_context_never_exceed_the_whole_and_say_more_than(qtbot, make_window, engine):
    w, cid = loaded_chat(qtbot, make_window, engine)
    seen = measured(qtbot, w, engine, 0)
    # the engine stopped counting this document past the context: 5,000 is a lower bound
    doc = Document("huge.txt", "text", "river " * 20, 120)
    engine.play(DocumentChecked(cid, doc, Fit(5000, 5000, CONTEXT, 0, 0, False, "too big", tokens_exact=False)))
    measured(qtbot, w, engine, seen)
    text = w.composer.meter.label.text()
    assert text == f"Context: more than 5,000 of {CONTEXT:,} tokens (244%) · documents more than 5,000", text


def test_a_context_filled_by_documents_still_shows_red(qtbot):
    meter = ContextMeter()
    qtbot.addWidget(meter)
    meter.resize(300, 20)
    meter.show()
    qtbot.waitExposed(meter)
    meter.show_fill(9778, 8192, 9739, exact=False)
    seen = colours(meter.bar)
    assert FULL_COLOUR in seen and DOCUMENTS_COLOUR in seen
    assert meter.label.styleSheet()  # the words turn red with the bar
    meter.show_fill(100, 8192, 50)
    assert FULL_COLOUR not in colours(meter.bar) and not meter.label.styleSheet()
