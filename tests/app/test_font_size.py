"""The chat's text size: Ctrl+= / Ctrl+- / Ctrl+0 in the real window, applied to the answers,
the questions and the message box, and kept across launches (issue 58)."""

from PySide6.QtCore import Qt

from brisk.app.theme import CHAT_FONT_RANGE, DEFAULT_CHAT_FONT_PX
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import ConversationEvent

LONG_ANSWER = " ".join(["The Vistula flows north through Kraków and Warsaw to the Baltic."] * 12)


def chatted(qtbot, w, engine):
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)  # window shortcuts need the active window
    w.composer.edit.setPlainText("Tell me about the Vistula")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    cid = w.controller.current
    engine.play(ConversationEvent(cid, TurnFinished(LONG_ANSWER, [1], TurnMetrics(finish_reason="stop"))))
    w.chat_view.flush()
    qtbot.wait(20)


def sizes(w) -> list[int]:
    """The pixel size of the chat's text boxes: each bubble's body and the message box."""
    return [m.body.font().pixelSize() for m in w.chat_view.messages] + [w.composer.edit.font().pixelSize()]


def test_ctrl_plus_and_minus_resize_the_chat_text_and_ctrl_0_resets_it(qtbot, make_window, engine):
    w = make_window()
    chatted(qtbot, w, engine)
    assert sizes(w) == [DEFAULT_CHAT_FONT_PX] * 3
    answer = w.chat_view.messages[-1]
    height = answer.body.height()
    for _ in range(3):
        qtbot.keyClick(w.composer.edit, Qt.Key_Equal, Qt.ControlModifier)
    qtbot.wait(20)
    assert sizes(w) == [DEFAULT_CHAT_FONT_PX + 3] * 3
    assert answer.body.height() > height  # the bubble grew to hold the bigger text
    qtbot.keyClick(w.composer.edit, Qt.Key_Minus, Qt.ControlModifier)
    assert sizes(w) == [DEFAULT_CHAT_FONT_PX + 2] * 3
    assert w.composer.edit.toPlainText() == ""  # the keys typed nothing
    qtbot.keyClick(w.composer.edit, Qt.Key_0, Qt.ControlModifier)
    assert sizes(w) == [DEFAULT_CHAT_FONT_PX] * 3


def test_the_size_stays_within_its_range(qtbot, make_window, engine):
    w = make_window()
    chatted(qtbot, w, engine)
    for _ in range(40):
        qtbot.keyClick(w.composer.edit, Qt.Key_Minus, Qt.ControlModifier)
    assert sizes(w) == [CHAT_FONT_RANGE[0]] * 3
    for _ in range(40):
        qtbot.keyClick(w.composer.edit, Qt.Key_Equal, Qt.ControlModifier)
    assert sizes(w) == [CHAT_FONT_RANGE[1]] * 3


def test_the_size_is_kept_across_launches_and_applies_to_chats_opened_later(qtbot, make_window, engine, tmp_path):
    w = make_window()
    chatted(qtbot, w, engine)
    for _ in range(4):
        qtbot.keyClick(w.composer.edit, Qt.Key_Equal, Qt.ControlModifier)
    w.close()
    again = make_window(tmp_path / "again.db")
    chatted(qtbot, again, engine)  # bubbles made after the size was set
    assert sizes(again) == [DEFAULT_CHAT_FONT_PX + 4] * 3


def test_a_hand_edited_size_that_is_not_a_number_means_the_default(qtbot, make_window):
    from brisk.app.preferences import preferences

    settings = preferences()
    settings.setValue("chat_font_px", "huge")
    settings.sync()
    assert make_window().chat_font_px == DEFAULT_CHAT_FONT_PX
