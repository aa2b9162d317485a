"""Small painted instruments: a ring gauge and a line chart of values over turns."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget


class RingGauge(QWidget):
    """Shares in [0, 1] as concentric arcs (outermost first), with a caption under the number."""

    def __init__(self, caption: str, parent=None):
        super().__init__(parent)
        self.caption, self.text = caption, "–"
        self.arcs: list[tuple[float, str | None]] = [(0.0, None)]  # (share, colour or None: by value)
        self.setMinimumSize(110, 110)

    @property
    def value(self) -> float:
        return self.arcs[0][0]

    def set_value(self, share: float, text: str) -> None:
        self.set_arcs([(share, None)], text)

    def set_arcs(self, arcs: list[tuple[float, str | None]], text: str, caption: str | None = None) -> None:
        self.arcs = [(max(0.0, min(1.0, share)), color) for share, color in arcs] or [(0.0, None)]
        self.text = text
        if caption is not None:
            self.caption = caption
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        side = min(self.width(), self.height()) - 12
        rect = QRectF((self.width() - side) / 2, 6, side, side)
        track = self.palette().mid().color()
        width = 9 if len(self.arcs) == 1 else 6
        for i, (share, color) in enumerate(self.arcs):
            ring = rect.adjusted(i * 9, i * 9, -i * 9, -i * 9)
            p.setPen(QPen(track, width, Qt.SolidLine, Qt.RoundCap))
            p.drawArc(ring, 225 * 16, -270 * 16)
            shade = QColor(color) if color else QColor("#3fb950") if share >= 0.5 else QColor("#d29922")
            p.setPen(QPen(shade, width, Qt.SolidLine, Qt.RoundCap))
            p.drawArc(ring, 225 * 16, int(-270 * 16 * share))
        p.setPen(self.palette().text().color())
        p.drawText(rect.adjusted(0, -10, 0, -10), Qt.AlignCenter, self.text)
        p.drawText(rect.adjusted(0, 22, 0, 22), Qt.AlignCenter, self.caption)


class LineChart(QWidget):
    """Series of values over turns (e.g. prefill and decode tok/s), newest on the right."""

    COLORS = ("#58a6ff", "#f778ba", "#3fb950")

    def __init__(self, names: list[str], *, keep: int = 30, parent=None):
        super().__init__(parent)
        self.names, self.keep = names, keep
        self.series: dict[str, list[float]] = {n: [] for n in names}
        self.setMinimumHeight(120)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def add(self, **values: float) -> None:
        for name in self.names:
            self.series[name] = (self.series[name] + [values.get(name, 0.0)])[-self.keep:]
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        area = QRectF(34, 8, self.width() - 42, self.height() - 30)
        p.setPen(self.palette().mid().color())
        p.drawRect(area)
        top = max((v for s in self.series.values() for v in s), default=0.0) or 1.0
        p.setPen(self.palette().text().color())
        p.drawText(QRectF(0, area.top() - 6, 32, 14), Qt.AlignRight, f"{top:.0f}")
        for i, name in enumerate(self.names):
            values = self.series[name]
            color = QColor(self.COLORS[i % len(self.COLORS)])
            p.setPen(QPen(color, 2))
            step = area.width() / max(1, self.keep - 1)
            points = [QPointF(area.right() - (len(values) - 1 - j) * step, area.bottom() - v / top * area.height())
                      for j, v in enumerate(values)]
            for a, b in zip(points, points[1:]):
                p.drawLine(a, b)
            for point in points:
                p.drawEllipse(point, 2.5, 2.5)
            p.drawText(QRectF(area.left() + 4 + i * 110, area.bottom() + 4, 110, 16), Qt.AlignLeft, f"● {name}")
