"""Small painted instruments: a ring gauge and a line chart of values over turns."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget


class RingGauge(QWidget):
    """A share in [0, 1] as an arc, with a caption under the number."""

    def __init__(self, caption: str, parent=None):
        super().__init__(parent)
        self.caption, self.value, self.text = caption, 0.0, "–"
        self.setMinimumSize(110, 110)

    def set_value(self, share: float, text: str) -> None:
        self.value, self.text = max(0.0, min(1.0, share)), text
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        side = min(self.width(), self.height()) - 12
        rect = QRectF((self.width() - side) / 2, 6, side, side)
        track = self.palette().mid().color()
        p.setPen(QPen(track, 9, Qt.SolidLine, Qt.RoundCap))
        p.drawArc(rect, 225 * 16, -270 * 16)
        color = QColor("#3fb950") if self.value >= 0.5 else QColor("#d29922")
        p.setPen(QPen(color, 9, Qt.SolidLine, Qt.RoundCap))
        p.drawArc(rect, 225 * 16, int(-270 * 16 * self.value))
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
