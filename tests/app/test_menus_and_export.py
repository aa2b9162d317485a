"""Menus as desktop apps have them, an About box with versions, exports that read right,
Undo that waits for the user, and a dashboard that collapses (issue 15)."""

from PySide6.QtWidgets import QFileDialog

from brisk.app.chat_files import close_open_fence, export_markdown


def test_menus_have_the_usual_entries_and_quit_is_ctrl_q(qtbot, make_window):
    w = make_window()
    titles = [a.text() for a in w.menuBar().actions()]
    assert titles == ["&File", "&Edit", "&View", "&Models", "&Help"]
    assert w.actions_by_text["Quit"].shortcut().toString() == "Ctrl+Q"
    w.actions_by_text["Quit"].trigger()
    assert not w.isVisible()


def test_about_box_names_the_versions(qtbot, make_window):
    import mlx.core as mx
    from PySide6.QtCore import qVersion

    w = make_window()
    w.actions_by_text["About Brisk"].trigger()
    text = w.about_box.text()
    assert text.startswith("Brisk 0.") and mx.__version__ in text and qVersion() in text and "BLAS" in text


def test_dashboard_collapses_and_comes_back(qtbot, make_window):
    w = make_window()
    action = w.actions_by_text["Show dashboard"]
    action.trigger()
    assert not w.tabs.isVisible() and not action.isChecked()
    action.trigger()
    assert w.tabs.isVisible() and action.isChecked()


def test_markdown_export_closes_a_truncated_code_fence(tmp_path, qtbot, make_window):
    assert close_open_fence("Here:\n```python\nprint(1)") == "Here:\n```python\nprint(1)\n```"
    assert close_open_fence("```\nx\n```\ndone") == "```\nx\n```\ndone"
    w = make_window()
    cid = w.controller.current
    w.store.add_message(cid, "user", "code please")
    w.store.add_message(cid, "assistant", "```python\ndef f():\n    return", finish_reason="length")
    w.store.add_message(cid, "user", "thanks")
    text = export_markdown(w.store, cid)
    assert "    return\n```\n" in text and text.count("```") == 2


def test_export_suggests_the_documents_folder(qtbot, make_window, monkeypatch):
    from brisk.app.window import documents_folder

    seen = []
    monkeypatch.setattr(
        QFileDialog,
        "getSaveFileName",
        staticmethod(lambda parent, title, suggested, *a: seen.append(suggested) or ("", "")),
    )
    w = make_window()
    w.store.rename(w.controller.current, "Trip: Paris/Rome?")
    w.actions_by_text["Export as Markdown…"].trigger()
    assert seen == [f"{documents_folder()}/Trip_ Paris_Rome_.md"]


def test_undo_stays_until_the_next_action(qtbot, make_window):
    w = make_window()
    first = w.controller.current
    w.controller.new_conversation()
    w.delete_with_undo(first)
    qtbot.wait(50)
    assert w.undo_button.isVisibleTo(w)
    w.controller.new_conversation()
    w.sidebar.new_requested.emit()
    assert not w.undo_button.isVisibleTo(w)


def test_chat_titles_are_unique_and_elide_without_a_scrollbar(qtbot, make_window, engine):
    from PySide6.QtCore import Qt

    from brisk.engine.api.events import TurnFinished
    from brisk.engine.api.metrics import TurnMetrics
    from brisk.engine.host.worker import ConversationEvent

    w = make_window()
    for _ in range(3):
        w.controller.new_conversation()
        w.composer.edit.setPlainText("What is the capital of France?")
        w.composer.send_button.click()
        done = TurnFinished("Paris.", [1], TurnMetrics(finish_reason="stop"))
        engine.play(ConversationEvent(w.controller.current, done))
    titles = w.sidebar.titles()
    assert sorted(titles[:3]) == [
        "What is the capital of France?",
        "What is the capital of France? (2)",
        "What is the capital of France? (3)",
    ]
    assert w.sidebar.list.horizontalScrollBarPolicy() == Qt.ScrollBarAlwaysOff
    assert w.sidebar.list.textElideMode() == Qt.ElideRight
