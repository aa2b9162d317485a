"""The speed chart's axes: round ticks that cover the data, turn numbers along x."""

import pytest

from brisk.app.widgets.gauges import LineChart, nice_ticks


@pytest.mark.parametrize(
    "top, ticks",
    [
        (0.0, [0.0, 1.0]),
        (4.7, [0.0, 2.0, 4.0, 6.0]),
        (36.0, [0.0, 10.0, 20.0, 30.0, 40.0]),
        (100.0, [0.0, 50.0, 100.0]),
        (1234.0, [0.0, 500.0, 1000.0, 1500.0]),
    ],
)
def test_ticks_are_round_and_cover_the_highest_value(top, ticks):
    assert nice_ticks(top) == ticks


def test_turns_are_numbered_from_the_first_shown_and_keep_their_numbers_when_old_ones_scroll_off(qtbot):
    chart = LineChart(["prefill", "decode"], keep=10)
    qtbot.addWidget(chart)
    for turn in range(1, 4):
        chart.add(prefill=10.0 * turn, decode=5.0)
    assert chart.x_labels() == [(0, 1), (1, 2), (2, 3)]
    assert chart.y_ticks()[-1] >= 30.0
    for turn in range(4, 15):
        chart.add(prefill=1.0, decode=1.0)
    assert chart.count() == 10 and chart.first_turn == 5
    labels = chart.x_labels()
    assert labels[0] == (0, 5) and len(labels) <= 6 and all(turn == 5 + i for i, turn in labels)
    chart.resize(320, 160)
    chart.grab()  # paints without error at a small size
    chart.clear()
    assert chart.count() == 0 and chart.first_turn == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_value_that_is_not_finite_is_drawn_as_zero_and_never_breaks_the_paint(qtbot, bad):
    """An infinite decode speed in a stored row raised inside paintEvent with its QPainter open,
    and Qt crashed with SIGSEGV at every start (issue 54 item 4)."""
    assert nice_ticks(bad) == [0.0, 1.0]
    chart = LineChart(["prefill", "decode"])
    qtbot.addWidget(chart)
    chart.add(prefill=bad, decode=12.0)
    chart.add(prefill=40.0, decode=bad)
    assert chart.series == {"prefill": [0.0, 40.0], "decode": [12.0, 0.0]}
    chart.resize(400, 200)
    assert not chart.grab().isNull()
