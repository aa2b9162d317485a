"""A sent document is a chip in the bubble; Regenerate keeps earlier answers to page
through; Edit opens in the bubble. All through the real buttons."""

import sqlite3

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QPlainTextEdit

from brisk.app.store import Store
from brisk.app.store_opening import MIGRATIONS
from brisk.app.widgets.chat_view import DocumentChip
from brisk.engine.host.worker import Answer, DocumentChecked
from brisk.engine.turn.documents import Document, Fit
from tests.app.test_window import answer, send

REPORT = "Water use rose 12% in the north.\n\n```\nnot code, just a fence in the text\n```\nThe vote is on 14 March."


def attach(w, engine, cid, text=REPORT):
    engine.play(DocumentChecked(cid, Document("report.md", "markdown", text, len(text)), Fit(37, 60, 8192, 0, 0, True)))


def test_a_pdfs_chip_gives_its_pages(qtbot, make_window, engine):
    w = make_window()
    cid = w.controller.current
    engine.play(
        DocumentChecked(
            cid, Document("minutes.pdf", "pdf", "Minutes of the vote.", 900, pages=12), Fit(6, 20, 8192, 0, 0, True)
        )
    )
    send(qtbot, w, "Summarize")
    chip = w.chat_view.messages[0].findChild(DocumentChip)
    assert chip.label.text() == "minutes.pdf · pdf · 12 pages · 6 tokens · 4 words"
    w.controller.open(cid)
    assert "12 pages" in w.chat_view.messages[0].findChild(DocumentChip).label.text()


def test_a_sent_document_is_a_chip_that_opens_to_its_text(qtbot, make_window, engine):
    w = make_window()
    cid = w.controller.current
    attach(w, engine, cid)
    command = send(qtbot, w, "When is the vote?")
    assert REPORT in command.messages[-1].content  # the model still gets the whole text
    bubble = w.chat_view.messages[0]
    assert bubble.text == "When is the vote?" and "Attached document" not in bubble.body.toPlainText()
    assert not bubble.copy_code_button.isVisibleTo(bubble)  # the user's own words hold no code
    chip = bubble.findChild(DocumentChip)
    assert chip.label.text() == "report.md · markdown · 37 tokens · 23 words"
    qtbot.mouseClick(chip.preview_button, Qt.LeftButton)
    assert isinstance(chip.dialog, QDialog) and chip.dialog.isVisible()
    assert chip.dialog.findChild(QPlainTextEdit).toPlainText() == REPORT
    w.controller.open(cid)  # reopened from the store: the chip keeps its facts
    assert w.chat_view.messages[0].findChild(DocumentChip).label.text().startswith("report.md · markdown · 37 tokens")


def test_regenerate_keeps_earlier_answers_to_page_through_and_the_chat_goes_on_from_the_shown_one(
    qtbot, make_window, engine, db_path
):
    w = make_window()
    cid = send(qtbot, w, "Name a colour").conversation_id
    answer(engine, cid, ["Red"])
    for colour in ("Blue", "Green"):
        qtbot.mouseClick(w.chat_view.messages[-1].regenerate_button, Qt.LeftButton)
        answer(engine, cid, [colour])
    last = w.chat_view.messages[-1]
    assert last.version_label.isVisibleTo(last) and last.version_label.text() == "3/3"
    assert last.older.isEnabled() and not last.newer.isEnabled()
    qtbot.mouseClick(last.older, Qt.LeftButton)
    qtbot.mouseClick(w.chat_view.messages[-1].older, Qt.LeftButton)
    last = w.chat_view.messages[-1]
    assert last.text == "Red" and last.version_label.text() == "1/3" and not last.older.isEnabled()
    command = send(qtbot, w, "Another?")
    assert [m.content for m in command.messages] == ["Name a colour", "Red", "Another?"]
    w.store.close()
    reopened = Store(db_path)
    assert reopened.versions(cid, 1) == (0, 3)
    assert sorted(reopened.db.execute("SELECT content FROM answer_versions").fetchall()) == [("Blue",), ("Green",)]
    reopened.close()


def test_edit_opens_in_the_bubble_and_keeps_the_documents(qtbot, make_window, engine):
    w = make_window()
    cid = w.controller.current
    attach(w, engine, cid)
    first = send(qtbot, w, "When is the vote?")
    answer(engine, first.conversation_id, ["14 March."])
    bubble = w.chat_view.messages[0]
    qtbot.mouseClick(bubble.edit_button, Qt.LeftButton)
    editor = bubble.editor
    assert editor is not None and editor.toPlainText() == "When is the vote?" and not bubble.body.isVisibleTo(bubble)
    assert editor.lineWrapMode() == QPlainTextEdit.WidgetWidth
    editor.setPlainText("Who votes?")
    qtbot.mouseClick(bubble.save_button, Qt.LeftButton)
    command = engine.commands[-1]
    assert isinstance(command, Answer) and len(command.messages) == 1
    assert REPORT in command.messages[0].content and command.messages[0].content.endswith("Who votes?")
    assert w.chat_view.messages[0].text == "Who votes?" and w.chat_view.messages[0].findChild(DocumentChip)


def test_a_database_from_before_answer_versions_is_migrated_and_keeps_its_chats(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[1])
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('Old chat', 0, 0)")
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, created) VALUES (1, 0, 'user', 'Hi', 0)"
    )
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, created) VALUES (1, 1, 'assistant',"
        " 'Hello', 1)"
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = Store(path)
    assert [m.content for m in store.messages(1)] == ["Hi", "Hello"]
    store.add_attachment(1, "r.pdf", "pdf", 40, "text", pages=3)  # the column schema 2 added
    assert store.attachments(1)[0]["pages"] == 3
    store.regenerate_at(1, 1)
    assert store.versions(1, 1) == (1, 2)
    store.close()


def test_an_edit_sent_while_an_answer_runs_keeps_the_edited_words(qtbot, make_window, engine):
    w = make_window()
    first = send(qtbot, w, "First question")
    answer(engine, first.conversation_id, ["First answer."])
    send(qtbot, w, "Second question")  # its answer is still running
    bubble = w.chat_view.messages[0]
    qtbot.mouseClick(bubble.edit_button, Qt.LeftButton)
    bubble.editor.setPlainText("A better first question")
    notices = []
    w.controller.notice.connect(notices.append)
    commands = len(engine.commands)
    qtbot.mouseClick(bubble.save_button, Qt.LeftButton)
    assert len(engine.commands) == commands and "still answering" in notices[-1]
    assert bubble.editor is not None and bubble.editor.toPlainText() == "A better first question"
