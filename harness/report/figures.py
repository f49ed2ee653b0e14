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

PANEL_SIZE = (4.4, 3.3)  # inches per panel
DPI = 100
PALETTE = "tab10"
MAX_RUN_TICKS = 30  # a longer history labels every k-th run


class Line(NamedTuple):
    xs: Sequence[float]
    ys: Sequence[float | None]  # None: no value at that x (left out)
    key: str | None = None  # colour key; the label when None
    dashed: bool = False


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


def panel_grid(panels: Sequence[Panel], ncols: int = 3, title: str | None = None) -> Figure:
    """Panels in rows of `ncols`; one legend for the figure (a line keeps its colour in every panel), beside
    the grid, so that panels with many lines stay readable."""
    ncols = max(1, min(ncols, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig = _figure(ncols * PANEL_SIZE[0], nrows * PANEL_SIZE[1] + (0.4 if title else 0))
    colours = _colours([line.key or label for p in panels for label, line in p.lines.items()])
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
            fig.legend(list(seen.values()), list(seen), fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5),
                       borderaxespad=0)
    if title:
        fig.suptitle(_short(title, 100))
    return fig


def history_figure(series: Sequence[tuple[str, Sequence[int], Sequence[float], Sequence[float], Sequence[int]]],
                   run_labels: Sequence[str], ylabel: str) -> Figure:
    """One panel: per cell (label, x = run positions, values, fitted levels, change-point indices into
    the cell's values), its values as points and line and, where it changes level, its step fit dashed
    and each change point circled, with a dotted line between the runs. `run_labels` name the x
    positions (oldest first)."""
    fig = _figure(max(7.0, min(16.0, 0.45 * len(run_labels) + 4)) + (3.5 if len(series) <= 12 else 0), 4.6)
    ax = fig.subplots()
    cmap = matplotlib.colormaps[PALETTE]
    for index, (label, xs, values, levels, change_indices) in enumerate(series):
        colour = cmap(index % cmap.N)  # by position: two cells may share a label (seeds are not in it)
        ax.plot(xs, values, marker="o", markersize=3.5, linewidth=1, color=colour, label=_short(label))
        if change_indices:  # a flat fit would only repeat the median
            ax.step(xs, levels, where="mid", linestyle="--", linewidth=1, color=colour, alpha=0.6)
        for i in change_indices:
            ax.axvline(xs[i] - 0.5, color=colour, linestyle=":", linewidth=1)
            ax.plot([xs[i]], [values[i]], marker="o", markersize=10, markerfacecolor="none",
                    markeredgecolor=colour, markeredgewidth=1.8)
    every = math.ceil(len(run_labels) / MAX_RUN_TICKS)
    ticks = list(range(0, len(run_labels), every))
    ax.set_xticks(ticks)
    ax.set_xticklabels([_short(run_labels[i], 24) for i in ticks], rotation=45, ha="right", fontsize=7)
    ax.set_xlabel("run (oldest → newest)")
    ax.set_ylabel(_short(ylabel))
    ax.grid(True, alpha=0.3)
    if len(series) <= 12:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


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


def _colours(keys: Sequence[str]) -> dict[str, tuple]:
    cmap = matplotlib.colormaps[PALETTE]
    ordered = list(dict.fromkeys(keys))
    return {key: cmap(i % cmap.N) for i, key in enumerate(ordered)}


def _draw_panel(ax, panel: Panel, colours: dict[str, tuple], legend: bool = True) -> None:
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
    all_xs: list[float] = []
    for label, line in panel.lines.items():
        points = [(x, y) for x, y in zip(line.xs, line.ys) if y is not None and x is not None]
        if not points:
            continue
        xs, ys = zip(*points)
        all_xs.extend(xs)
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.4, linestyle="--" if line.dashed else "-",
                color=colours[line.key or label], label=_short(label))
    if not all_xs:
        ax.text(0.5, 0.5, _short(panel.empty, 80), ha="center", va="center", transform=ax.transAxes, color="grey",
                wrap=True)
        return
    if panel.log2_x and min(all_xs) > 0 and max(all_xs) / min(all_xs) >= 4:
        ax.set_xscale("log", base=2)
    if panel.integer_x or panel.log2_x:
        ticks = sorted(set(all_xs))
        if len(ticks) <= 12:
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
    if legend:
        ax.legend(fontsize=7, loc="best")


def _short(text: str, limit: int = 48) -> str:
    """A label from the store as plain text: '$' escaped (matplotlib would parse it as math), long ones
    cut in the middle so legends keep both ends."""
    text = str(text)
    if len(text) > limit:
        text = text[: limit // 2 - 1] + "…" + text[-(limit // 2 - 1):]
    return text.replace("$", r"\$")
