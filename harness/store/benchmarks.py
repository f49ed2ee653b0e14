"""pytest-benchmark results into the store: micro-benchmarks (a draft step, the scheduler) get the same
history, stamps and SQL as suite runs.

Why ingest rather than use pytest-benchmark's own storage: one place to ask "did this get slower, on
this machine, since that commit". The input is the file `pytest --benchmark-json=FILE` writes:

    {"machine_info": {...}, "commit_info": {"id", "branch", "dirty", ...}, "datetime": ISO,
     "version": "5.x", "benchmarks": [{"group", "name", "fullname", "params", "param", "extra_info",
                                       "options", "stats": {"min", "max", "mean", "stddev", "rounds",
                                       "median", "iqr", "q1", "q3", "ops", "total", "iterations", "data"?, ...}}]}

Each benchmark becomes one `benchmarks` row: its stats in seconds per iteration (min … stddev), rounds,
iterations, ops (1/mean), and `extra` = {extra_info, options, the remaining stats} as JSON; the raw
timings (`data`, present with --benchmark-save-data) are left out. The run is kind 'benchmark',
status 'finished', started at the file's `datetime`; git fields the caller left empty come from its
`commit_info`, and its `machine_info` is kept in the run's host JSON.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

from harness.store.cell_rows import canonical_json
from harness.store.errors import StoreError
from harness.store.store import RunInfo, Store
from harness.store.tables import column_types, insert_columns

STAT_COLUMNS = ("min", "max", "mean", "median", "stddev", "rounds", "iterations", "ops")


def ingest_benchmark_json(store: Store, path: str | Path, info: RunInfo) -> str:
    """Load a pytest-benchmark JSON file as one finished 'benchmark' run; returns its run id."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read pytest-benchmark JSON {path}: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("benchmarks"), list):
        raise StoreError(f"{path} is not pytest-benchmark JSON (no \"benchmarks\" list; write it with --benchmark-json)")
    commit = document.get("commit_info") or {}
    info = dataclasses.replace(
        info,
        kind="benchmark",
        git_sha=info.git_sha or commit.get("id"),
        git_branch=info.git_branch or commit.get("branch"),
        git_dirty=info.git_dirty if info.git_dirty is not None else commit.get("dirty"),
        host={**info.host, "machine_info": document.get("machine_info")},
    )
    rows = [_row(bench, path) for bench in document["benchmarks"]]
    started = _when(document.get("datetime"))
    run_id = store.begin_run(info, started_at=started)
    if rows:
        columns = {name: [row[name] for row in rows] for name in rows[0]}
        with store.transaction(f"ingesting {path}"):
            insert_columns(store.con, "benchmarks", column_types(store.con, "benchmarks"), columns, {"run_id": run_id})
    store.finish_run(run_id, "finished")
    return run_id


def _row(bench: dict, path: Path) -> dict:
    stats = bench.get("stats")
    if not isinstance(stats, dict) or "name" not in bench:
        raise StoreError(f"{path}: a benchmark without name or stats ({str(bench)[:80]})")
    rest = {k: v for k, v in stats.items() if k not in STAT_COLUMNS and k != "data"}
    extra = {"extra_info": bench.get("extra_info") or {}, "options": bench.get("options") or {}, "stats": rest}
    return {
        "name": bench["name"],
        "fullname": bench.get("fullname"),
        "bench_group": bench.get("group"),
        "params": canonical_json(bench["params"]) if bench.get("params") is not None else None,
        **{column: stats.get(column) for column in STAT_COLUMNS},
        "extra": canonical_json(extra),
    }


def _when(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None
