"""Dark mode: chosen from View > Theme, kept across launches, and drawn without the
black boxes, invisible controls and error-coloured notices it had."""

import pytest
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from brisk.app.theme import apply_theme, saved_theme
from brisk.app.widgets.chat_view import MessageWidget


@pytest.fixture
def light_after():
    yield
    apply_theme(QApplication.instance(), "light")


def test_the_view_menu_switches_to_dark_and_remembers_it(qtbot, make_window, light_after):
    w = make_window()
    assert w.theme_actions["system"].isChecked()  # a first launch follows the system
    w.theme_actions["dark"].trigger()
    app = QApplication.instance()
    assert app.palette().color(QPalette.Window).lightness() < 60
    assert app.palette().color(QPalette.Text).lightness() > 200
    assert saved_theme() == "dark" and w.theme_actions["dark"].isChecked()
    w.theme_actions["light"].trigger()
    assert app.palette().color(QPalette.Window).lightness() > 200 and saved_theme() == "light"


def test_in_dark_mode_labels_in_a_bubble_have_no_box_of_their_own(qtbot, light_after):
    apply_theme(QApplication.instance(), "dark")
    bubble = MessageWidget(0, "user", "Hello")
    qtbot.addWidget(bubble)
    bubble.resize(500, 120)
    bubble.show()
    qtbot.waitExposed(bubble)
    image = bubble.grab().toImage()
    corner = bubble.title.geometry().topLeft()  # inside the "You" label, where no glyph is drawn
    assert QColor(image.pixel(corner.x() + 1, corner.y() + 1)).name() == "#1c2d41"  # the bubble's own colour


def test_dark_mode_draws_disabled_fields_dimmed(light_after):
    apply_theme(QApplication.instance(), "dark")
    palette = QApplication.instance().palette()
    enabled, disabled = palette.color(QPalette.Active, QPalette.Text), palette.color(QPalette.Disabled, QPalette.Text)
    assert enabled.lightness() - disabled.lightness() > 80


def test_a_notice_is_not_drawn_as_an_error(qtbot, make_window, engine, tmp_path):
    w = make_window()
    document = tmp_path / "notes.txt"
    document.write_text("Some notes.")
    w.controller.attach(str(document))
    assert w.composer.message.text() == "Reading the document…" and w.composer.message.property("error") is False
    w.composer.show_message("That file is binary", error=True)
    assert w.composer.message.property("error") is True


def test_every_url_in_either_stylesheet_names_a_file_that_exists(light_after):
    import re
    from pathlib import Path

    for choice in ("dark", "light"):
        apply_theme(QApplication.instance(), choice)
        urls = re.findall(r"url\(([^)]*)\)", QApplication.instance().styleSheet())
        assert all(Path(url).is_file() for url in urls), urls
        if choice == "dark":
            assert urls  # the check box's tick


@pytest.mark.parametrize("theme, track, handle", [("dark", "#0d1117", "#484f58"), ("light", "#eaeef2", "#afb8c1")])
def test_a_long_code_lines_scrollbar_in_a_bubble_is_drawn_in_the_themes_colours(
    qtbot, light_after, theme, track, handle
):
    """It was a black bar (Fusion's scrollbar on the bubble's transparent text browser)."""
    apply_theme(QApplication.instance(), theme)
    code = "```python\nx = compute(" + ", ".join(f"argument_{i}" for i in range(40)) + ")\n```"
    bubble = MessageWidget(0, "assistant", code)
    qtbot.addWidget(bubble)
    bubble.resize(500, 160)
    bubble.show()
    qtbot.waitExposed(bubble)
    bar = bubble.body.horizontalScrollBar()
    qtbot.waitUntil(bar.isVisible)
    image = bar.grab().toImage()
    row = [QColor(image.pixel(x, bar.height() // 2)) for x in range(6, bar.width() - 6)]
    ends = [QColor(track).getRgb()[:3], QColor(handle).getRgb()[:3]]
    box = [(min(a, b), max(a, b)) for a, b in zip(*ends)]  # the track, the handle and blends of the two
    assert track in {c.name() for c in row}
    assert all(lo <= v <= hi for c in row for v, (lo, hi) in zip(c.getRgb()[:3], box)), {c.name() for c in row}
