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

from harness.redaction import redact
from harness.store.cell_rows import canonical_json
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
    if store.run(run_id) is None:
        raise StoreError(f"no run {run_id!r} in {store.path} to export")
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
    head = f'{{"format": {_dumps(FORMAT)}, "schema_version": {SCHEMA_VERSION}, "run_id": {_dumps(run_id)},\n"tables": {{\n'
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + ",\n".join(chunks) + "\n}}\n", encoding="utf-8")
    return path


def import_run(store: Store, path: str | Path, label: str | None = None) -> str:
    """Load an exported run as kind 'imported' (label: `label`, else the run's own); returns its run id.

    The run keeps its id — ids are unique across machines — so importing a file whose run is already in
    the store changes nothing and returns that id. One transaction: all of the run or none of it."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read exported run {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise StoreError(f"{path} is not an exported harness run (no \"format\": \"{FORMAT}\")")
    version = document.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, newer than this code knows ({SCHEMA_VERSION}): "
            "update dspark-harness to import it"
        )
    run_id = document["run_id"]
    if store.run(run_id) is not None:
        return run_id
    tables = document["tables"]
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
    return run_id


def _redacted(value):
    """Text values with secrets masked (`harness.redaction`): an export may be committed. Recording redacts
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
