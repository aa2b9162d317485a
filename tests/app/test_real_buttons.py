"""Every dialog-opening button and menu entry, clicked or triggered as a user does (not by
calling its slot): Qt passes clicked(bool) / triggered(bool) on, and a slot that took it as
its first argument did nothing ("Import JSON…", Ctrl+I) or failed ("No bundled model 'False'")."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog

from brisk.engine.host.model_commands import ImportGGUF, InstallBundled


@pytest.fixture
def pickers(monkeypatch):
    """Record each file picker and input dialog the app opens, answering as the user would."""
    opened = []

    def file_picker(parent, title, *args, **kwargs):
        opened.append(("file", title))
        return ("/tmp/model.gguf", "GGUF (*.gguf)") if "GGUF" in title else ("", "")

    def get_item(parent, title, label, items, *args, **kwargs):
        opened.append(("item", title, list(items)))
        return items[0], True

    def get_text(parent, title, label, *args, **kwargs):
        opened.append(("text", title))
        return "my-model", True

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(file_picker))
    monkeypatch.setattr(QInputDialog, "getItem", staticmethod(get_item))
    monkeypatch.setattr(QInputDialog, "getText", staticmethod(get_text))
    return opened


def test_install_bundled_button_lists_the_models_and_installs_the_choice(qtbot, make_window, engine, pickers):
    manager = make_window().show_models()
    qtbot.mouseClick(manager.bundled_button, Qt.LeftButton)
    assert not pickers  # the models are listed with their details in the manager, not a bare-id picker
    chosen = manager.results.item(0, 0).text()
    manager.results.selectRow(0)
    qtbot.mouseClick(manager.install_button, Qt.LeftButton)
    assert engine.commands[-1] == InstallBundled(chosen) and chosen != "False"


def test_import_gguf_button_opens_the_file_picker_then_asks_for_an_id(qtbot, make_window, engine, pickers):
    manager = make_window().show_models()
    qtbot.mouseClick(manager.import_button, Qt.LeftButton)
    assert [p[:2] for p in pickers] == [("file", "Import a GGUF model"), ("text", "Import GGUF")]
    assert engine.commands[-1] == ImportGGUF("/tmp/model.gguf", "my-model")


def test_import_json_menu_entry_and_ctrl_i_open_the_file_picker(qtbot, make_window, pickers):
    window = make_window()
    action = window.actions_by_text["Import chat (JSON)…"]
    action.trigger()
    assert pickers == [("file", "Import chat")]
    assert action.shortcut().toString() == "Ctrl+I"  # the key the offscreen platform cannot route
