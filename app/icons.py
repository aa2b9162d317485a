"""SVG icons from resources/icons, by name."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QIcon

ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons"


def icon(name: str) -> QIcon:
    path = ICONS / f"{name}.svg"
    return QIcon(str(path)) if path.is_file() else QIcon()
