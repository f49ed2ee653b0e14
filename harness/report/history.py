"""One metric over the run history, per cell, with its change points: what `harness history` prints and
the report's history section plots.

Why per cell: a cell id is the hash of the cell's parameters, equal across runs and suites, so the
values of one cell id are one measurement repeated over time; a change of level there is a change of
the code or the machine, not of the question asked. A run's repeats of a cell are averaged into one
point (the history has one point per run); failed cells and NULL values are left out.

`--where` is a user condition over the columns of `v_metrics` (`task = 'gsm8k' AND git_branch =
'main'`). It is never pasted into SQL: `harness.store.condition` parses it with DuckDB's parser, allows
only a boolean expression of a small grammar over that view's columns, and the query selects from
DuckDB's rendering of that tree (a subquery), inside a sandboxed read-only connection.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence, TextIO

import duckdb

from harness.report.changepoints import StepFit, fit_steps
from harness.store import Store, StoreError
from harness.store.condition import parse_condition
from harness.store.errors import one_line


class HistoryRow(NamedTuple):
    """One cell in one run: the mean over the run's repeats of the cell."""

    cell_id: str
    label: str
    run_id: str
    started_at: Any  # the run's start, naive UTC datetime
    git_sha: str | None
    git_branch: str | None
    value: float
    repeats: int  # repeats averaged into value


@dataclass(frozen=True)
class Series:
    """The history of one cell, oldest first, and its step fit."""

    cell_id: str
    label: str  # the newest run's label for the cell
    rows: tuple[HistoryRow, ...]
    fit: StepFit


def check_where(where: str | None) -> None:
    """Refuse what cannot be a condition before the store is opened: an empty one. (The grammar is
    checked against the view's columns by `harness.store.condition`, which needs the store.)"""
    if where is not None and not where.strip():
        raise StoreError("--where is empty: give a condition such as \"task = 'gsm8k'\"")


def history(
    source: Store | duckdb.DuckDBPyConnection,
    metric: str,
    where: str | None = None,
    *,
    suite_name: str | None = None,
    cell_ids: Sequence[str] | None = None,
    until: Any = None,
) -> list[HistoryRow]:
    """`metric` of every ok cell in every run, oldest run first: rows (cell_id, label, run_id,
    started_at, git_sha, git_branch, value, repeats) from `v_metrics`. `where` is a user condition over
    v_metrics columns (see the module docstring); `suite_name`, `cell_ids` and `until` (runs started at
    or before this datetime) are bound parameters. StoreError on a bad clause."""
    check_where(where)
    clauses = ["metric = ?", "status = 'ok'", "value IS NOT NULL"]
    params: list[Any] = [metric]
    if suite_name is not None:
        clauses.append("run_id IN (SELECT run_id FROM runs WHERE suite_name = ?)")
        params.append(suite_name)
    if cell_ids is not None:
        if not cell_ids:
            return []
        clauses.append(f"cell_id IN ({', '.join('?' * len(cell_ids))})")
        params.extend(cell_ids)
    if until is not None:
        clauses.append("started_at <= ?")
        params.append(until)
    chosen = "v_metrics"
    if where is not None:
        con = source.con if isinstance(source, Store) else source
        columns = [name for (name, *_rest) in _query(source, "DESCRIBE v_metrics", [])[1]]
        chosen = f"({parse_condition(con, where, 'v_metrics', columns)}) AS chosen"
    sql = (
        "SELECT cell_id, label, run_id, started_at, git_sha, git_branch, avg(value) AS value, count(*) AS repeats "
        f"FROM {chosen} WHERE {' AND '.join(clauses)} "
        "GROUP BY cell_id, label, run_id, started_at, git_sha, git_branch "
        "ORDER BY started_at, run_id, label, cell_id"
    )
    _, rows = _query(source, sql, params)
    return [HistoryRow(*row) for row in rows]


def series(rows: Sequence[HistoryRow]) -> list[Series]:
    """The rows grouped per cell (ordered by the cell's newest label), each with its step fit."""
    by_cell: dict[str, list[HistoryRow]] = {}
    for row in rows:
        by_cell.setdefault(row.cell_id, []).append(row)
    out = [
        Series(cell_id, cell_rows[-1].label or cell_id, tuple(cell_rows), fit_steps([r.value for r in cell_rows]))
        for cell_id, cell_rows in by_cell.items()
    ]
    return sorted(out, key=lambda s: (s.label, s.cell_id))


def metric_names(source: Store | duckdb.DuckDBPyConnection) -> list[str]:
    """Every metric name in the store, sorted."""
    _, rows = _query(source, "SELECT DISTINCT metric FROM metrics ORDER BY metric", [])
    return [row[0] for row in rows]


FORMATS = ("table", "csv", "json", "markdown")
HISTORY_COLUMNS = ("cell_id", "label", "run_id", "started_at", "git_sha", "value", "level", "change")


def history_table(all_series: Sequence[Series]) -> list[tuple]:
    """Rows of HISTORY_COLUMNS: per cell, oldest first; `level` is the fitted step level, `change` says
    where it moves ("1.82 -> 2.10 (+15.4%)"), empty elsewhere."""
    out = []
    for s in all_series:
        changes = {c.index: c for c in s.fit.changes}
        for i, row in enumerate(s.rows):
            change = changes.get(i)
            out.append((
                s.cell_id, s.label, row.run_id, row.started_at, (row.git_sha or "")[:10], row.value,
                s.fit.levels[i], describe_change(change) if change else "",
            ))
    return out


def describe_change(change) -> str:
    """'before -> after (+x.x%)' of a ChangePoint."""
    relative = f" ({change.relative:+.1%})" if change.relative is not None else ""
    return f"{change.before:.4g} -> {change.after:.4g}{relative}"


def history_command(
    db: str | Path, metric: str, where: str | None = None, fmt: str = "table", out: TextIO | None = None
) -> int:
    """`harness history METRIC [--where SQL]`: the metric per cell over the runs, change points flagged.
    Exit 0; 2 on a bad store, an unknown metric (the message lists the metrics present) or a bad
    `--where`."""
    out = out or sys.stdout
    try:
        if fmt not in FORMATS:
            raise StoreError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
        check_where(where)
        with Store.open(db, read_only=True) as store:
            names = metric_names(store)
            if metric not in names:
                raise StoreError(_unknown_metric(metric, names, db))
            try:
                rows = history(store, metric, where)
            except StoreError as exc:
                raise StoreError(f"--where failed: {exc}") if where is not None and "--where" not in str(exc) else exc
    except StoreError as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        return 2
    all_series = series(rows)
    from harness.tables import write_table

    write_table(HISTORY_COLUMNS, history_table(all_series), fmt, out)
    if fmt == "table":
        changes = sum(len(s.fit.changes) for s in all_series)
        out.write(f"{len(all_series)} cell(s), {changes} change point(s)\n")
    return 0


def _unknown_metric(metric: str, names: Sequence[str], db) -> str:
    if not names:
        return f"no metric {metric!r} in {db}: the store has no metrics yet (record a run first)"
    close = difflib.get_close_matches(metric, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"no metric {metric!r} in {db}{hint}; metrics present: {', '.join(names)}"


def _query(source, sql: str, params: list) -> tuple[list[str], list[tuple]]:
    """Store.query, or the same over a bare DuckDB connection (errors as one-line StoreErrors)."""
    if isinstance(source, Store):
        return source.query(sql, params)
    try:
        cursor = source.execute(sql, params)
        return [d[0] for d in cursor.description], cursor.fetchall()
    except duckdb.Error as exc:
        raise StoreError(f"query failed: {one_line(exc)}") from exc
