"""SVG icons from resources/icons, by name."""

from __future__ import annotations

from PySide6.QtGui import QIcon

import brisk.resources as resources


def icon(name: str) -> QIcon:
    path = resources.path("icons", f"{name}.svg")
    return QIcon(str(path)) if path.is_file() else QIcon()
