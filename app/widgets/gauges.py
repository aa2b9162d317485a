"""Small painted instruments: a ring gauge and a line chart of values over turns."""

from __future__ import annotations

import math

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
        try:  # a painter left open when drawing raises takes the whole app down
            self._paint(p)
        finally:
            p.end()

    def _paint(self, p: QPainter) -> None:
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
    """Series of values over turns (e.g. prefill and decode tok/s): a y axis with round ticks
    and grid lines, turns numbered along x, oldest on the left. A None value is a gap (a turn
    with nothing to plot in that series, such as a cache hit's prefill)."""

    COLORS = ("#58a6ff", "#f778ba", "#3fb950")
    MIN_SLOTS = 5  # a few turns are spread over this many slots, not stretched edge to edge

    def __init__(self, names: list[str], *, keep: int = 30, unit: str = "", parent=None):
        super().__init__(parent)
        self.names, self.keep, self.unit = names, keep, unit
        self.series: dict[str, list[float | None]] = {n: [] for n in names}
        self.first_turn = 1  # the turn number of the oldest point shown
        self.setMinimumHeight(150)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def clear(self) -> None:
        self.series = {n: [] for n in self.names}
        self.first_turn = 1
        self.update()

    def add(self, **values: float | None) -> None:
        for name in self.names:
            value = values.get(name, 0.0)
            if value is not None and not math.isfinite(value):
                value = 0.0  # nothing to draw
            self.series[name] = self.series[name] + [value]
        overflow = len(self.series[self.names[0]]) - self.keep
        if overflow > 0:
            self.series = {n: s[overflow:] for n, s in self.series.items()}
            self.first_turn += overflow
        self.update()

    def count(self) -> int:
        return len(self.series[self.names[0]]) if self.names else 0

    def y_ticks(self) -> list[float]:
        return nice_ticks(max((v for s in self.series.values() for v in s if v is not None), default=0.0))

    def x_labels(self) -> list[tuple[int, int]]:
        """(index of the point, turn number) to print under the axis: at most six, evenly spaced."""
        n = self.count()
        every = max(1, -(-n // 6))
        return [(i, self.first_turn + i) for i in range(0, n, every)]

    def _legend_rows(self) -> list[list[tuple[str, float]]]:
        """The legend's entries (each series, then the axis's "turn" caption) with their widths
        in the widget's font, in rows that fit the plot's width (fixed 90 px slots cut names off)."""
        metrics, room = self.fontMetrics(), self.width() - 48
        gap = metrics.horizontalAdvance("   ")
        rows: list[list[tuple[str, float]]] = [[]]
        used = 0.0
        for text in [f"● {name}" for name in self.names] + ["turn"]:
            width = metrics.horizontalAdvance(text) + 2
            if rows[-1] and used + gap + width > room:
                rows.append([])
                used = 0.0
            used += (gap if rows[-1] else 0) + width
            rows[-1].append((text, width))
        return rows

    def plot_area(self) -> QRectF:
        """Where the lines go; below it a row of turn numbers, then the legend's rows, each a
        line of the widget's font high (fixed 14 px rows clipped larger fonts)."""
        line = self.fontMetrics().height()
        below = (1 + len(self._legend_rows())) * (line + 2) + 4
        return QRectF(40, 8, self.width() - 48, self.height() - 8 - below)

    def legend_rects(self) -> list[tuple[str, QRectF]]:
        """Where each legend entry and the "turn" caption are drawn (all inside the widget)."""
        area, line = self.plot_area(), self.fontMetrics().height()
        gap = self.fontMetrics().horizontalAdvance("   ")
        rects = []
        for r, row in enumerate(self._legend_rows()):
            x, y = area.left(), area.bottom() + (1 + r) * (line + 2) + 2
            for text, width in row:
                rects.append((text, QRectF(x, y, width, line)))
                x += width + gap
        return rects

    def resizeEvent(self, event) -> None:
        # The height follows the legend's rows at this width (the width never depends on it).
        line = self.fontMetrics().height()
        self.setMinimumHeight(max(150, 110 + (1 + len(self._legend_rows())) * (line + 2) + 4))
        super().resizeEvent(event)

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        try:  # a painter left open when drawing raises takes the whole app down
            self._paint(p)
        finally:
            p.end()

    def _paint(self, p: QPainter) -> None:
        p.setRenderHint(QPainter.Antialiasing)
        area = self.plot_area()
        line = self.fontMetrics().height()
        ticks = self.y_ticks()
        top = ticks[-1]
        text, grid = self.palette().text().color(), self.palette().mid().color()
        for tick in ticks:
            y = area.bottom() - tick / top * area.height()
            p.setPen(QPen(grid, 1, Qt.DotLine if tick else Qt.SolidLine))
            p.drawLine(QPointF(area.left(), y), QPointF(area.right(), y))
            p.setPen(text)
            p.drawText(QRectF(0, y - 7, 36, 14), Qt.AlignRight | Qt.AlignVCenter, _tick_text(tick))
        step = area.width() / max(self.MIN_SLOTS, self.count()) if self.count() else 0
        x_of = [area.left() + (j + 0.5) * step for j in range(self.count())]
        p.setPen(text)
        for j, turn in self.x_labels():
            p.drawText(QRectF(x_of[j] - 20, area.bottom() + 2, 40, line), Qt.AlignCenter, str(turn))
        legend = self.legend_rects()
        p.drawText(legend[-1][1], Qt.AlignLeft, legend[-1][0])
        for i, name in enumerate(self.names):
            color = QColor(self.COLORS[i % len(self.COLORS)])
            p.setPen(QPen(color, 2))
            points = [
                QPointF(x, area.bottom() - v / top * area.height()) if v is not None else None
                for x, v in zip(x_of, self.series[name])
            ]
            for a, b in zip(points, points[1:]):
                if a is not None and b is not None:  # a gap breaks the line
                    p.drawLine(a, b)
            for point in points:
                if point is not None:
                    p.drawEllipse(point, 2.5, 2.5)
            p.drawText(legend[i][1], Qt.AlignLeft, legend[i][0])


def nice_ticks(top: float, most: int = 4) -> list[float]:
    """0 up to a round number at or above `top` (1, 2 or 5 times a power of ten per step)."""
    if not math.isfinite(top) or top <= 0:  # a NaN or inf reaching here raised mid-paint: Qt then crashed
        return [0.0, 1.0]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


def _tick_text(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"
