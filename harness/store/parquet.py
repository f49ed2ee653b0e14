"""Runs as parquet files, one per table and run, and back: how many machines pool one history.

    DIR/runs/<run_id>.parquet            always (one row)
    DIR/<table>/<run_id>.parquet         every other table of `tables.RUN_TABLES` the run has rows in

Why parquet beside the JSON export (`exchange.py`, for one baseline in git): a history is many runs and
millions of token rows, and parquet is compact, typed and read by every tool. Each machine exports its
own runs; the files are pooled by copying them into one directory (run ids are unique across
machines, so files never collide); any machine imports the pool into its store, or queries it where
it lies: `SELECT * FROM read_parquet('DIR/cells/*.parquet')`. Files are written by DuckDB's `COPY …
TO (FORMAT parquet)` (no pyarrow) under a temporary name and renamed, so a reader never sees half a
file; rows in export order (`tables.ORDER_BY`), so an import keeps each cell's rows in recorded order.
Each file carries the store's schema version in its key-value metadata.

An import is keyed by run id: every run of DIR/runs that the store lacks comes in with its rows of
every table, all in one transaction; a run the store has is skipped whole, so importing a directory
twice changes nothing. Runs keep their kind, label and status (an imported history is the history,
unlike `import_run`, which marks a baseline 'imported'). A file of a newer schema is refused; one of an
older schema loads the columns it has (later migrations only add columns; the rest stay NULL).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from duckdb.func import FunctionNullHandling

from contracts.redaction import redact
from harness.store.errors import StoreError, one_row
from harness.store.migrations import SCHEMA_VERSION
from harness.store.store import Store
from harness.store.tables import ORDER_BY, RUN_TABLES, column_types

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")  # what may name a file


def export_parquet(store: Store, run_ids: Iterable[str], directory: str | Path) -> list[Path]:
    """Write each run's rows of every table under `directory` (created); returns the files written.
    Exporting a run again rewrites its files with the same rows."""
    directory = Path(directory)
    written: list[Path] = []
    for run_id in run_ids:
        if store.run(run_id) is None:
            raise StoreError(f"no run {run_id!r} in {store.path} to export")
        if not _RUN_ID.match(run_id):
            raise StoreError(f"run id {run_id!r} cannot name a file")
        for table in RUN_TABLES:
            (count,) = one_row(store.con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]), table)
            if count == 0 and table != "runs":
                continue
            path = directory / table / f"{run_id}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.partial")
            store.con.execute(
                f"COPY (SELECT *{_redacting(store, table)} FROM {table} WHERE run_id = {_literal(run_id)} ORDER BY {ORDER_BY[table]}) "
                f"TO {_literal(str(partial))} (FORMAT parquet, KV_METADATA {{schema_version: '{SCHEMA_VERSION}'}})"
            )
            os.replace(partial, path)
            written.append(path)
    return written


REDACTED_COLUMNS = ("error", "log")  # what a backend or server said: may echo a secret (contracts.redaction)


def _redact_one(text: str | None) -> str | None:
    return redact(text)


def _redacting(store: Store, table: str) -> str:
    """` REPLACE (…)` masking secrets in the table's error/log text (recording redacts already; this also
    covers runs recorded before it did)."""
    columns = [c for c, kind in column_types(store.con, table).items() if c in REDACTED_COLUMNS and kind == "VARCHAR"]
    if not columns:
        return ""
    registered = store.con.execute(
        "SELECT 1 FROM duckdb_functions() WHERE function_name = 'harness_redact'").fetchall()
    if not registered:
        store.con.create_function("harness_redact", _redact_one, ["VARCHAR"], "VARCHAR",
                                  null_handling=FunctionNullHandling.SPECIAL)
    return " REPLACE (" + ", ".join(f'harness_redact("{c}") AS "{c}"' for c in columns) + ")"


def import_parquet(store: Store, directory: str | Path) -> tuple[list[str], list[str]]:
    """Load every run under `directory` that the store lacks, in one transaction; returns (imported run
    ids, skipped ones: already in the store)."""
    directory = Path(directory)
    run_files = sorted((directory / "runs").glob("*.parquet"))
    if not run_files:
        raise StoreError(f"{directory} holds no exported runs (no {directory / 'runs'}/*.parquet)")
    imported, skipped = [], []
    with store.transaction(f"importing runs from {directory}"):
        for run_file in run_files:
            run_id = run_file.stem
            _check_file(store, run_file, run_id)
            if store.run(run_id) is not None:
                skipped.append(run_id)
                continue
            for table in RUN_TABLES:
                path = directory / table / f"{run_id}.parquet"
                if path.exists():
                    _insert(store, table, path)
            imported.append(run_id)
    return imported, skipped


def _check_file(store: Store, path: Path, run_id: str) -> None:
    """The file is a run export of this run id, of a schema this code knows."""
    def read(sql: str) -> list[tuple]:
        try:
            return store.con.execute(sql, [str(path)]).fetchall()
        except Exception as exc:  # noqa: BLE001 — any unreadable file is one actionable line
            raise StoreError(f"cannot read {path}: {str(exc).splitlines()[0]}") from exc

    version = dict(read("SELECT key::VARCHAR, value::VARCHAR FROM parquet_kv_metadata(?)")).get("schema_version")
    if version is None or not version.isdigit():
        raise StoreError(f"{path} is not a harness parquet export (no schema_version in its metadata)")
    if int(version) > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {version}, newer than this code knows ({SCHEMA_VERSION}): "
                         "update dspark-harness to import it")
    ids = read("SELECT DISTINCT run_id FROM read_parquet(?)")
    if ids != [(run_id,)]:
        raise StoreError(f"{path} should hold run {run_id!r}, holds {[i for (i,) in ids]}")


def _insert(store: Store, table: str, path: Path) -> None:
    types = column_types(store.con, table)
    names = [name for (name, *_rest) in store.con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall()]
    unknown = [name for name in names if name not in types]
    if unknown:
        raise StoreError(f"{path}: table {table} has columns this schema lacks: {unknown}")
    quoted = ", ".join(f'"{name}"' for name in names)
    store.con.execute(f"INSERT INTO {table} ({quoted}) SELECT {quoted} FROM read_parquet(?)", [str(path)])


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
