"""Render resources/icons/brisk.svg into a macOS iconset folder (the ten PNG sizes that
`iconutil -c icns` turns into Brisk.icns), with Qt's SVG renderer so it runs anywhere.

    python packaging/make_iconset.py OUT/Brisk.iconset
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (points, scale): iconutil's names are icon_<pt>x<pt>[@2x].png
SIZES = [(16, 1), (16, 2), (32, 1), (32, 2), (128, 1), (128, 2), (256, 1), (256, 2), (512, 1), (512, 2)]


def icon_name(points: int, scale: int) -> str:
    return f"icon_{points}x{points}{'@2x' if scale == 2 else ''}.png"


def render(svg: Path, out: Path) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 (Qt needs one to paint)
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg} is not a valid SVG")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for points, scale in SIZES:
        pixels = points * scale
        image = QImage(pixels, pixels, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        path = out / icon_name(points, scale)
        if not image.save(str(path)):
            raise SystemExit(f"could not write {path}")
        written.append(path)
    return written


if __name__ == "__main__":
    render(ROOT / "resources" / "icons" / "brisk.svg", Path(sys.argv[1]))
