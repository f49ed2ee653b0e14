"""`Store`: the append-only DuckDB file that keeps every run, cell and raw record, and `RunInfo`, the
stamp each run carries.

Why append-only: a regression gate is only as good as its history. A run's rows are written once and
never changed; the only updates are a run's status (running → finished | interrupted | failed) and a
failed cell replaced by its retry when an interrupted run is resumed — the failed attempt moves to
`superseded_cells`, so nothing that was measured disappears without a trace. A cell that succeeded is
never overwritten.

Why one transaction per cell: an interrupted run (Ctrl-C, a dead GPU, a killed CI job) must leave
whole cells or none, so resuming can trust `cell_status` and re-run exactly what is missing or failed.

Stamps: a run records what it ran (suite text and hash, argv), where (host JSON and a fingerprint of
its comparability-relevant part), and with what (git sha/branch/dirty, package versions); each cell
records its parameters, the provenance its backend reported (model, draft and dataset hashes) and the
comparability key over all of that (`harness.provenance`), which is what the gate pairs cells on.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import duckdb

from contracts.cells import Cell, CellResult
from harness.store.cell_rows import build_result, canonical_json, result_columns
from harness.store.connection import DEFAULT_PATH, connect, damaged, sandbox_refusal
from harness.store.errors import StoreError, one_line
from harness.store.tables import CELL_TABLES, column_types, insert_columns

RUN_KINDS = ("suite", "benchmark", "imported")
RUN_STATUSES = ("running", "finished", "interrupted", "failed")
JSON_RUN_COLUMNS = ("host", "packages", "argv")


@dataclass
class RunInfo:
    """Everything a run is stamped with when it begins (harness.provenance provides the pieces)."""

    suite_name: str | None
    suite_path: str | None
    suite_text: str | None  # the resolved suite (includes expanded), as run
    suite_hash: str | None
    git_sha: str | None
    git_branch: str | None
    git_dirty: bool | None
    host_fingerprint: str | None
    host: dict = field(default_factory=dict)
    packages: dict = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    repeats: int = 1
    kind: str = "suite"  # suite | benchmark | imported
    label: str | None = None  # e.g. the name of an imported baseline
    metadata: dict = field(default_factory=dict)  # `harness run --metadata KEY=VALUE` (schema 3)


def new_run_id(now: dt.datetime | None = None) -> str:
    """'r' + UTC time to the second + 6 random hex: sorts by start time, unique across machines."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"r{now.astimezone(dt.timezone.utc):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


def utc(value: dt.datetime | float | None) -> dt.datetime | None:
    """A naive UTC datetime (what the TIMESTAMP columns hold) from an aware or naive-UTC datetime or
    from epoch seconds (`time.time()`)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc).replace(tzinfo=None)
    if value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Store:
    """A result store file (`results/harness.duckdb` by default). Open with `Store.open(...)`; use as a
    context manager or call `close()`. Writable stores are single-process (DuckDB's file lock)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str, read_only: bool):
        self.con = con
        self.path = path
        self.read_only = read_only
        self._types: dict[str, dict[str, str]] = {}

    @classmethod
    def open(cls, path: str | Path = DEFAULT_PATH, *, read_only: bool = False, sandbox: bool | None = None) -> Store:
        """Open (writable: create and migrate) the store at `path`; `":memory:"` is a throwaway store.
        Read-only stores are sandboxed (harness.store.connection) unless `sandbox=False` (export only)."""
        return cls(connect(path, read_only=read_only, sandbox=sandbox), str(path), read_only)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- writing -------------------------------------------------------------------------------

    def begin_run(self, info: RunInfo, *, run_id: str | None = None, started_at=None) -> str:
        """Insert a run with status 'running'; returns its id (new unless given, e.g. by an import)."""
        if info.kind not in RUN_KINDS:
            raise ValueError(f"run kind must be one of {RUN_KINDS}, got {info.kind!r}")
        run_id = run_id or new_run_id()
        row = {
            "run_id": run_id, "kind": info.kind, "suite_name": info.suite_name, "suite_path": info.suite_path,
            "suite_text": info.suite_text, "suite_hash": info.suite_hash, "git_sha": info.git_sha,
            "git_branch": info.git_branch, "git_dirty": info.git_dirty, "host_fingerprint": info.host_fingerprint,
            "host": canonical_json(info.host), "packages": canonical_json(info.packages),
            "argv": canonical_json(list(info.argv)), "repeats": info.repeats,
            "started_at": utc(started_at) or _now(), "finished_at": None, "status": "running", "label": info.label,
        }
        if info.metadata:
            row["metadata"] = canonical_json(info.metadata)
        with self.transaction(f"beginning run {run_id}"):
            self._insert_rows("runs", [row])
        return run_id

    def finish_run(self, run_id: str, status: str = "finished") -> None:
        """Close a run: status finished | interrupted | failed, finished_at now."""
        if status not in RUN_STATUSES[1:]:
            raise ValueError(f"a run finishes as one of {RUN_STATUSES[1:]}, got {status!r}")
        self.set_run_status(run_id, status)

    def set_run_status(self, run_id: str, status: str) -> None:
        """Set a run's status; 'running' (a resumed run) clears finished_at, any other sets it to now."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, got {status!r}")
        self._require_run(run_id)
        finished_at = None if status == "running" else _now()
        with self.transaction(f"updating run {run_id}"):
            self.con.execute("UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?", [status, finished_at, run_id])

    def record_cell(
        self,
        run_id: str,
        cell: Cell,
        repeat: int,
        *,
        result: CellResult | None,
        error: str | None,
        started_at,
        finished_at,
        comparability_key: str,
        log: str = "",
        resources: dict | None = None,
        gpu_seconds: float | None = None,
        cpu_seconds: float | None = None,
        round_slot: int | None = None,
    ) -> None:
        """Write one cell and all its rows in one transaction: status 'ok' when `error` is None (then a
        result is required), else 'failed' with whatever partial `result` there is. A failed cell may be
        recorded again (the retry of a resumed run); its earlier row moves to `superseded_cells`. A cell
        recorded 'ok' is final: recording it again raises StoreError. `resources` (what the executor
        reserved) and `gpu_seconds`/`cpu_seconds` (wall time × reserved GPUs/CPUs) are the cost columns;
        `round_slot`: the cell's position in its round (the runner's interleaved order)."""
        if error is None and result is None:
            raise ValueError("record_cell needs a result for a cell without an error")
        tables = result_columns(result) if result is not None else {}
        axes = cell.axes()
        row = {
            "run_id": run_id, "cell_id": cell.cell_id, "repeat": repeat, "label": cell.label(), **axes,
            "params": canonical_json(cell.params()), "comparability_key": comparability_key,
            "provenance": canonical_json(result.provenance) if result is not None else None,
            "status": "ok" if error is None else "failed", "error": error,
            "log": log or (result.log if result is not None else ""),
            "started_at": utc(started_at), "finished_at": utc(finished_at),
            "window_start_s": result.window.start_s if result is not None else None,
            "window_end_s": result.window.end_s if result is not None else None,
            "sts_temperatures": (
                canonical_json(list(result.sts_temperatures))
                if result is not None and result.sts_temperatures is not None else None
            ),
            "sts_offsets": (
                canonical_json(list(result.sts_offsets))
                if result is not None and result.sts_offsets is not None else None
            ),
            "resources": canonical_json(resources) if resources is not None else None,
            "gpu_seconds": gpu_seconds, "cpu_seconds": cpu_seconds, "round_slot": round_slot,
        }
        key = {"run_id": run_id, "cell_id": cell.cell_id, "repeat": repeat}
        where = f"cell {cell.cell_id} repeat {repeat} of run {run_id}"
        self._require_run(run_id)
        with self.transaction(f"recording {where}"):
            previous = self.con.execute(
                "SELECT status, error, log, started_at, finished_at FROM cells "
                "WHERE run_id = ? AND cell_id = ? AND repeat = ?", list(key.values()),
            ).fetchone()
            if previous is not None:
                if previous[0] == "ok":
                    raise StoreError(f"{where} is already recorded ok; a store never overwrites a result")
                self.con.execute(
                    "INSERT INTO superseded_cells VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [*key.values(), *previous[1:], _now()],
                )
                for table in CELL_TABLES:
                    self.con.execute(
                        f"DELETE FROM {table} WHERE run_id = ? AND cell_id = ? AND repeat = ?", list(key.values())
                    )
            self._insert_rows("cells", [row])
            for table, columns in tables.items():
                insert_columns(self.con, table, self._column_types(table), columns, key)

    # ---- reading -------------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] | dict | None = None) -> tuple[list[str], list[tuple]]:
        """(column names, rows) of any SQL over the tables and views; errors become one-line StoreErrors."""
        try:
            cursor = self.con.execute(sql, params) if params is not None else self.con.execute(sql)
            if cursor is None:  # DuckDB parsed no statement: only whitespace, `;` or comments
                raise StoreError("the query has no statement (only comments or whitespace): give the SQL to run, "
                                 "e.g. \"SELECT * FROM v_runs\"")
            if cursor.description is None:
                return [], []
            return [d[0] for d in cursor.description], cursor.fetchall()
        except duckdb.Error as exc:
            message = one_line(exc)
            if self.read_only and "read-only mode" in message:
                raise StoreError(
                    f"the query tried to write; {self.path} is open read-only (harness query never changes the store)"
                ) from exc
            refused = sandbox_refusal(message)
            if refused:
                raise StoreError(refused) from exc
            failure = damaged(self.path, exc)
            if "is damaged" in str(failure):
                raise failure from exc
            raise StoreError(f"query failed: {message}") from exc

    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict]:
        cursor = self.con.execute(sql, list(params))
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def run(self, run_id: str) -> dict | None:
        """The `runs` row as a dict (host, packages, argv decoded), or None."""
        rows = self._dicts("SELECT * FROM runs WHERE run_id = ?", [run_id])
        if not rows:
            return None
        row = rows[0]
        for name in JSON_RUN_COLUMNS:
            row[name] = json.loads(row[name]) if row[name] is not None else None
        return row

    def runs(
        self, *, suite_name: str | None = None, branch: str | None = None, kind: str | None = None,
        status: str | None = None, limit: int | None = None,
    ) -> list[dict]:
        """`v_runs` rows, newest first, filtered by the arguments given."""
        clauses, params = self._run_filters(suite_name=suite_name, branch=branch, kind=kind, status=status)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM v_runs {where} ORDER BY started_at DESC, run_id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self._dicts(sql, params)

    def latest_run(
        self,
        *,
        suite_name: str | None = None,
        branch: str | None = None,
        before: str | dt.datetime | None = None,
        exclude: str | Iterable[str] | None = None,
        kind: str | None = None,
        status: str | None = "finished",
    ) -> str | None:
        """The newest run matching every filter given, or None. `before`: a run id (runs that started
        before it) or a datetime; `exclude`: run id(s) to skip; `status`: 'finished' by default, None
        for any (e.g. the interrupted run to resume)."""
        clauses, params = self._run_filters(suite_name=suite_name, branch=branch, kind=kind, status=status)
        if before is not None:
            if isinstance(before, str):
                anchor = self.run(before)
                if anchor is None:
                    raise StoreError(f"no run {before!r} in {self.path}")
                before_time: dt.datetime = anchor["started_at"]
            else:
                before_time = before
            clauses.append("started_at < ?")
            params.append(utc(before_time))
        excluded = [exclude] if isinstance(exclude, str) else list(exclude or ())
        if excluded:
            clauses.append(f"run_id NOT IN ({', '.join('?' * len(excluded))})")
            params.extend(excluded)
        sql = "SELECT run_id FROM runs"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        row = self.con.execute(sql + " ORDER BY started_at DESC, run_id DESC LIMIT 1", params).fetchone()
        return row[0] if row else None

    @staticmethod
    def _run_filters(**filters) -> tuple[list[str], list]:
        columns = {"suite_name": "suite_name", "branch": "git_branch", "kind": "kind", "status": "status"}
        clauses, params = [], []
        for name, value in filters.items():
            if value is not None:
                clauses.append(f"{columns[name]} = ?")
                params.append(value)
        return clauses, params

    def cell_status(self, run_id: str) -> dict[tuple[str, int], str]:
        """{(cell_id, repeat): 'ok' | 'failed'} of the cells recorded in a run (resume skips the ok ones)."""
        rows = self.con.execute("SELECT cell_id, repeat, status FROM cells WHERE run_id = ?", [run_id]).fetchall()
        return {(cell_id, repeat): status for cell_id, repeat, status in rows}

    def cell(self, run_id: str, cell_id: str, repeat: int) -> dict | None:
        """The `cells` row as a dict (params, provenance, sts_temperatures, sts_offsets decoded), or None."""
        rows = self._dicts("SELECT * FROM cells WHERE run_id = ? AND cell_id = ? AND repeat = ?", [run_id, cell_id, repeat])
        if not rows:
            return None
        row = rows[0]
        for name in ("params", "provenance", "sts_temperatures", "sts_offsets"):
            row[name] = json.loads(row[name]) if row[name] is not None else None
        return row

    def cell_result(self, run_id: str, cell_id: str, repeat: int) -> CellResult | None:
        """The `CellResult` recorded for a cell (records, steps, window, metrics, bins, provenance), as the
        backend reported it; None if the cell is absent or failed without a result."""
        key = [run_id, cell_id, repeat]
        cells = self._dicts("SELECT * FROM cells WHERE run_id = ? AND cell_id = ? AND repeat = ?", key)
        if not cells:
            return None
        tables = {
            table: self._dicts(f"SELECT * FROM {table} WHERE run_id = ? AND cell_id = ? AND repeat = ? ORDER BY rowid", key)
            for table in CELL_TABLES[1:]
        }
        return build_result(cells[0], tables)

    # ---- plumbing ------------------------------------------------------------------------------

    def _require_run(self, run_id: str) -> None:
        if self.con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone() is None:
            raise StoreError(f"no run {run_id!r} in {self.path}")

    def _column_types(self, table: str) -> dict[str, str]:
        if table not in self._types:
            self._types[table] = column_types(self.con, table)
        return self._types[table]

    def _insert_rows(self, table: str, rows: list[dict]) -> None:
        if rows:
            columns = {name: [row[name] for row in rows] for name in rows[0]}
            insert_columns(self.con, table, self._column_types(table), columns)

    def transaction(self, what: str) -> _Transaction:
        """`with store.transaction("doing x"):` — all or nothing; `what` names the work in errors."""
        if self.read_only:
            raise StoreError(f"{self.path} is open read-only; {what} needs a writable store")
        return _Transaction(self.con, what)


class _Transaction:
    """BEGIN … COMMIT, ROLLBACK on any exception; DuckDB errors re-raised as one-line StoreErrors."""

    def __init__(self, con: duckdb.DuckDBPyConnection, what: str):
        self.con, self.what = con, what

    def __enter__(self) -> None:
        self.con.execute("BEGIN TRANSACTION")

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        if exc_type is None:
            try:
                self.con.execute("COMMIT")
                return False
            except duckdb.Error as commit_error:
                exc = commit_error
        self.con.execute("ROLLBACK")
        if isinstance(exc, duckdb.Error):
            raise StoreError(f"{self.what} failed: {one_line(exc)}") from exc
        return False
