"""Every sampling setting the engine has, in the chat's settings: saved per chat, refused with
a clear line when it cannot be used, and sent with the next turn. System-prompt presets:
built in and the user's own, picked, saved and deleted in the panel."""

import json
import sqlite3

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog

from brisk.app.widgets.prompt_presets import BUILTIN_PRESETS
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import Answer, ConversationEvent


def saved(db_path, cid) -> dict:
    with sqlite3.connect(db_path) as db:
        return json.loads(db.execute("SELECT settings FROM conversations WHERE id = ?", (cid,)).fetchone()[0])


def send(qtbot, w, engine, text):
    w.composer.edit.setPlainText(text)
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    command = engine.commands[-1]
    assert isinstance(command, Answer)
    engine.play(ConversationEvent(command.conversation_id, TurnFinished("ok", [1], TurnMetrics(finish_reason="stop"))))
    return command


def test_every_sampling_setting_is_saved_with_its_chat_and_reaches_the_engine(qtbot, make_window, engine, db_path):
    w = make_window()
    panel = w.settings_panel
    first = send(qtbot, w, engine, "hello").conversation_id
    panel.temperature.setValue(0.3)
    panel.top_p.setValue(0.9)
    panel.top_k.setValue(40)
    panel.min_p.setValue(0.05)
    panel.repetition_penalty.setValue(1.15)
    qtbot.keyClicks(panel.seed, "1234")
    panel.max_tokens.setValue(77)
    expected = dict(temperature=0.3, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.15, seed=1234, max_tokens=77)
    assert {k: saved(db_path, first)[k] for k in expected} == expected
    sent = send(qtbot, w, engine, "again").settings
    assert {k: getattr(sent, k) for k in expected} == expected

    w.controller.new_conversation()  # a new chat starts from the one it was made from...
    second = send(qtbot, w, engine, "other").conversation_id
    panel.top_k.setValue(0)
    panel.seed.clear()
    assert (panel.top_k.text(), saved(db_path, second)["top_k"], saved(db_path, second)["seed"]) == ("off", 0, None)
    w.controller.open(first)  # ...and each keeps its own
    assert (panel.top_k.value(), panel.seed.text(), round(panel.min_p.value(), 2)) == (40, "1234", 0.05)
    assert send(qtbot, w, engine, "third").settings.top_k == 40


@pytest.mark.parametrize(
    "typed, why",
    [
        ("12a", "Seed must be a whole number from 0 to 9,223,372,036,854,775,807"),
        ("-5", "Seed must be a whole number"),
        (str(2**63), "Seed must be at most 9,223,372,036,854,775,807"),
    ],
)
def test_a_seed_that_cannot_be_used_is_refused_in_one_line_and_nothing_is_lost(
    qtbot, make_window, engine, db_path, typed, why
):
    w = make_window()
    panel = w.settings_panel
    cid = send(qtbot, w, engine, "hello").conversation_id
    qtbot.keyClicks(panel.seed, "7")
    panel.seed.clear()
    panel.seed.setText(typed)  # pasted (typed, each valid prefix would be saved on the way)
    assert panel.problem.isVisibleTo(panel) and panel.problem.text().startswith(why)
    assert "\n" not in panel.problem.text() and saved(db_path, cid)["seed"] is None  # the last good value
    assert send(qtbot, w, engine, "still answers").settings.seed is None
    panel.seed.setText("42")
    assert not panel.problem.isVisibleTo(panel) and saved(db_path, cid)["seed"] == 42


def test_a_setting_the_engine_refuses_is_said_in_its_words_and_not_saved(qtbot, make_window, engine, db_path):
    """The spin boxes keep to the engine's bounds; the panel still asks the engine's own check
    (ChatSettings.validate) before saving, so a bound that changes there is never saved past."""
    w = make_window()
    panel = w.settings_panel
    cid = send(qtbot, w, engine, "hello").conversation_id
    panel.min_p.setMaximum(1.0)  # as if a bound here were looser than the engine's
    panel.min_p.setValue(1.0)
    assert panel.problem.text() == "Not saved: Invalid chat settings: min_p must be in [0, 1) (got 1.0)"
    assert saved(db_path, cid)["min_p"] == 0.0 and panel.settings().min_p == 0.0


def test_a_built_in_preset_fills_the_system_prompt_and_the_chat_saves_it(qtbot, make_window, engine, db_path):
    w = make_window()
    panel = w.settings_panel
    cid = send(qtbot, w, engine, "hello").conversation_id
    names = [panel.presets.combo.itemText(i) for i in range(panel.presets.combo.count())]
    assert set(BUILTIN_PRESETS) <= set(names) and len(BUILTIN_PRESETS) >= 3
    panel.presets.combo.setCurrentText("Concise")
    panel.presets.combo.activated.emit(panel.presets.combo.currentIndex())  # as a user's pick
    assert panel.system.toPlainText() == BUILTIN_PRESETS["Concise"]
    assert saved(db_path, cid)["system_prompt"] == BUILTIN_PRESETS["Concise"]
    assert send(qtbot, w, engine, "next").settings.system_prompt == BUILTIN_PRESETS["Concise"]
    assert not panel.presets.delete_button.isEnabled()  # built-in ones stay


def test_a_saved_preset_is_kept_across_launches_and_can_be_deleted(qtbot, make_window, engine, monkeypatch, tmp_path):
    w = make_window()
    panel = w.settings_panel
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("  Pirate  voice ", True)))
    panel.system.setPlainText("Answer like a pirate.")
    qtbot.mouseClick(panel.presets.save_button, Qt.LeftButton)
    assert panel.presets.combo.currentText() == "Pirate voice" and not panel.problem.isVisibleTo(panel)
    w.close()

    again = make_window(tmp_path / "other.db")  # another launch, another database: the preset is the app's
    other = again.settings_panel
    assert other.system.toPlainText() == ""
    index = other.presets.combo.findText("Pirate voice")
    other.presets.combo.setCurrentIndex(index)
    other.presets.combo.activated.emit(index)
    assert other.system.toPlainText() == "Answer like a pirate." and other.presets.delete_button.isEnabled()
    qtbot.mouseClick(other.presets.delete_button, Qt.LeftButton)
    assert other.presets.combo.findText("Pirate voice") == -1
    assert other.system.toPlainText() == "Answer like a pirate."  # deleting a preset leaves the chat's prompt


@pytest.mark.parametrize(
    "name, prompt, why",
    [
        ("Concise", "mine", "“Concise” is a built-in preset: choose another name"),
        ("   ", "mine", "A preset needs a name"),
        ("Empty", "", "Write a system prompt first, then save it as a preset"),
        ("x" * 61, "mine", "A preset's name can be at most 60 characters"),
    ],
)
def test_a_preset_that_cannot_be_saved_says_why(qtbot, make_window, monkeypatch, name, prompt, why):
    from brisk.app.preferences import saved_prompt_presets

    panel = make_window().settings_panel
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: (name, True)))
    panel.system.setPlainText(prompt)
    qtbot.mouseClick(panel.presets.save_button, Qt.LeftButton)
    assert panel.problem.text() == why and saved_prompt_presets() == {}


def test_hand_edited_presets_that_are_not_names_and_texts_are_skipped(qtbot, make_window):
    from brisk.app.preferences import PRESETS_KEY, preferences, saved_prompt_presets

    store = preferences()
    store.setValue(PRESETS_KEY, json.dumps({"ok": "fine", "": "no name", "n": 5, "blank": "  "}))
    store.sync()
    assert saved_prompt_presets() == {"ok": "fine"}
    store.setValue(PRESETS_KEY, "[not json")
    store.sync()
    assert saved_prompt_presets() == {}
    panel = make_window().settings_panel  # and the panel opens with the built-in ones
    assert panel.presets.combo.findText("Concise") > 0
