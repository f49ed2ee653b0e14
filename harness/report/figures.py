"""The report's plots as PNG files: grids of line panels, and the history with its change points.

Why matplotlib's object API (a `Figure` with an explicit Agg canvas) instead of pyplot: Agg renders
PNGs on any machine, with no display, and without pyplot there is no global figure state and no
`matplotlib.use(...)`, so importing this module leaves the caller's backend alone (a notebook keeps
its own). Figures know nothing of the store: `sections.py` turns view rows into
`Panel`s of named lines, so every plot here is a pure function of plain numbers.

A line's colour follows its key (its label unless given), the same in every panel of a figure, so a
drafter has one colour across tasks; a panel without any point says so in its middle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Sequence

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PANEL_SIZE = (4.8, 3.6)  # inches per panel
DPI = 100
PALETTE = "tab10"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", "-.", ":")
LEGEND_FONT = 9
MAX_RUN_TICKS = 30  # a longer history labels every k-th run
DODGE = 0.035  # horizontal offset between series, as a fraction of the x range (log2 for load axes)


class Line(NamedTuple):
    xs: Sequence[float]
    ys: Sequence[float | None]  # None: no value at that x (left out)
    key: str | None = None  # style key; the label when None
    dashed: bool = False
    lo: Sequence[float | None] | None = None  # error bar ends (e.g. min and max over repeats); None: no bar
    hi: Sequence[float | None] | None = None
    xlo: Sequence[float | None] | None = None  # horizontal bars (Pareto: x is a measured rate too)
    xhi: Sequence[float | None] | None = None
    tags: Sequence[str] | None = None  # a short text beside each point (Pareto: its load)
    reference: bool = False  # the baseline series (plain decoding): drawn black and thicker, above the rest


class Style(NamedTuple):
    """How one series is drawn: colour, marker and line style together, so more than 10 series stay apart."""

    color: tuple
    marker: str
    linestyle: str


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    lines: dict[str, Line] = field(default_factory=dict)  # label → line
    empty: str = "no data"  # shown when no line has a point
    diagonal: bool = False  # draw y = x (reliability diagrams)
    log2_x: bool = False  # log₂ x axis when x spans a factor ≥ 4 (concurrency, request rate)
    integer_x: bool = False  # integer ticks (γ, positions)
    unit_square: bool = False  # both axes 0 … 1
    ylim: tuple[float, float] | None = None
    hlines: tuple[tuple[float, str], ...] = ()  # (y, label): reference lines, e.g. an SLA
    dodge: bool = False  # offset series sideways so equal values do not hide each other
    connect: bool = True  # join a line's points (False: scatter, e.g. a Pareto frontier of points)


def panel_grid(panels: Sequence[Panel], ncols: int = 3, title: str | None = None) -> Figure:
    """Panels in rows of `ncols`; one legend for the figure (a line keeps its colour in every panel), beside
    the grid, so that panels with many lines stay readable."""
    ncols = max(1, min(ncols, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig = _figure(ncols * PANEL_SIZE[0], nrows * PANEL_SIZE[1] + (0.4 if title else 0))
    colours = styles([line.key or label for p in panels for label, line in p.lines.items() if not line.reference])
    colours.update({line.key or label: Style("black", "o", "--") for p in panels for label, line in p.lines.items()
                    if line.reference})
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.set_visible(False)
            continue
        _draw_panel(ax, panels[index], colours, legend=len(panels) == 1)
    if len(panels) > 1:
        seen: dict[str, object] = {}
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, handle)
        if seen:
            fig.legend(list(seen.values()), list(seen), fontsize=LEGEND_FONT, loc="center left",
                       bbox_to_anchor=(1.0, 0.5), borderaxespad=0, ncols=1 + len(seen) // 28)
    if title:
        fig.suptitle(_short(title, 100))
    return fig


def history_figure(series: Sequence[tuple[str, Sequence[int], Sequence[float], Sequence[float], Sequence[int]]],
                   run_labels: Sequence[str], ylabel: str) -> Figure:
    """One panel: per cell (label, x = run positions, values, fitted levels, change-point indices into
    the cell's values), its values as points and line and, where it changes level, its step fit dashed
    and each change point circled, with a dotted line between the runs. `run_labels` name the x
    positions (oldest first): the run's date and commit, so a step can be read off against the history."""
    prefix = _common_prefix([label for label, *_ in series])
    rows = math.ceil(len(series) / 2) if len(series) <= 40 else 0  # legend rows below the plot, two columns
    fig = _figure(max(10.0, min(16.0, 0.55 * len(run_labels) + 4)), 4.6 + 0.22 * rows)
    ax = fig.subplots()
    if prefix:
        ax.set_title(f"cells {_short(prefix, 60)}…", fontsize=10)
    look = styles([str(i) for i in range(len(series))])  # by position: two cells may share a label
    step = min(0.04, 0.5 / max(1, len(series)))  # cells with equal values side by side, not on top of each other
    for index, (label, xs, values, levels, change_indices) in enumerate(series):
        style = look[str(index)]
        xs = [x + (index - (len(series) - 1) / 2) * step for x in xs]
        ax.plot(xs, values, marker=style.marker, markersize=4, linewidth=1, linestyle=style.linestyle,
                color=style.color, label=_short(label[len(prefix):], 60), markeredgecolor="white" if index % 2 else style.color,
                markeredgewidth=0.6)
        if change_indices:  # a flat fit would only repeat the median
            ax.step(xs, levels, where="mid", linestyle="--", linewidth=1, color=style.color, alpha=0.6)
        for i in change_indices:
            ax.axvline(round(xs[i]) - 0.5, color=style.color, linestyle=":", linewidth=1)
            ax.plot([xs[i]], [values[i]], marker="o", markersize=11, markerfacecolor="none",
                    markeredgecolor=style.color, markeredgewidth=1.8)
    every = math.ceil(len(run_labels) / MAX_RUN_TICKS)
    ticks = list(range(0, len(run_labels), every))
    ax.set_xticks(ticks)
    ax.set_xticklabels([run_labels[i] for i in ticks], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("run: start (UTC) and commit, oldest → newest")
    ax.set_ylabel(_short(ylabel))
    ax.grid(True, alpha=0.3)
    if rows:
        ax.legend(fontsize=LEGEND_FONT - 1 if len(series) > 12 else LEGEND_FONT, loc="upper center",
                  bbox_to_anchor=(0.5, -0.32), borderaxespad=0, ncols=2 if len(series) > 1 else 1)
    return fig


def _common_prefix(labels: Sequence[str]) -> str:
    """The leading '/'-separated parts all labels share (e.g. 'inhouse/embedded/'), '' for one label."""
    if len(labels) < 2:
        return ""
    parts = [str(label).split("/") for label in labels]
    shared = []
    for column in zip(*parts):
        if len(set(column)) != 1:
            break
        shared.append(column[0])
    shared = shared[: min(len(p) for p in parts) - 1]  # keep at least the last part of each label
    return "/".join(shared) + "/" if shared else ""


def save(fig: Figure, path: Path) -> Path:
    """Write a figure as PNG and drop it (figures are not reused)."""
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    fig.clear()
    return path


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def styles(keys: Sequence[str]) -> dict[str, Style]:
    """A Style per distinct key, in order: 10 colours, then the next marker and line style with each round."""
    cmap = matplotlib.colormaps[PALETTE]
    ordered = list(dict.fromkeys(keys))
    return {key: Style(cmap(i % cmap.N), MARKERS[(i // cmap.N) % len(MARKERS)] if i >= cmap.N else MARKERS[0],
                       LINESTYLES[(i // cmap.N) % len(LINESTYLES)])
            for i, key in enumerate(ordered)}


def _dodged(xs: Sequence[float], offset: float, log: bool) -> list[float]:
    return [x * 2 ** offset if log else x + offset for x in xs]


def _bars(values: Sequence[float], lo, hi, points) -> tuple[list[float], list[float]] | None:
    """matplotlib's asymmetric error (below, above) for the plotted points, or None without bars."""
    if lo is None or hi is None:
        return None
    below, above = [], []
    for (i, v) in zip(points, values):
        low, high = lo[i], hi[i]
        below.append(max(0.0, v - low) if low is not None else 0.0)
        above.append(max(0.0, high - v) if high is not None else 0.0)
    return (below, above) if any(below) or any(above) else None


def _draw_panel(ax, panel: Panel, colours: dict[str, Style], legend: bool = True) -> None:
    ax.set_title(_short(panel.title, 60), fontsize=10)
    ax.set_xlabel(_short(panel.xlabel))
    ax.set_ylabel(_short(panel.ylabel))
    ax.grid(True, alpha=0.3)
    if panel.diagonal:
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="perfect calibration")
    if panel.unit_square:
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    series = []
    all_xs: list[float] = []
    for label, line in panel.lines.items():
        points = [i for i, (x, y) in enumerate(zip(line.xs, line.ys)) if y is not None and x is not None]
        if points:
            series.append((label, line, points))
            all_xs.extend(line.xs[i] for i in points)
    if not all_xs:
        ax.text(0.5, 0.5, _short(panel.empty, 80), ha="center", va="center", transform=ax.transAxes, color="grey",
                wrap=True)
        return
    log = panel.log2_x and min(all_xs) > 0 and max(all_xs) / min(all_xs) >= 4
    span = (math.log2(max(all_xs) / min(all_xs)) if log else max(all_xs) - min(all_xs)) or 1.0
    for n, (label, line, points) in enumerate(series):
        style = colours[line.key or label]
        xs = [line.xs[i] for i in points]
        ys = [line.ys[i] for i in points]
        if panel.dodge and len(series) > 1:  # equal values side by side instead of on top of each other
            xs = _dodged(xs, (n - (len(series) - 1) / 2) * DODGE * span / max(1, len(series) / 4), log)
        yerr = _bars(ys, line.lo, line.hi, points)
        xerr = _bars([line.xs[i] for i in points], line.xlo, line.xhi, points)
        linestyle = ("--" if line.dashed else style.linestyle) if panel.connect else "none"
        color = "black" if line.reference else style.color
        ax.errorbar(xs, ys, yerr=yerr, xerr=xerr, marker=style.marker, markersize=5, linewidth=2.2 if line.reference
                    else 1.4, linestyle=linestyle, color=color, label=_short(label), capsize=2.5 if yerr or xerr else 0,
                    elinewidth=0.9, markeredgecolor="white" if n % 2 else color, markeredgewidth=0.6,
                    zorder=(4 if line.reference else 3) + (len(series) - n) * 0.01)
        if line.tags is not None:
            for x, y, i in zip(xs, ys, points):
                ax.annotate(line.tags[i], (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7, color=color)
    for y, text in panel.hlines:
        ax.axhline(y, color="#b22222", linestyle=(0, (6, 3)), linewidth=1.2, zorder=2)
        ax.annotate(text, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                    ha="right", va="bottom", fontsize=8, color="#b22222")
    if log:
        ax.set_xscale("log", base=2)
    elif len(set(all_xs)) == 1:  # one x (a single γ): keep the dodged series near it, not spread edge to edge
        ax.set_xlim(all_xs[0] - 1, all_xs[0] + 1)
    if panel.integer_x or panel.log2_x:
        ticks = sorted(set(all_xs))
        if len(ticks) <= 12:
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
            if log:
                ax.minorticks_off()
    if legend:
        ax.legend(fontsize=LEGEND_FONT, loc="best")


def _short(text: str, limit: int = 48) -> str:
    """A label from the store as plain text: '$' escaped (matplotlib would parse it as math), long ones
    cut in the middle so legends keep both ends."""
    text = str(text)
    if len(text) > limit:
        text = text[: limit // 2 - 1] + "…" + text[-(limit // 2 - 1):]
    return text.replace("$", r"\$")
