"""After the open chat is deleted, the settings panel still shows its settings (and takes
edits): the next message's chat must get what is shown, not the app's defaults behind it
(a real X server trial, 2026-11-27: a pirate system prompt and temperature 1.5 on screen,
the new chat answered at 0.7 with no system prompt)."""

import json
import sqlite3

from PySide6.QtCore import Qt

from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import Answer, ConversationEvent


def test_the_chat_started_after_a_delete_gets_the_settings_shown(qtbot, make_window, engine, db_path):
    w = make_window()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    panel = w.settings_panel
    panel.system.setPlainText("You are a pirate.")
    panel.temperature.setValue(1.5)
    w.composer.edit.setPlainText("ahoy")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    first = w.controller.current
    engine.play(ConversationEvent(first, TurnFinished("Arr.", [1], TurnMetrics(finish_reason="stop"))))
    w.sidebar.list.setFocus()
    qtbot.keyClick(w.sidebar.list, Qt.Key_Delete)
    assert w.controller.current is None
    panel.top_k.setValue(40)  # an edit while no chat is open: shown, so kept
    w.composer.edit.setPlainText("and now?")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    second = w.controller.current
    assert second not in (None, first)
    sent = [c for c in engine.commands if isinstance(c, Answer)][-1].settings
    assert (sent.system_prompt, sent.temperature, sent.top_k) == ("You are a pirate.", 1.5, 40)
    with sqlite3.connect(db_path) as db:
        (stored,) = db.execute("SELECT settings FROM conversations WHERE id = ?", (second,)).fetchone()
    stored = json.loads(stored)
    assert (stored["system_prompt"], stored["temperature"], stored["top_k"]) == ("You are a pirate.", 1.5, 40)
    assert panel.temperature.value() == 1.5 and panel.system.toPlainText() == "You are a pirate."
