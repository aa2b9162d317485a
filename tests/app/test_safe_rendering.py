"""Hostile message text must not make the app read files, follow links or lay out megabytes
(issue 54, items 3 and 5). Each input reaches the app the way it would for real: a stored
row opened at startup, an imported chat, a chip, a streamed answer."""

import json
import os
import subprocess
import sys

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QColor, QImage, QTextCursor

from brisk.app.widgets.chat_view import DISPLAY_CHARS, EDITABLE_CHARS, ChatView
from brisk.app.widgets.full_text import LINE_CHARS, PART_CHARS, FullTextView
from brisk.app.widgets.safe_text import is_openable_link
from brisk.engine.turn.documents import attached_block

# Taller than any line of text: a bubble or label this tall has read the image.
IMAGE_HEIGHT = 400


@pytest.fixture
def picture(tmp_path):
    """A real image on disk: Qt's old rendering opened it and made the bubble its height."""
    image = QImage(300, IMAGE_HEIGHT, QImage.Format_RGB32)
    image.fill(QColor("red"))
    path = tmp_path / "picture.png"
    assert image.save(str(path))
    return path


def stored_chat(make_window, db_path, *contents, role="assistant"):
    """A chat whose rows hold `contents`, opened the way startup opens the newest chat."""
    from brisk.app.store import Store

    store = Store(db_path)
    cid = store.create_conversation("Hostile", {})
    for content in contents:
        store.add_message(cid, role, content)
    store.close()
    window = make_window()
    assert window.controller.current == cid
    return window


def body_height(bubble) -> float:
    return bubble.body.document().size().height()


def test_a_markdown_image_in_a_stored_row_is_never_read(qtbot, make_window, db_path, picture):
    window = stored_chat(make_window, db_path, f"before ![x]({picture}) after", "![zero](/dev/zero)")
    first, zero = window.chat_view.messages
    assert body_height(first) < IMAGE_HEIGHT / 4  # the placeholder, not the picture
    assert str(picture) in first.body.document().refused
    assert "before" in first.body.toPlainText() and "after" in first.body.toPlainText()
    # /dev/zero never ends: reading it grew the app to 5 GB. It was asked for, and refused.
    assert "/dev/zero" in zero.body.document().refused
    assert body_height(zero) < IMAGE_HEIGHT / 4


def test_raw_html_in_a_message_stays_text(qtbot, make_window, db_path, picture):
    hostile = f'<img src="{picture}"> <link rel="stylesheet" href="{picture}"> <b>bold?</b>'
    window = stored_chat(make_window, db_path, hostile, role="user")
    bubble = window.chat_view.messages[0]
    # the typed markup wraps to a few lines in an 800-wide window (the offscreen screen), far below the picture
    assert body_height(bubble) < IMAGE_HEIGHT / 2
    assert f'<img src="{picture}">' in bubble.body.toPlainText()  # shown as typed
    assert "<b>bold?</b>" in bubble.body.toPlainText()


# Serves every open of the FIFO from another process (a thread would need the GIL, which the
# GUI thread holds while Qt blocks in a read): logs each open, writes a little, closes.
FIFO_WRITER = """
import os, sys
fifo, log, done = sys.argv[1:]
while True:
    fd = os.open(fifo, os.O_WRONLY)  # returns once a reader opens the FIFO
    if os.path.exists(done):  # the test's own reader, releasing this process
        os.close(fd)
        break
    with open(log, "a") as f:
        f.write("opened\\n")
    os.write(fd, b"not an image")
    os.close(fd)
"""


def test_an_image_on_a_fifo_is_never_opened(qtbot, make_window, db_path, tmp_path):
    """Opening a FIFO to read blocks until someone writes: it hung the app. Here a writer
    serves every open, so an open by the app is logged instead of hanging the test."""
    fifo, log, done = tmp_path / "pipe.png", tmp_path / "opens.log", tmp_path / "done"
    os.mkfifo(fifo)
    log.touch()
    writer = subprocess.Popen([sys.executable, "-c", FIFO_WRITER, str(fifo), str(log), str(done)])
    window = stored_chat(make_window, db_path, f"![pipe]({fifo})", f'<img src="{fifo}">')
    window.chat_view.messages[-1].body.viewport().repaint()
    opens_by_the_app = log.read_text()  # a reader that opened it has read to EOF by now
    refused = getattr(window.chat_view.messages[0].body.document(), "refused", [])
    window.chat_view.clear()  # nothing left to paint: a failed image was opened at every paint
    done.touch()
    release = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer.wait()
    os.close(release)
    assert opens_by_the_app == ""
    assert str(fifo) in refused


def click_anchor(qtbot, body, text):
    """A left click on the first occurrence of `text` in the bubble, as a user would."""
    from PySide6.QtCore import Qt

    cursor = body.document().find(text)
    assert not cursor.isNull()
    cursor.setPosition(cursor.selectionStart() + 1, QTextCursor.MoveAnchor)
    qtbot.mouseClick(body.viewport(), Qt.LeftButton, pos=body.cursorRect(cursor).center())


class Opened:
    """Stands in for QDesktopServices: records the urls the app asks the desktop to open."""

    urls: list = []

    @classmethod
    def openUrl(cls, url):
        cls.urls.append(url.toString())
        return True


def test_a_file_link_opens_nothing_and_its_file_never_shows(qtbot, make_window, db_path, tmp_path, monkeypatch):
    monkeypatch.setattr("brisk.app.widgets.safe_text.QDesktopServices", Opened)
    monkeypatch.setattr(Opened, "urls", [])
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:THE SECRET\n")
    window = stored_chat(
        make_window,
        db_path,
        f"[passwd]({QUrl.fromLocalFile(str(secret)).toString()}) and [web](https://example.com/page)",
    )
    body = window.chat_view.messages[0].body
    click_anchor(qtbot, body, "passwd")
    assert "THE SECRET" not in body.toPlainText()
    assert "passwd and web" in body.toPlainText()  # the bubble still shows the message
    assert Opened.urls == []
    click_anchor(qtbot, body, "web")
    assert Opened.urls == ["https://example.com/page"]
    assert "passwd and web" in body.toPlainText()


@pytest.mark.parametrize(
    ("url", "opens"),
    [
        ("https://example.com/x", True),
        ("http://example.com", True),
        ("HTTPS://EXAMPLE.COM", True),
        ("file:///etc/passwd", False),
        ("/etc/passwd", False),
        ("secret.txt", False),
        ("qrc:/icons/app.svg", False),
        ("data:text/html,<b>x</b>", False),
        ("javascript:alert(1)", False),
        ("https:///etc/passwd", False),  # no host
    ],
)
def test_only_web_links_leave_the_app(url, opens):
    assert is_openable_link(QUrl(url)) is opens


def test_a_chip_named_with_html_shows_the_name(qtbot, make_window, db_path, picture):
    name = f'<img src="{picture}">'
    window = stored_chat(make_window, db_path, attached_block(name, "the document") + "\n\nRead it", role="user")
    chip = window.chat_view.messages[0].chips[0]
    assert chip.label.text().startswith(name)
    assert chip.label.sizeHint().height() < IMAGE_HEIGHT / 4
    composer_chip = window.composer.add_attachment(name, 12, False, f"{name} does not fit")
    assert composer_chip.label.text().replace("\u200b", "").startswith(name)  # (a long word may wrap)
    assert composer_chip.label.sizeHint().height() < IMAGE_HEIGHT / 4
    tooltip = composer_chip.label.toolTip()
    assert "<img" not in tooltip and "&lt;img" in tooltip  # shown as typed, not as an image
    window.composer.show_message(f"Cannot attach {name}: not a document", error=True)
    assert window.composer.message.sizeHint().height() < IMAGE_HEIGHT / 4


def test_labels_quoting_a_model_or_an_error_stay_text(qtbot, make_window, picture):
    hostile = f'<img src="{picture}">'
    window = make_window()
    window.dashboard.set_chat_models(hostile, None)
    window.dashboard.set_model_state(f"Cannot load {hostile}")
    for label in (window.dashboard.chat_model, window.dashboard.model_state):
        assert hostile in label.text() and label.sizeHint().height() < IMAGE_HEIGHT / 4


def test_an_imported_chat_renders_safely(qtbot, make_window, tmp_path, picture):
    export = tmp_path / "hostile.json"
    export.write_text(
        json.dumps(
            {
                "format": "brisk-chat",
                "title": "Imported",
                "messages": [
                    {"role": "user", "content": f"![x]({picture}) <img src='{picture}'>"},
                    {"role": "assistant", "content": "[x](file:///etc/passwd)"},
                ],
            }
        )
    )
    window = make_window()
    window.import_json(str(export))
    first, second = window.chat_view.messages
    assert body_height(first) < IMAGE_HEIGHT / 4
    assert second.body.toPlainText().strip() == "x"


def fifty_megabytes(line: str) -> str:
    size = 50 * 2**20
    return (line * (size // len(line) + 1))[:size]


@pytest.mark.parametrize("line", ["Lorem ipsum dolor sit amet, **bold** `code`.\n", "one endless line "])
def test_a_fifty_megabyte_message_opens_cut_and_shows_all_on_demand(qtbot, make_window, db_path, line):
    text = fifty_megabytes(line)
    window = stored_chat(make_window, db_path, "A short question", text)
    bubble = window.chat_view.messages[-1]
    # The work at startup is bounded: the bubble holds (and lays out) only the first part.
    assert bubble.body.document().characterCount() <= DISPLAY_CHARS + 2
    assert bubble.body.toPlainText().startswith(text[:1000])
    assert bubble.show_all_button.isVisibleTo(window)
    assert f"{len(text):,} characters" in bubble.show_all_button.text()
    assert bubble.text == text  # Copy and Edit work on the whole message
    assert window.store.messages(window.controller.current)[-1].content == text

    bubble.show_all_button.click()
    full = bubble.full_view
    assert full is not None and not bubble.body.isVisibleTo(window)
    assert full.parts == -(-len(text) // PART_CHARS) and full.pager.isVisibleTo(window)
    shown = full.view.toPlainText()  # a click lays out one part, never the whole
    assert full.view.document().characterCount() <= PART_CHARS + PART_CHARS // LINE_CHARS + 1
    full.next.click()
    shown += full.view.toPlainText()
    full.show_part(full.parts - 1)
    assert not full.next.isEnabled()
    last = full.view.toPlainText()
    if "\n" in line:  # short lines: shown exactly as stored
        assert shown == text[: 2 * PART_CHARS] and text.endswith(last)
    else:  # one line: cut into lines the view lays out one at a time
        assert max(len(shown_line) for shown_line in last.split("\n")) == LINE_CHARS
        assert shown.replace("\n", "") == text[: 2 * PART_CHARS] and text.endswith(last.replace("\n", ""))
    full.previous.click()
    assert full.part == full.parts - 2
    bubble.show_all_button.click()
    assert bubble.full_view is None and bubble.body.isVisibleTo(window)


def test_a_huge_user_message_with_a_huge_document_opens_without_laying_either_out(qtbot, make_window, db_path):
    document = "a line of it\n" * (2 * PART_CHARS // 13 + 1)  # more than two parts
    typed = "x" * (EDITABLE_CHARS + 1)
    window = stored_chat(make_window, db_path, attached_block("huge.txt", document) + "\n\n" + typed, role="user")
    bubble = window.chat_view.messages[0]
    assert bubble.text == typed and bubble.body.document().characterCount() <= DISPLAY_CHARS + 2
    assert not bubble.edit_button.isEnabled()  # an editor would lay the whole text out
    assert f"{len(typed):,} characters" in bubble.edit_button.toolTip()
    chip = bubble.chips[0]
    assert chip.label.text().endswith(f"{len(document):,} characters")  # not split into words
    chip.preview()
    full = chip.dialog.findChild(FullTextView)
    assert full.parts == 3 and full.view.toPlainText() == document[:PART_CHARS]
    full.show_part(2)
    assert document.endswith(full.view.toPlainText())


def test_the_full_view_walks_through_every_part(qtbot):
    lines = "short line\n" * ((2 * PART_CHARS + 100) // 11 + 1)  # into the third part
    long_line = "x" * (3 * LINE_CHARS + 5)
    text = lines + long_line
    view = FullTextView(text)
    qtbot.addWidget(view)
    seen = [view.view.toPlainText()]
    while view.next.isEnabled():
        view.next.click()
        seen.append(view.view.toPlainText())
    assert len(seen) == view.parts == 3
    assert "".join(seen[:2]) == text[: 2 * PART_CHARS]  # parts follow on exactly
    assert seen[2] == text[2 * PART_CHARS : len(lines)] + "\n".join(["x" * LINE_CHARS] * 3 + ["xxxxx"])
    view.previous.click()
    assert view.view.toPlainText() == seen[1] and view.previous.isEnabled()


def test_a_streamed_answer_past_the_limit_stays_cut(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    piece = "word " * 2000  # 10,000 characters
    for i in range(8):
        view.append_to_last(piece, source="draft" if i % 2 else "")
        view.flush()
    bubble = view.messages[-1]
    assert len(bubble.text) == 80_000
    assert bubble.body.document().characterCount() <= DISPLAY_CHARS + 2
    view.set_tint_draft(True)  # the tinted rendering is cut the same way
    assert bubble.body.document().characterCount() <= DISPLAY_CHARS + 2
    assert "background-color" in bubble.body.toHtml()
    full = bubble.show_all()
    assert not full.pager.isVisibleTo(view)  # one part holds it all
    assert full.view.toPlainText().replace("\n", "") == bubble.text  # one line, cut for display
    view.append_to_last("the end")  # a streaming answer grows under an open view
    view.flush()
    assert full.view.toPlainText().endswith("the end")


def test_editing_a_cut_message_and_cancelling_brings_show_all_back(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    bubble = view.add_message("user", "y" * (DISPLAY_CHARS + 10))
    bubble.show_all()
    bubble.start_editing()
    assert bubble.full_view is None and not bubble.show_all_button.isVisibleTo(view)
    assert bubble.editor.toPlainText() == bubble.text  # the whole message, not the cut one
    bubble.stop_editing()
    assert bubble.show_all_button.isVisibleTo(view)
    assert bubble.show_all_button.text() == f"Show all ({DISPLAY_CHARS + 10:,} characters)"
    assert bubble.body.isVisibleTo(view) and bubble.body.document().characterCount() <= DISPLAY_CHARS + 2


def test_a_stored_coverage_map_quotes_its_values_as_text(qtbot):
    from brisk.app.widgets.coverage import coverage_tooltip

    hostile = '<img src="/dev/zero">'
    tooltip = coverage_tooltip(
        {"read_share": 0.5, "new_tokens": 10, "layers": [[3, [[0, 5]]], [hostile, []]], "skipped": [[5, 9, hostile]]}
    )
    assert "<img" not in tooltip and tooltip.count("&lt;img") == 3


def test_the_database_recovery_note_shows_its_path_as_typed(make_window, tmp_path):
    """The note quotes the database's file name: a name that looks like markup is shown as text."""
    from PySide6.QtCore import Qt

    path = tmp_path / "<img src=x.png><b>chats.db"  # (a name cannot hold the slash of a closing tag)
    path.write_bytes(b"not a database at all" * 100)
    window = make_window(path)
    assert window.recovery_box.textFormat() == Qt.PlainText
    assert "<img src=x.png><b>chats" in window.recovery_box.text()
    assert window.api_status.textFormat() == Qt.PlainText


def test_a_table_too_big_to_lay_out_is_shown_as_text(qtbot):
    """An 8,000-row Markdown table (under the display cap) froze the window ~10 s, then ~5 s
    at every resize: Qt lays out each cell. Counted in cells made, not seconds."""
    from brisk.app.widgets.chat_view import MARKDOWN_TABLE_BORDERS, MessageWidget

    rows = "\n".join(f"| {i} | x |" for i in range(MARKDOWN_TABLE_BORDERS // 3 + 10))
    big = MessageWidget(0, "assistant", "| a | b |\n|---|---|\n" + rows)
    qtbot.addWidget(big)
    assert big.body.document().toPlainText().startswith("| a | b |")  # as typed
    assert not big.body.document().rootFrame().childFrames()  # no table made
    small = MessageWidget(1, "assistant", "| a | b |\n|---|---|\n| 1 | 2 |")
    qtbot.addWidget(small)
    frames = small.body.document().rootFrame().childFrames()
    assert frames and type(frames[0]).__name__ == "QTextTable"  # a real table below the limit
