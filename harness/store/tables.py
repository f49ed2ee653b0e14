"""The store's tables as Python sees them: which are per run or per cell, their row order, and the
one bulk insert every writer uses.

Why a column-wise insert: a cell holds ~20k token rows, and DuckDB's `executemany` runs one INSERT per
row (≈ 0.25 ms each, five seconds a cell). Passing each column as one typed list parameter and
`unnest`ing them in a single `INSERT … SELECT` moves the whole cell in one statement (≈ 20 ms), needs
neither pandas nor pyarrow, and keeps NULLs (`None`) as they are. Columns that are the same for every
row (run_id, cell_id, repeat) go in as scalars and broadcast.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import duckdb

# Tables holding one cell's rows, deleted together when a failed cell is retried; `cells` first.
CELL_TABLES = (
    "cells", "requests", "request_steps", "request_tokens", "step_confidences", "engine_steps",
    "calibration_bins", "metrics",
)
# Every table with rows of a run, in the order an export writes and an import reads them.
RUN_TABLES = ("runs",) + CELL_TABLES + ("superseded_cells", "benchmarks")

# Row order of an export: cells by key, rows of one cell in the order they were recorded (DuckDB's rowid
# keeps insertion order), so a run exports the same text every time and imports in the backend's order.
ORDER_BY = {
    "runs": "run_id",
    "cells": "cell_id, repeat",
    "superseded_cells": "cell_id, repeat, superseded_at, rowid",
    **{table: "cell_id, repeat, rowid" for table in CELL_TABLES[1:]},
    "benchmarks": "rowid",
}


def column_types(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    """{column: DuckDB type} in table order."""
    rows = con.execute(
        "SELECT column_name, data_type FROM duckdb_columns() "
        "WHERE database_name = current_database() AND schema_name = 'main' AND table_name = ? "
        "ORDER BY column_index",
        [table],
    ).fetchall()
    return dict(rows)


def insert_columns(
    con: duckdb.DuckDBPyConnection,
    table: str,
    types: Mapping[str, str],
    columns: Mapping[str, Sequence[Any]],
    constants: Mapping[str, Any] | None = None,
) -> int:
    """INSERT one row per index of the (equal-length) `columns`, each `constants` value on every row.

    `types` is `column_types(con, table)`; each list is cast to its column's type, so an all-NULL or
    empty list still binds. Returns the number of rows (0 inserts nothing)."""
    lengths = {len(values) for values in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"{table}: columns of different lengths {sorted(lengths)}")
    count = lengths.pop() if lengths else 0
    if count == 0:
        return 0
    constants = constants or {}
    names = list(constants) + list(columns)
    unknown = [name for name in names if name not in types]
    if unknown:
        raise ValueError(f"{table} has no column(s) {unknown}")
    select = [f"?::{types[name]}" for name in constants] + [f"unnest(?::{types[name]}[])" for name in columns]
    params = list(constants.values()) + [list(values) for values in columns.values()]
    quoted = ", ".join(f'"{name}"' for name in names)
    con.execute(f"INSERT INTO {table} ({quoted}) SELECT {', '.join(select)}", params)
    return count
