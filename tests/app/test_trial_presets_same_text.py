"""A preset saved with the same text as another (a built-in one picked, then saved under a
name of one's own) stays chosen and can be deleted: the picker chose the first preset
holding the text, so 'Delete' stayed greyed out for the user's copy for good (a real X
server trial, 2026-11-27). An empty prompt is refused before a name is asked for."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QInputDialog

from brisk.app.preferences import saved_prompt_presets
from brisk.app.widgets.prompt_presets import BUILTIN_PRESETS


def pick(picker, name):
    index = picker.combo.findText(name)
    picker.combo.setCurrentIndex(index)
    picker.combo.activated.emit(index)  # as a user's pick


def test_a_copy_of_a_built_in_preset_is_chosen_after_saving_and_can_be_deleted(qtbot, make_window, monkeypatch):
    panel = make_window().settings_panel
    picker = panel.presets
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: ("My concise", True)))
    pick(picker, "Concise")
    qtbot.mouseClick(picker.save_button, Qt.LeftButton)
    assert saved_prompt_presets() == {"My concise": BUILTIN_PRESETS["Concise"]}
    assert picker.combo.currentText() == "My concise" and picker.delete_button.isEnabled()
    pick(picker, "Concise")
    assert not picker.delete_button.isEnabled()  # the built-in one stays
    pick(picker, "My concise")
    assert picker.combo.currentText() == "My concise" and picker.delete_button.isEnabled()
    qtbot.mouseClick(picker.delete_button, Qt.LeftButton)
    assert saved_prompt_presets() == {} and picker.combo.findText("My concise") == -1
    assert panel.system.toPlainText() == BUILTIN_PRESETS["Concise"]


def test_an_empty_prompt_is_refused_before_a_name_is_asked_for(qtbot, make_window, monkeypatch):
    panel = make_window().settings_panel
    asked = []
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(lambda *a, **k: asked.append(a) or ("x", True)))
    qtbot.mouseClick(panel.presets.save_button, Qt.LeftButton)
    assert asked == [] and panel.problem.text() == "Write a system prompt first, then save it as a preset"
