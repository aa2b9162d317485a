"""The one-line refusal above the settings shortens the rows' view: the seed box being typed
in, at the bottom of that view, slid half below it as the line appeared (a real X server
trial, 2026-11-27, on a 1280x800 screen). The box being typed in stays in view."""

from PySide6.QtCore import QPoint

from brisk.app.widgets.settings_panel import SettingsPanel


def test_the_seed_box_stays_in_view_when_its_refusal_appears(qtbot):
    panel = SettingsPanel()
    qtbot.addWidget(panel)
    panel.resize(420, 400)
    panel.show()
    qtbot.waitExposed(panel)
    panel.activateWindow()
    qtbot.waitUntil(panel.isActiveWindow)
    view, bar = panel.scroll.viewport(), panel.scroll.verticalScrollBar()
    inner = panel.scroll.widget()
    seed_bottom = panel.seed.mapTo(inner, QPoint(0, panel.seed.height())).y()
    bar.setValue(seed_bottom - view.height())  # the seed box at the bottom edge of the view
    panel.seed.setFocus()
    qtbot.waitUntil(panel.seed.hasFocus)

    def in_view():
        top = panel.seed.mapTo(view, QPoint(0, 0)).y()
        return top >= 0 and top + panel.seed.height() <= view.height()

    assert in_view()
    qtbot.keyClicks(panel.seed, "x")
    assert panel.problem.isVisibleTo(panel)
    qtbot.waitUntil(in_view, timeout=2000)
