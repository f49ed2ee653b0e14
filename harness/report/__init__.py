"""Reports over the result store: a static HTML page per run, and one metric's history with its change
points.

    command.py       report_command / write_report: `harness report RUN|latest --out DIR`
    data.py          RunData: what the page shows, read from the store's views (pooled in SQL)
    sections.py      the page's sections (run, τ vs γ, per-position acceptance, reliability, load,
                     history, summary), each saying why when it has nothing to show
    figures.py       matplotlib panels on an Agg canvas, written as PNGs beside the page
    page.py          HTML: escaping, tables, the page skeleton (no JavaScript, nothing from a network)
    history.py       history / history_command: `harness history METRIC [--where SQL]`
    changepoints.py  the L1 step fit that finds where a history changes level

`report_command` and `write_report` load lazily, so `harness history` never imports matplotlib.
"""

from __future__ import annotations

__all__ = ["report_command", "write_report"]


def __getattr__(name: str):
    if name in __all__:
        from harness.report import command

        return getattr(command, name)
    raise AttributeError(f"module 'harness.report' has no attribute {name!r}")
