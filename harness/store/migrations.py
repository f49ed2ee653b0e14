"""The store's schema as an ordered list of migrations, and the one function that applies them.

Why migrations rather than `CREATE TABLE IF NOT EXISTS`: result stores outlive the code that wrote
them (a laptop's `results/harness.duckdb`, a CI baseline in the repo), and a silent mismatch between a
table and the code reading it gives wrong numbers, not errors. So the schema has a version — the
highest row of `schema_migrations` — and code opening a store:

- with the same version, uses it;
- with an older one, writable: applies the missing migrations, in order, in one transaction (all or
  nothing), then refreshes the views (`views.py`);
- with a newer one: refuses, because it cannot know what the new columns mean.

A migration is frozen once released: to change the schema, append `(next version, description,
statements)`; never edit an earlier entry. Views are derived objects, recreated from `views.py`
whenever a migration runs, so a changed view is also a new (possibly statement-less) migration: that
bumps the version, and every store opened writable picks the view up.

Conventions of the tables (columns are documented in `harness/store/__init__.py`): every row carries
`run_id`; per-cell rows carry `(cell_id, repeat)`; times of day are naive UTC `TIMESTAMP`s; times
inside a run (`*_s`) are seconds on the run's monotonic clock; JSON columns hold canonical JSON text
(sorted keys, no spaces), so equal values are equal strings. Raw-row tables have no primary key: an
ART index costs more than it checks on ~20k token rows a cell, and the store writes each cell once, in
one transaction, after checking its key.
"""

from __future__ import annotations

import datetime as dt

import duckdb

from harness.store.errors import StoreError, one_line, one_row

V1_TABLES = [
    """CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        kind VARCHAR NOT NULL CHECK (kind IN ('suite', 'benchmark', 'imported')),
        suite_name VARCHAR, suite_path VARCHAR, suite_text VARCHAR, suite_hash VARCHAR,
        git_sha VARCHAR, git_branch VARCHAR, git_dirty BOOLEAN,
        host_fingerprint VARCHAR, host JSON, packages JSON, argv JSON,
        repeats INTEGER,
        started_at TIMESTAMP NOT NULL, finished_at TIMESTAMP,
        status VARCHAR NOT NULL CHECK (status IN ('running', 'finished', 'interrupted', 'failed')),
        label VARCHAR
    )""",
    """CREATE TABLE cells (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        label VARCHAR, backend VARCHAR, target VARCHAR, drafter VARCHAR, method VARCHAR, num_drafts INTEGER,
        task VARCHAR, temperature DOUBLE, concurrency INTEGER, rate DOUBLE, policy VARCHAR, seed BIGINT,
        params JSON, comparability_key VARCHAR, provenance JSON,
        status VARCHAR NOT NULL CHECK (status IN ('ok', 'failed')), error VARCHAR, log VARCHAR,
        started_at TIMESTAMP, finished_at TIMESTAMP,
        window_start_s DOUBLE, window_end_s DOUBLE, sts_temperatures JSON,
        PRIMARY KEY (run_id, cell_id, repeat)
    )""",
    # A failed cell that a resumed run retried: its row before the retry replaced it, kept for the record.
    """CREATE TABLE superseded_cells (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        error VARCHAR, log VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP, superseded_at TIMESTAMP NOT NULL
    )""",
    """CREATE TABLE requests (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        request_id VARCHAR NOT NULL, prompt_key VARCHAR, sample_index INTEGER, turn INTEGER, warmup BOOLEAN,
        prompt_tokens INTEGER, output_tokens INTEGER,
        arrival_s DOUBLE, first_token_s DOUBLE, finish_s DOUBLE,
        finish_reason VARCHAR, error VARCHAR, num_drafts INTEGER, output_ids INTEGER[]
    )""",
    """CREATE TABLE request_steps (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        request_id VARCHAR NOT NULL, step INTEGER NOT NULL,
        num_drafts INTEGER, num_verified INTEGER, num_accepted INTEGER
    )""",
    """CREATE TABLE request_tokens (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        request_id VARCHAR NOT NULL, token_index INTEGER NOT NULL, t_s DOUBLE
    )""",
    """CREATE TABLE step_confidences (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        request_id VARCHAR NOT NULL, step INTEGER NOT NULL, position INTEGER NOT NULL, logit DOUBLE
    )""",
    """CREATE TABLE engine_steps (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        step INTEGER NOT NULL, t_s DOUBLE, batch_size INTEGER, num_verified INTEGER, num_accepted INTEGER,
        wall_s DOUBLE
    )""",
    """CREATE TABLE calibration_bins (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        kind VARCHAR NOT NULL, position INTEGER NOT NULL, bin INTEGER NOT NULL,
        lower DOUBLE, upper DOUBLE, count BIGINT, confidence_sum DOUBLE, outcome_sum DOUBLE
    )""",
    """CREATE TABLE metrics (
        run_id VARCHAR NOT NULL, cell_id VARCHAR NOT NULL, repeat INTEGER NOT NULL,
        metric VARCHAR NOT NULL, value DOUBLE, unit VARCHAR, n BIGINT
    )""",
    """CREATE TABLE benchmarks (
        run_id VARCHAR NOT NULL, name VARCHAR NOT NULL, fullname VARCHAR, bench_group VARCHAR, params JSON,
        "min" DOUBLE, "max" DOUBLE, mean DOUBLE, median DOUBLE, stddev DOUBLE,
        rounds BIGINT, iterations BIGINT, ops DOUBLE, extra JSON
    )""",
]

# (version, description, statements): append only, never edit a released entry.
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "runs, cells, raw-record, metric and benchmark tables; the views of views.py", V1_TABLES),
    (2, "cost accounting: cells.resources, gpu_seconds, cpu_seconds; view v_costs", [
        # what the executor reserved for the cell ({"num_cpus": 1.0, "num_gpus": 0.0, …}); NULL before v2
        "ALTER TABLE cells ADD COLUMN resources JSON",
        "ALTER TABLE cells ADD COLUMN gpu_seconds DOUBLE",  # the cell's wall time × reserved GPUs
        "ALTER TABLE cells ADD COLUMN cpu_seconds DOUBLE",  # the cell's wall time × reserved CPUs
    ]),
    (3, "runs.metadata: `harness run --metadata KEY=VALUE` pairs; v_runs shows label and metadata", [
        "ALTER TABLE runs ADD COLUMN metadata JSON",  # {"key": "value", …} as canonical JSON; NULL: none given
    ]),
    (4, "one acceptance definition: requests.all_steps (drafting steps only, or every step, reported)", [
        # TRUE: request_steps holds every verify step, drafting or not; FALSE: only the drafting steps (vLLM
        # reports no others); NULL (before v4): read as TRUE. harness.metrics.acceptance, views v_acceptance
        "ALTER TABLE requests ADD COLUMN all_steps BOOLEAN",
    ]),
    (5, "interleaved rounds: cells.round_slot; views v_rounds (per-round validity), v_speedup_summary", [
        # the cell's position in its round (0: measured first); repeats are rounds, rotated per round
        "ALTER TABLE cells ADD COLUMN round_slot INTEGER",
    ]),
    (6, "engine steps as the one step record: engine_steps.draft_length, engine_steps.num_prefilled", [
        # tokens drafted per request at the step, 0 … γ (0: no draft forward; how often `adaptive` drafted is
        # `avg((draft_length > 0)::DOUBLE) FROM v_ok_engine_steps`); NULL before v6 (not reported)
        "ALTER TABLE engine_steps ADD COLUMN draft_length INTEGER",
        "ALTER TABLE engine_steps ADD COLUMN num_prefilled INTEGER",  # requests admitted at the step; NULL before v6
    ]),
    # views only: v_speedup pairs each round with √(opening · closing plain pass) (the closing pass is the
    # plain cell's repeat R + r) and adds plain_open_throughput, plain_close_throughput, sandwich_drift,
    # sandwiched; v_speedup_summary is the median with the sign-test interval and adds ci_coverage,
    # sandwich_drift, unsteady_rounds (harness.metrics.speedup)
    (7, "ABA sandwich rounds: v_speedup over both plain passes; v_speedup_summary as median and sign interval", []),
    (8, "level offsets of the drafter's calibration: cells.sts_offsets", [
        # [γ] b_j of calibration.fit_sts_level, fitted with sts_temperatures: the calibrated ECE is of
        # σ(c_j / T_j + b_j); NULL: none (STS alone, b_j = 0), and every row before v8
        "ALTER TABLE cells ADD COLUMN sts_offsets JSON",
    ]),
    # views only: a round that accepted nothing is invalid over MIN_DRAFTING_STEPS_TO_JUDGE drafting steps, its
    # own or its cell's rounds' together (harness.metrics.speedup), not over any count
    (9, "v_rounds: nothing accepted judged over enough drafting steps, a round's or its cell's", []),
]

SCHEMA_VERSION = MIGRATIONS[-1][0]


def schema_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The highest applied migration, 0 for an empty database, None for a database that is no store."""
    tables = {name for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main'"
    ).fetchall()}
    if "schema_migrations" not in tables:
        return 0 if not tables else None
    (version,) = one_row(con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations"), "schema_migrations")
    return int(version)


def migrate(con: duckdb.DuckDBPyConnection, *, read_only: bool = False, name: str = "the store") -> int:
    """Bring the store to `SCHEMA_VERSION` (one transaction) or check that it is there; returns the version.

    Raises `StoreError` naming `name` (the file) when the store is newer than this code, older and opened
    read-only, or a DuckDB database with tables but no `schema_migrations`.
    """
    from harness.store import views  # views import nothing from here; imported late to keep the order obvious

    version = schema_version(con)
    if version is None:
        raise StoreError(f"{name} is a DuckDB database but not a harness store (it has tables and no schema_migrations)")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{name} has schema version {version}, newer than this code knows ({SCHEMA_VERSION}): "
            "update dspark-harness to read it"
        )
    if version == SCHEMA_VERSION:
        return version
    if read_only:
        raise StoreError(
            f"{name} has schema version {version}, older than this code's {SCHEMA_VERSION}: open it writable once "
            "(any `harness run`) to migrate it"
        )
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version INTEGER PRIMARY KEY, description VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)"
        )
        for number, description, statements in MIGRATIONS:
            if number <= version:
                continue
            for statement in statements:
                con.execute(statement)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [number, description, now])
        views.create_views(con)
        con.execute("COMMIT")
    except BaseException as exc:
        con.execute("ROLLBACK")
        if isinstance(exc, duckdb.Error):
            raise StoreError(f"migrating {name} to schema version {SCHEMA_VERSION} failed: {one_line(exc)}") from exc
        raise
    return SCHEMA_VERSION
