"""An attached document's chip reads from the left: its name beside the document icon, not
floated to the middle of the composer with the spare width split around it (a real X server
trial, 2026-11-27)."""

from PySide6.QtWidgets import QLabel


def test_the_chip_name_sits_next_to_its_icon(qtbot, make_window):
    w = make_window()
    w.resize(1200, 700)
    chip = w.composer.add_attachment("medium.txt", 2668, True)
    qtbot.waitUntil(lambda: chip.isVisible() and chip.label.width() < chip.width() - 20)
    (glyph,) = [label for label in chip.findChildren(QLabel) if label is not chip.label]
    icon = glyph.pixmap().width()
    assert icon == 16 and glyph.width() <= 2 * icon  # the icon's box is about the icon
    assert chip.label.geometry().left() <= icon + 2 * chip.layout().spacing() + 4
