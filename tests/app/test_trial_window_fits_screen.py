"""The window opens inside the screen it is on, title bar and status bar included: on a
1280x800 screen a 1280x800 client area put the status bar (and its Undo button) below
the screen's edge (a real X server trial, 2026-11-27)."""

from PySide6.QtGui import QGuiApplication


def test_window_opens_no_taller_than_the_screens_free_area_less_a_title_bar(make_window):
    w = make_window()
    free = (w.screen() or QGuiApplication.primaryScreen()).availableGeometry()
    assert free.height() <= 800  # the offscreen screen: no taller than the old fixed 1280x800 client area
    # room left for a window manager's title bar, so the status bar stays on screen
    assert w.height() <= free.height() - 24
    assert w.width() <= max(free.width(), w.minimumSizeHint().width())
    assert w.statusBar().isVisible()
