"""A seed that does not read yet (half typed, or pasted wrong) must not throw away the other
settings changed meanwhile: the temperature set while the seed box said 'abc' was never saved,
and opening another chat and coming back showed the old one (a real X server trial, 2026-11-27)."""

from PySide6.QtCore import Qt

from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import Answer, ConversationEvent


def send(qtbot, w, engine, text):
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    command = engine.commands[-1]
    assert isinstance(command, Answer)
    engine.play(ConversationEvent(command.conversation_id, TurnFinished("ok", [1], TurnMetrics(finish_reason="stop"))))
    return command


def test_other_settings_save_while_the_seed_is_refused(qtbot, make_window, engine):
    w = make_window()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    panel = w.settings_panel
    first = send(qtbot, w, engine, "hello").conversation_id
    panel.seed.setText("42")
    qtbot.keyClicks(panel.seed, "abc")
    assert panel.problem.text().startswith("Seed must be a whole number")
    panel.temperature.setValue(1.3)
    assert panel.problem.text().startswith("Seed must be a whole number")  # still said
    sent = send(qtbot, w, engine, "again").settings
    assert (sent.temperature, sent.seed) == (1.3, 42)
    qtbot.keyClick(w.composer.edit, Qt.Key_N, Qt.ControlModifier)
    send(qtbot, w, engine, "another chat")
    w.controller.open(first)
    assert panel.temperature.value() == 1.3 and panel.seed.text() == "42"
    assert not panel.problem.isVisibleTo(panel)
