"""`harness compare RUN_A RUN_B`: two runs side by side, metric by metric, without judging.

The gate decides; compare only shows. Each row is one cell (paired by cell id, as the gate pairs them)
and one metric of the metrics table, with the mean over each run's ok repeats and the relative change
b/a − 1. Cells or metrics present in only one run keep a row, with the other side empty, so nothing
disappears silently from the view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import duckdb

from harness.gate import data
from harness.gate.format import change, num


@dataclass(frozen=True)
class CompareRow:
    cell_id: str
    label: str
    metric: str
    a: float | None  # mean over run A's ok repeats
    b: float | None
    change: float | None  # b / a − 1; None when a side is missing or a is 0

    def as_tuple(self) -> tuple:
        return (self.label, self.metric, self.a, self.b, self.change)


COLUMNS = ("cell", "metric", "a", "b", "change")


def _means(conn: duckdb.DuckDBPyConnection, run_id: str, metrics: Sequence[str] | None) -> dict[tuple[str, str], float]:
    rows = conn.execute(
        """
        SELECT m.cell_id, m.metric, avg(m.value)
        FROM metrics m
        JOIN cells c ON c.run_id = m.run_id AND c.cell_id = m.cell_id AND c."repeat" = m."repeat"
        WHERE m.run_id = $run_id AND c.status = 'ok' AND m.value IS NOT NULL
        GROUP BY m.cell_id, m.metric
        """,
        {"run_id": run_id},
    ).fetchall()
    wanted = None if metrics is None else set(metrics)
    return {(cell, metric): float(v) for cell, metric, v in rows if wanted is None or metric in wanted}


def compare_runs(
    conn: duckdb.DuckDBPyConnection, run_a: str, run_b: str, metrics: Sequence[str] | None = None
) -> list[CompareRow]:
    """Rows sorted by cell label then metric; `metrics` restricts (and orders nothing), None: all."""
    labels = {c.cell_id: c.label for c in data.cells(conn, run_b).values()}
    labels.update({c.cell_id: c.label for c in data.cells(conn, run_a).values()})
    a, b = _means(conn, run_a, metrics), _means(conn, run_b, metrics)
    rows = []
    for cell_id, metric in a.keys() | b.keys():
        va, vb = a.get((cell_id, metric)), b.get((cell_id, metric))
        rel = vb / va - 1 if va and vb is not None else None
        rows.append(CompareRow(cell_id, labels.get(cell_id, cell_id), metric, va, vb, rel))
    rows.sort(key=lambda r: (r.label, r.metric))
    return rows


def compare_table(rows: Sequence[CompareRow]) -> str:
    """Aligned plain-text table of compare rows."""
    body = [(r.label, r.metric, num(r.a), num(r.b), change(r.change, "relative")) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [COLUMNS, *body]]
    return "\n".join(lines) + "\n"
