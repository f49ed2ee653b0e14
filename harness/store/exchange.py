"""One run as one JSON file, and back: how a baseline travels (e.g. `results/baselines/ci.json` in the repo).

Why JSON and not a DuckDB file: a baseline in git should diff as text and load on any version of
DuckDB. The document is deterministic — tables in a fixed order, rows sorted by their natural key,
JSON columns as canonical JSON — so exporting the same run twice gives the same bytes, and compact:
per table a `columns` list and `rows` as lists, one row per line, without the run_id every row shares.

    {"format": "dspark-harness-run", "schema_version": 1, "run_id": "r…",
     "tables": {"runs": {"columns": [...], "rows": [[...]]}, "cells": {...}, ..., "benchmarks": {...}}}

Timestamps are ISO strings; JSON columns hold their decoded value. An import refuses a file of a newer
schema version; an older one loads the columns it has (later migrations only add columns).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb

from contracts.redaction import redact
from harness.store.cell_rows import canonical_json
from harness.store.connection import damaged
from harness.store.errors import StoreError
from harness.store.migrations import SCHEMA_VERSION
from harness.store.store import Store
from harness.store.tables import ORDER_BY, RUN_TABLES, column_types, insert_columns

FORMAT = "dspark-harness-run"


# What a gate baseline needs: per-request counts, confidences and metrics. Per-token times and engine
# steps are most of a run's rows and no gate test reads them, so `compact` exports leave them out.
TIMING_TABLES = ("request_tokens", "engine_steps")


def export_run(store: Store, run_id: str, path: str | Path, *, compact: bool = False) -> Path:
    """Write run `run_id` with its rows in every table to `path` (folders created); returns the path.
    `compact` leaves the raw timing tables (`TIMING_TABLES`) empty, for baselines kept in a repository."""
    try:
        if store.run(run_id) is None:
            raise StoreError(f"no run {run_id!r} in {store.path} to export")
        chunks = _export_chunks(store, run_id, compact)
    except duckdb.Error as exc:  # a block that fails its checksum
        raise damaged(store.path, exc) from exc
    head = f'{{"format": {_dumps(FORMAT)}, "schema_version": {SCHEMA_VERSION}, "run_id": {_dumps(run_id)},\n"tables": {{\n'
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + ",\n".join(chunks) + "\n}}\n", encoding="utf-8")
    return path


def _export_chunks(store: Store, run_id: str, compact: bool) -> list[str]:
    chunks = []
    for table in RUN_TABLES:
        if compact and table in TIMING_TABLES:
            types = column_types(store.con, table)
            columns = [name for name in types if name != "run_id"]
            chunks.append(f'{_dumps(table)}: {{"columns": {_dumps(columns)}, "rows": []}}')
            continue
        types = column_types(store.con, table)
        columns = [name for name in types if name != "run_id"] if table != "runs" else list(types)
        quoted = ", ".join(f'"{name}"' for name in columns)
        rows = store.con.execute(
            f"SELECT {quoted} FROM {table} WHERE run_id = ? ORDER BY {ORDER_BY[table]}", [run_id]
        ).fetchall()
        encoders = [_encoder(types[name]) for name in columns]
        lines = [_dumps([_redacted(encode(value)) for encode, value in zip(encoders, row)]) for row in rows]
        body = "[\n" + ",\n".join(lines) + "\n]" if lines else "[]"
        chunks.append(f'{_dumps(table)}: {{"columns": {_dumps(columns)}, "rows": {body}}}')
    return chunks


def import_run(store: Store, path: str | Path, label: str | None = None) -> str:
    """Load an exported run as kind 'imported' (label: `label`, else the run's own); returns its run id.

    The run keeps its id — ids are unique across machines — so importing a file whose run is already in
    the store changes nothing and returns that id. One transaction: all of the run or none of it."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8 or not JSON
        raise StoreError(f"cannot read exported run {path}: {_short(str(exc), 160)}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise StoreError(f"{path} is not an exported harness run (no \"format\": \"{FORMAT}\")")
    version = document.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoreError(f"{path}: unknown schema version {_short(version)} (an exported run has an integer "
                         f"schema_version from 1 to {SCHEMA_VERSION})")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, newer than this code knows ({SCHEMA_VERSION}): "
            "update dspark-harness to import it"
        )
    run_id, tables = _check_document(document, path)
    if store.run(run_id) is not None:
        return run_id
    try:
        _insert(store, path, run_id, tables, label)
    except (TypeError, ValueError, KeyError, IndexError) as exc:  # a value the column cannot hold
        raise StoreError(f"{path}: a value does not fit its column ({type(exc).__name__}: "
                         f"{_short(str(exc), 120)}); re-export the run") from exc
    return run_id


def _check_document(document: dict, path: Path) -> tuple[str, dict]:
    """(run id, tables) of an exported run whose shape is right, else a StoreError naming what is wrong."""
    run_id, tables = document.get("run_id"), document.get("tables")
    if not isinstance(run_id, str) or not run_id:
        raise StoreError(f"{path}: missing field \"run_id\" (a string): not a complete exported run")
    if not isinstance(tables, dict) or not isinstance(tables.get("runs"), dict):
        raise StoreError(f"{path}: missing field \"tables\" with a \"runs\" table: not a complete exported run")
    for table, body in tables.items():
        if table not in RUN_TABLES:
            raise StoreError(f"{path}: unknown table {_short(table)}; an exported run has {', '.join(RUN_TABLES)}")
        columns = body.get("columns") if isinstance(body, dict) else None
        rows = body.get("rows") if isinstance(body, dict) else None
        if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns) or not isinstance(rows, list):
            raise StoreError(f"{path}: table {table} needs \"columns\" (names) and \"rows\" (lists)")
        for n, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != len(columns):
                raise StoreError(f"{path}: table {table} row {n} is not a list of {len(columns)} values")
    runs = tables["runs"]
    if len(runs["rows"]) != 1 or "run_id" not in runs["columns"] or \
            runs["rows"][0][runs["columns"].index("run_id")] != run_id:
        raise StoreError(f"{path}: the runs table must hold exactly the one run {_short(run_id)}")
    return run_id, tables


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _insert(store: Store, path: Path, run_id: str, tables: dict, label: str | None) -> None:
    with store.transaction(f"importing run {run_id} from {path}"):
        for table in RUN_TABLES:
            if table not in tables:
                continue
            types = column_types(store.con, table)
            names = tables[table]["columns"]
            unknown = [name for name in names if name not in types]
            if unknown:
                raise StoreError(f"{path}: table {table} has columns this schema lacks: {unknown}")
            rows = tables[table]["rows"]
            columns = {name: [_decode(types[name], row[i]) for row in rows] for i, name in enumerate(names)}
            if table == "runs":
                columns["kind"] = ["imported"] * len(rows)
                if label is not None:
                    columns["label"] = [label] * len(rows)
                insert_columns(store.con, table, types, columns)
            else:
                insert_columns(store.con, table, types, columns, {"run_id": run_id})


def _redacted(value):
    """Text values with secrets masked (`contracts.redaction`): an export may be committed. Recording redacts
    already; this also covers runs recorded before it did."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(item) for item in value]
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    return value


def _dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _encoder(duckdb_type: str):
    if duckdb_type == "JSON":
        return lambda value: None if value is None else json.loads(value)
    if duckdb_type.startswith("TIMESTAMP"):
        return lambda value: None if value is None else value.isoformat()
    return lambda value: value


def _decode(duckdb_type: str, value):
    if value is None:
        return None
    if duckdb_type == "JSON":
        return canonical_json(value)
    if duckdb_type.startswith("TIMESTAMP"):
        return dt.datetime.fromisoformat(value)
    return value
