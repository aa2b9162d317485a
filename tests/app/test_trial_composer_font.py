"""The message box keeps room for three lines at every chat font size: at the largest
(Ctrl+= pressed 30 times) its fixed 84 px showed under two (a real X server trial, 2026-11-27)."""

from PySide6.QtCore import Qt

from brisk.app.widgets.composer import COMPOSER_LINES


def test_message_box_grows_with_the_chat_font_and_shrinks_back(qtbot, make_window):
    w = make_window()
    w.activateWindow()
    qtbot.waitUntil(w.isActiveWindow)
    edit = w.composer.edit
    small = edit.height()
    for _ in range(30):
        qtbot.keyClick(edit, Qt.Key_Equal, Qt.ControlModifier)
    assert w.chat_font_px == 32
    assert edit.viewport().height() >= COMPOSER_LINES * edit.fontMetrics().lineSpacing()
    qtbot.keyClick(edit, Qt.Key_0, Qt.ControlModifier)
    assert edit.height() == small
    assert edit.viewport().height() >= COMPOSER_LINES * edit.fontMetrics().lineSpacing()
