"""The result store: every run, cell and raw record in one append-only DuckDB file (`results/harness.duckdb`).

Why DuckDB: results are long tables (a row per token, per step, per metric) queried by aggregates, and
one embedded file with SQL gives history, ad-hoc questions (`harness query`) and the gate's inputs
without a server. The raw records are kept, not only the metrics, so any metric can be re-derived —
by `harness.metrics` on `Store.cell_result(...)`, or in SQL by the views (`views.py`, `VIEWS.md`).

    errors.py       StoreError: one actionable line per failure
    migrations.py   the schema as ordered migrations; SCHEMA_VERSION; migrate()
    views.py        the stable SQL views (v_runs, v_cells, v_metrics, v_acceptance, v_positions, …)
    connection.py   opening a file: lock / missing / newer-schema / damaged errors, migrate on a writable
                    open, the read-only sandbox (no file, network or extension beyond the store)
    tables.py       per-run and per-cell tables, export order, the column-wise bulk insert
    cell_rows.py    a CellResult as table columns and back
    store.py        Store (begin_run, record_cell, finish_run, cell_status, run, runs, latest_run, query,
                    cell, cell_result) and RunInfo
    exchange.py     export_run / import_run: one run as one deterministic JSON file (CI baselines)
    parquet.py      export_parquet / import_parquet: runs as parquet files per table, pooled from many machines
    benchmarks.py   ingest_benchmark_json: pytest-benchmark JSON as a 'benchmark' run
    query.py        read_only_query: what `harness query` runs (sandboxed: connection.py)
    condition.py    parse_condition: a user filter (`history --where`) parsed and re-rendered, never pasted

Tables (every row carries run_id; per-cell rows carry (cell_id, repeat); `*_s` are seconds on the run's
monotonic clock, `*_at` naive UTC timestamps, JSON columns canonical JSON text):

    runs(run_id PK, kind suite|benchmark|imported, suite_name, suite_path, suite_text, suite_hash,
         git_sha, git_branch, git_dirty, host_fingerprint, host JSON, packages JSON, argv JSON, repeats,
         started_at, finished_at, status running|finished|interrupted|failed, label)
    cells(run_id, cell_id, repeat PK, label, backend, target, drafter, method, num_drafts, task,
          temperature, concurrency, rate, policy, seed, params JSON, comparability_key, provenance JSON,
          status ok|failed, error, log, started_at, finished_at, window_start_s, window_end_s,
          sts_temperatures JSON, resources JSON, gpu_seconds, cpu_seconds,   (the last three: schema 2)
          round_slot, sts_offsets JSON)   (round_slot: schema 5; sts_offsets: schema 8, NULL before it and for
          a drafter calibrated by STS alone)
    superseded_cells(run_id, cell_id, repeat, error, log, started_at, finished_at, superseded_at)
    requests(run_id, cell_id, repeat, request_id, prompt_key, sample_index, turn, warmup, prompt_tokens,
             output_tokens, arrival_s, first_token_s, finish_s, finish_reason, error, num_drafts,
             output_ids INTEGER[], all_steps BOOLEAN)   (all_steps: schema 3; NULL before it, read as TRUE)
    request_steps(run_id, cell_id, repeat, request_id, step, num_drafts, num_verified, num_accepted)
    request_tokens(run_id, cell_id, repeat, request_id, token_index, t_s)
    step_confidences(run_id, cell_id, repeat, request_id, step, position (1-based), logit)
    engine_steps(run_id, cell_id, repeat, step, t_s, batch_size, num_verified, num_accepted, wall_s,
                 draft_length, num_prefilled)   (draft_length, num_prefilled: schema 6; NULL before it)
    calibration_bins(run_id, cell_id, repeat, kind, position, bin, lower, upper, count, confidence_sum,
                     outcome_sum)
    metrics(run_id, cell_id, repeat, metric, value (NULL: undefined), unit, n)
    benchmarks(run_id, name, fullname, bench_group, params JSON, min, max, mean, median, stddev, rounds,
               iterations, ops, extra JSON)
    schema_migrations(version, description, applied_at)
"""

from harness.store.benchmarks import ingest_benchmark_json
from harness.store.connection import DEFAULT_PATH
from harness.store.errors import StoreError
from harness.store.exchange import export_run, import_run
from harness.store.migrations import MIGRATIONS, SCHEMA_VERSION
from harness.store.parquet import export_parquet, import_parquet
from harness.store.query import read_only_query
from harness.store.store import RunInfo, Store, new_run_id
from harness.store.views import VIEWS

__all__ = [
    "DEFAULT_PATH", "MIGRATIONS", "SCHEMA_VERSION", "VIEWS", "RunInfo", "Store", "StoreError", "export_parquet",
    "export_run", "import_parquet", "import_run", "ingest_benchmark_json", "new_run_id", "read_only_query",
]
