"""Migration 2 (cost accounting): a schema-1 store opened by this code gains the cost columns and v_costs
with its rows intact, new cells carry their costs, and a schema-1 JSON export (the CI baseline) imports."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb

from harness.store import SCHEMA_VERSION, Store, export_run, import_run
from harness.store.migrations import MIGRATIONS, V1_TABLES
from store_fixtures import make_cell, make_result

REPO = Path(__file__).resolve().parents[3]
T0 = dt.datetime(2025, 1, 2)


def v1_store(path: Path) -> None:
    """A store as schema 1 left it: its tables, one run with one cell, and a view of the time."""
    con = duckdb.connect(str(path))
    for statement in V1_TABLES:
        con.execute(statement)
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, description VARCHAR NOT NULL, "
                "applied_at TIMESTAMP NOT NULL)")
    con.execute("INSERT INTO schema_migrations VALUES (1, ?, ?)", [MIGRATIONS[0][1], T0])
    con.execute("INSERT INTO runs (run_id, kind, suite_name, started_at, status) VALUES ('r1', 'suite', 'ci', ?, 'finished')",
                [T0])
    con.execute("INSERT INTO cells (run_id, cell_id, repeat, label, backend, status, started_at, finished_at) "
                "VALUES ('r1', 'c1', 0, 'old cell', 'inhouse', 'ok', ?, ?)", [T0, T0 + dt.timedelta(seconds=3)])
    con.execute("CREATE VIEW v_cells AS SELECT * EXCLUDE (log) FROM cells")
    con.close()


def test_a_schema_1_store_is_migrated_with_its_rows(tmp_path):
    path = tmp_path / "old.duckdb"
    v1_store(path)
    with Store.open(path) as store:
        _, versions = store.query("SELECT version FROM schema_migrations ORDER BY version")
        assert versions[:2] == [(1,), (2,)]
        row = store.cell("r1", "c1", 0)
        assert (row["label"], row["status"], row["resources"], row["gpu_seconds"], row["cpu_seconds"]) == \
            ("old cell", "ok", None, None, None)
        columns, rows = store.query("SELECT * FROM v_cells")
        after = columns[columns.index("run_label") + 1:]  # schema 2's columns, then later schemas' (round_slot)
        assert after[:3] == ["resources", "gpu_seconds", "cpu_seconds"] and columns[:3] == ["run_id", "cell_id", "repeat"]
        assert rows[0][columns.index("duration_s")] == 3.0
        assert store.query("SELECT repeats, gpu_seconds, run_gpu_seconds FROM v_costs")[1] == [(1, None, None)]
        # new cells of the migrated store carry their costs
        store.record_cell("r1", make_cell(), 0, result=make_result(), error=None, started_at=T0, finished_at=T0,
                          comparability_key="k", resources={"num_cpus": 4.0, "num_gpus": 1.0}, gpu_seconds=2.5,
                          cpu_seconds=10.0)
        _, costs = store.query("SELECT label, num_gpus, num_cpus, gpu_seconds, cpu_seconds, run_gpu_seconds, "
                               "run_cpu_seconds FROM v_costs ORDER BY label")
        assert costs == [(make_cell().label(), 1.0, 4.0, 2.5, 10.0, 2.5, 10.0), ("old cell", None, None, None, None, 2.5, 10.0)]
    with Store.open(path, read_only=True) as store:  # migrated once, for good
        assert store.query("SELECT max(version) FROM schema_migrations")[1] == [(SCHEMA_VERSION,)]


def schema_1_export(path: Path, tmp_path: Path) -> Path:
    """An exported run as schema 1 wrote it: the cost columns of migration 2 dropped from `cells`."""
    document = json.loads(path.read_text(encoding="utf-8"))
    cells = document["tables"]["cells"]
    keep = [i for i, c in enumerate(cells["columns"]) if c not in ("resources", "gpu_seconds", "cpu_seconds")]
    cells["columns"] = [cells["columns"][i] for i in keep]
    cells["rows"] = [[row[i] for i in keep] for row in cells["rows"]]
    document["schema_version"] = 1
    out = tmp_path / "schema1.json"
    out.write_text(json.dumps(document), encoding="utf-8")
    return out


def test_the_schema_1_ci_baseline_still_imports(tmp_path):
    baseline = schema_1_export(REPO / "results" / "baselines" / "ci.json", tmp_path)
    document = json.loads(baseline.read_text(encoding="utf-8"))
    assert document["schema_version"] == 1 and "gpu_seconds" not in document["tables"]["cells"]["columns"]
    with Store.open(":memory:") as store:
        run_id = import_run(store, baseline)
        assert run_id == document["run_id"]
        _, rows = store.query("SELECT count(*), count(resources), count(gpu_seconds), count(cpu_seconds) FROM cells")
        assert rows == [(len(document["tables"]["cells"]["rows"]), 0, 0, 0)]
        for table in ("requests", "request_steps", "metrics"):
            assert store.query(f"SELECT count(*) FROM {table}")[1] == [(len(document["tables"][table]["rows"]),)]
        again = json.loads(export_run(store, run_id, tmp_path / "again.json").read_text(encoding="utf-8"))
        assert again["schema_version"] == SCHEMA_VERSION
        assert again["tables"]["cells"]["columns"][-5:] == ["resources", "gpu_seconds", "cpu_seconds", "round_slot",
                                                            "sts_offsets"]
