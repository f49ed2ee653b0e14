"""Store tables for the gate's tests, and synthetic runs to put in them.

`create_tables` is the one place that knows the schema: plain CREATE TABLEs holding just the columns the
gate reads (harness/gate/data.py). When harness.store lands, swap its body for the store's own schema
(migrations) and every gate test runs against the real tables.

Synthetic runs are seeded: each speculative cell has prompts of varying difficulty q (per-draft
acceptance probability); a step verifies γ drafts and accepts a geometric run of them; confidence logits
are logit(q) plus noise and an overconfidence `logit_bias`, so the ECE is neither 0 nor 1.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field, replace

import duckdb
import numpy as np

TABLES = [
    """CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY, kind VARCHAR, status VARCHAR, label VARCHAR, suite_name VARCHAR,
        git_sha VARCHAR, host_fingerprint VARCHAR, host JSON, packages JSON, started_at TIMESTAMP, repeats INTEGER
    )""",
    """CREATE TABLE cells (
        run_id VARCHAR, cell_id VARCHAR, "repeat" INTEGER, label VARCHAR, backend VARCHAR, target VARCHAR,
        drafter VARCHAR, method VARCHAR, num_drafts INTEGER, task VARCHAR, temperature DOUBLE,
        concurrency INTEGER, rate DOUBLE, policy VARCHAR, seed BIGINT, params JSON, comparability_key VARCHAR,
        provenance JSON, status VARCHAR, error VARCHAR, window_start_s DOUBLE, window_end_s DOUBLE,
        sts_temperatures JSON, started_at TIMESTAMP, finished_at TIMESTAMP, sts_offsets JSON
    )""",
    """CREATE TABLE requests (
        run_id VARCHAR, cell_id VARCHAR, "repeat" INTEGER, request_id VARCHAR, prompt_key VARCHAR,
        sample_index INTEGER, error VARCHAR, finish_s DOUBLE
    )""",
    """CREATE TABLE request_steps (
        run_id VARCHAR, cell_id VARCHAR, "repeat" INTEGER, request_id VARCHAR, step INTEGER,
        num_drafts INTEGER, num_verified INTEGER, num_accepted INTEGER
    )""",
    """CREATE TABLE step_confidences (
        run_id VARCHAR, cell_id VARCHAR, "repeat" INTEGER, request_id VARCHAR, step INTEGER, position INTEGER,
        logit DOUBLE
    )""",
    """CREATE TABLE metrics (
        run_id VARCHAR, cell_id VARCHAR, "repeat" INTEGER, metric VARCHAR, value DOUBLE, unit VARCHAR, n BIGINT
    )""",
]
# The columns the synthetic rows fill, by table: inserts and copies name them, so the store's wider
# tables take the same rows.
COLUMNS = {
    "runs": ("run_id", "kind", "status", "label", "suite_name", "git_sha", "host_fingerprint", "host", "packages",
             "started_at", "repeats"),
    "cells": ("run_id", "cell_id", "repeat", "label", "backend", "target", "drafter", "method", "num_drafts", "task",
              "temperature", "concurrency", "rate", "policy", "seed", "params", "comparability_key", "provenance",
              "status", "error", "window_start_s", "window_end_s", "sts_temperatures", "started_at", "finished_at"),
    "requests": ("run_id", "cell_id", "repeat", "request_id", "prompt_key", "sample_index", "error", "finish_s"),
    "request_steps": ("run_id", "cell_id", "repeat", "request_id", "step", "num_drafts", "num_verified",
                      "num_accepted"),
    "step_confidences": ("run_id", "cell_id", "repeat", "request_id", "step", "position", "logit"),
    "metrics": ("run_id", "cell_id", "repeat", "metric", "value", "unit", "n"),
}

# The store's speedup view, as the gate expects it (for the test that reads the view instead of computing).
V_SPEEDUP = """
CREATE VIEW v_speedup AS
WITH t AS (
    SELECT c.run_id, c.cell_id, c."repeat", c.backend, c.target, c.task, c.temperature, c.concurrency, c.rate,
           c.seed, c.method, m.value AS throughput
    FROM cells c JOIN metrics m USING (run_id, cell_id, "repeat") WHERE m.metric = 'throughput'
)
SELECT s.run_id, s."repeat", s.cell_id, s.throughput, p.throughput AS plain_throughput,
       s.throughput / p.throughput AS speedup, p.throughput AS plain_open_throughput,
       NULL::DOUBLE AS plain_close_throughput
FROM t s JOIN t p ON p.run_id = s.run_id AND p."repeat" = s."repeat" AND p.method = 'none'
    AND p.backend = s.backend AND p.target = s.target AND p.task = s.task
    AND p.temperature IS NOT DISTINCT FROM s.temperature AND p.concurrency IS NOT DISTINCT FROM s.concurrency
    AND p.rate IS NOT DISTINCT FROM s.rate AND p.seed = s.seed
"""


def insert_rows(conn: duckdb.DuckDBPyConnection, table: str, rows: list[tuple]) -> None:
    """Many rows in one statement (DuckDB's executemany runs one statement per row: far too slow here)."""
    if not rows:
        return
    columns = list(zip(*rows))
    names = ", ".join(f'"{c}"' for c in COLUMNS[table])
    select = ", ".join(f"unnest($c{i})" for i in range(len(columns)))
    conn.execute(f"INSERT INTO {table} ({names}) SELECT {select}",
                 {f"c{i}": list(col) for i, col in enumerate(columns)})


def create_tables(conn: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    for ddl in TABLES:
        conn.execute(ddl)
    return conn


def new_store() -> duckdb.DuckDBPyConnection:
    return create_tables(duckdb.connect(":memory:"))


@dataclass(frozen=True)
class SynthCell:
    drafter: str = "dspark"
    method: str = "dspark"
    num_drafts: int = 7
    task: str = "gsm8k"
    concurrency: int = 4
    num_prompts: int = 50
    turns: int = 1
    steps: int = 20  # verify steps per request
    quality: tuple[float, float] = (0.55, 0.9)  # range of per-prompt acceptance probabilities
    logit_bias: float = 0.8  # overconfidence of the confidence head
    sts: tuple[float, ...] | None = None  # STS temperatures; default: 1.6 at every position
    throughput: float = 100.0  # tokens/s of repeat 0; later repeats vary a little

    @property
    def label(self) -> str:
        gamma = "" if self.method == "none" else f" γ{self.num_drafts}"
        return f"inhouse/tiny/{self.drafter}{gamma}/{self.task} T0/c{self.concurrency}"

    @property
    def cell_id(self) -> str:
        return hashlib.sha256(self.label.encode()).hexdigest()[:12]

    def params(self) -> dict:
        return {"drafter": {"name": self.drafter, "method": self.method}, "num_drafts": self.num_drafts,
                "task": {"name": self.task, "max_new_tokens": 256}, "concurrency": self.concurrency}


PLAIN = SynthCell(drafter="none", method="none", num_drafts=0)
DSPARK = SynthCell()


@dataclass
class SynthRun:
    run_id: str
    cells: list[SynthCell] = field(default_factory=lambda: [PLAIN, DSPARK])
    repeats: int = 1
    status: str = "finished"
    host_fingerprint: str = "host-a"
    packages: dict = field(default_factory=lambda: {"torch": "2.13.0", "transformers": "4.56.0", "numpy": "2.4"})
    provenance: dict = field(default_factory=lambda: {"target_hash": "t1", "draft_hash": "d1", "dataset_hash": "g1",
                                                      "backend_version": "inhouse-1"})
    seed: int = 0
    sandwich: bool = False  # plain cells measured twice a round: their closing pass is repeat `repeats` + r


def comparability_key(run: SynthRun, cell: SynthCell) -> str:
    text = json.dumps([run.host_fingerprint, {k: run.packages.get(k) for k in ("torch", "transformers")},
                       run.provenance, cell.params()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _logit(p):
    return np.log(p / (1 - p))


def add_run(conn: duckdb.DuckDBPyConnection, run: SynthRun) -> SynthRun:
    host = json.dumps({"cpu": "test-cpu", "gpu": None})
    insert_rows(conn, "runs", [(run.run_id, "suite", run.status, None, "test", "abc123", run.host_fingerprint, host,
                                json.dumps(run.packages), dt.datetime(2025, 1, 1), run.repeats)])
    slot = 0  # cells one minute apart in the runner's order: per round, plain, the others, plain again
    for rep in range(run.repeats):
        plain = [c for c in run.cells if c.method == "none"]
        closing = plain if run.sandwich and len(plain) < len(run.cells) else []
        order = plain + [c for c in run.cells if c.method != "none"]
        for cell, r in [(c, rep) for c in order] + [(c, run.repeats + rep) for c in closing]:
            _add_cell(conn, run, cell, r, dt.datetime(2025, 1, 1) + dt.timedelta(minutes=slot))
            slot += 1
    return run


def _add_cell(conn, run: SynthRun, cell: SynthCell, rep: int, started: dt.datetime) -> None:
    rng = np.random.default_rng([run.seed, int(cell.cell_id, 16) % 2**32, rep])
    start, end = 10.0, 110.0
    sts = None if cell.method == "none" else list(cell.sts or [1.6] * cell.num_drafts)
    insert_rows(conn, "cells", [(
        run.run_id, cell.cell_id, rep, cell.label, "inhouse", "tiny", cell.drafter, cell.method, cell.num_drafts,
        cell.task, 0.0, cell.concurrency, None, "full", 0, json.dumps(cell.params()), comparability_key(run, cell),
        json.dumps(run.provenance), "ok", None, start, end, None if sts is None else json.dumps(sts),
        started, started + dt.timedelta(seconds=50),
    )])
    requests, steps, confs = [], [], []
    quality = rng.uniform(*cell.quality, size=cell.num_prompts)
    for p in range(cell.num_prompts):
        for turn in range(cell.turns):
            rid = f"r{p}-{turn}"
            finish = start + (end - start) * (p * cell.turns + turn + 0.5) / (cell.num_prompts * cell.turns)
            requests.append((run.run_id, cell.cell_id, rep, rid, f"{cell.task}:{p}:{turn}", p, None, finish))
            for s in range(cell.steps):
                if cell.method == "none":
                    steps.append((run.run_id, cell.cell_id, rep, rid, s, 0, 0, 0))
                    continue
                q = quality[p]
                runs = rng.random(cell.num_drafts) < q
                accepted = int(np.argmin(runs)) if not runs.all() else cell.num_drafts
                steps.append((run.run_id, cell.cell_id, rep, rid, s, cell.num_drafts, cell.num_drafts, accepted))
                logits = _logit(q) + cell.logit_bias + rng.normal(0, 0.7, size=cell.num_drafts)
                confs += [(run.run_id, cell.cell_id, rep, rid, s, j + 1, float(x)) for j, x in enumerate(logits)]
    # Outside the window (warm-up) and failed: neither may count.
    requests.append((run.run_id, cell.cell_id, rep, "warm", f"{cell.task}:0:0", 0, None, 5.0))
    steps.append((run.run_id, cell.cell_id, rep, "warm", 0, cell.num_drafts, cell.num_drafts, 0))
    insert_rows(conn, "requests", requests)
    insert_rows(conn, "request_steps", steps)
    insert_rows(conn, "step_confidences", confs)
    throughput = cell.throughput * (1 + 0.01 * rep) * (1.0 if cell.method == "none" else 2.5)
    tau = 1 + np.mean([s[-1] for s in steps[:-1]]) if cell.method != "none" else 1.0
    insert_rows(
        conn, "metrics",
        [(run.run_id, cell.cell_id, rep, "throughput", throughput, "tokens/s", len(requests) - 1),
         (run.run_id, cell.cell_id, rep, "acceptance_length", float(tau), "tokens/step", len(steps) - 1),
         (run.run_id, cell.cell_id, rep, "window_s", end - start, "s", len(requests) - 1)],
    )


def copy_run(src: duckdb.DuckDBPyConnection, src_run: str, dst_run: str, dst: duckdb.DuckDBPyConnection | None = None):
    """Every row of `src_run` again under `dst_run` (in `dst`, default the same connection)."""
    for table, columns in COLUMNS.items():
        names = ", ".join(f'"{c}"' for c in columns)
        select = f"SELECT $dst AS run_id, {names[names.index(',') + 2:]} FROM {table} WHERE run_id = $src"
        params = {"dst": dst_run, "src": src_run}
        if dst is None:
            src.execute(f"INSERT INTO {table} ({names}) {select}", params)
        else:
            insert_rows(dst, table, src.execute(select, params).fetchall())
    return src if dst is None else dst


def lower_acceptance(conn, run_id: str, cell: SynthCell, every: int = 3) -> None:
    """Doctor a regression: one fewer accepted draft on every `every`-th step of the cell."""
    conn.execute(
        "UPDATE request_steps SET num_accepted = num_accepted - 1 "
        "WHERE run_id = ? AND cell_id = ? AND num_accepted > 0 AND step % ? = 0",
        [run_id, cell.cell_id, every],
    )


def with_cells(run: SynthRun, *cells: SynthCell) -> SynthRun:
    return replace(run, cells=list(cells))
