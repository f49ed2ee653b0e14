"""Series stay apart: styles past the palette's 10 colours, error bars, SLA lines and dodged equal series."""

from __future__ import annotations

from harness.report import figures
from harness.report.figures import Line, Panel
from harness.gate.stats import wilson_interval


def test_styles_stay_distinct_past_ten_series():
    keys = [f"series {i}" for i in range(40)]
    looks = figures.styles(keys)
    assert len({(s.color, s.marker, s.linestyle) for s in looks.values()}) == 40


def test_equal_series_are_dodged_and_bars_and_sla_lines_are_drawn():
    panel = Panel("t", "concurrency", "TTFT p50 (ms)", log2_x=True, dodge=True, hlines=((50.0, "SLA 50 ms"),),
                  lines={"a": Line([1, 4], [10.0, 20.0], lo=[8.0, 15.0], hi=[12.0, 30.0]),
                         "b": Line([1, 4], [10.0, 20.0])})
    fig = figures.panel_grid([panel])
    ax = fig.axes[0]
    centres = [tuple(line.get_xdata()) for line in ax.get_lines() if list(line.get_ydata()) == [10.0, 20.0]]
    assert len(centres) == 2 and centres[0] != centres[1]  # identical values, side by side
    assert any(list(line.get_ydata()) == [50.0, 50.0] for line in ax.get_lines())  # the SLA line
    assert ax.collections  # the error bars of series a
    assert any(t.get_text() == "SLA 50 ms" for t in ax.texts)


def test_wilson_interval():
    low, high = wilson_interval(6, 10)
    assert 0.3 < low < 0.6 < high < 0.85
    assert wilson_interval(10, 10)[1] == 1.0 and wilson_interval(0, 10)[0] == 0.0
