"""Export → import round trips, pytest-benchmark ingestion, and `harness query`'s read-only SQL."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from harness.store import (
    SCHEMA_VERSION,
    Store,
    StoreError,
    export_run,
    import_run,
    ingest_benchmark_json,
    read_only_query,
)
from harness.store.tables import ORDER_BY, RUN_TABLES
from store_fixtures import make_cell, make_result, run_info

T0 = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)


def rows_of(store, run_id):
    """Every row of the run in every table, run_id and the kind/label it may change left out, sorted."""
    out = {}
    for table in RUN_TABLES:
        columns, rows = store.query(f"SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = ? ORDER BY {ORDER_BY[table]}",
                                    [run_id])
        if table == "runs":
            rows = [tuple(v for c, v in zip(columns, r) if c not in ("kind", "label")) for r in rows]
        out[table] = rows
    return out


@pytest.fixture
def source(tmp_path):
    store = Store.open(tmp_path / "source.duckdb")
    run_id = store.begin_run(run_info(label="nightly"))
    plain = make_result(seed=1, gamma=0, confidences=False)
    store.record_cell(run_id, make_cell("none"), 0, result=plain, error=None, started_at=T0, finished_at=T0,
                      comparability_key="k0")
    store.record_cell(run_id, make_cell(), 0, result=make_result(seed=2, plain=plain), error=None, started_at=T0,
                      finished_at=T0, comparability_key="k1")
    store.record_cell(run_id, make_cell("eagle3"), 0, result=None, error="boom", started_at=T0, finished_at=T0,
                      comparability_key="k2")
    store.finish_run(run_id)
    yield store, run_id
    store.close()


def test_export_import_round_trip(source, tmp_path):
    store, run_id = source
    path = export_run(store, run_id, tmp_path / "baselines" / "ci.json")
    text = path.read_text(encoding="utf-8")
    document = json.loads(text)
    assert document["format"] == "dspark-harness-run" and document["schema_version"] == SCHEMA_VERSION
    assert document["run_id"] == run_id and set(document["tables"]) == set(RUN_TABLES)
    assert "run_id" not in document["tables"]["requests"]["columns"]

    export_run(store, run_id, tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text(encoding="utf-8") == text  # deterministic

    with Store.open(":memory:") as target:
        assert import_run(target, path, label="ci baseline") == run_id
        run = target.run(run_id)
        assert run["kind"] == "imported" and run["label"] == "ci baseline" and run["status"] == "finished"
        assert rows_of(target, run_id) == rows_of(store, run_id)
        cell = make_cell()
        assert target.cell_result(run_id, cell.cell_id, 0) == store.cell_result(run_id, cell.cell_id, 0)
        assert target.query("SELECT acceptance_length FROM v_acceptance WHERE cell_id = ?", [cell.cell_id]) == \
            store.query("SELECT acceptance_length FROM v_acceptance WHERE cell_id = ?", [cell.cell_id])
        # Importing again changes nothing.
        assert import_run(target, path) == run_id
        assert target.query("SELECT count(*) FROM runs")[1] == [(1,)]
        # Re-exporting the import gives the same document, but for kind and label.
        export_run(target, run_id, tmp_path / "re.json")
        again = json.loads((tmp_path / "re.json").read_text(encoding="utf-8"))
        assert again["tables"]["cells"] == document["tables"]["cells"]
    with Store.open(":memory:") as target:
        import_run(target, path)
        assert target.run(run_id)["label"] == "nightly"


def test_import_refuses_newer_or_foreign_files(source, tmp_path):
    store, run_id = source
    path = export_run(store, run_id, tmp_path / "run.json")
    document = json.loads(path.read_text(encoding="utf-8"))
    document["schema_version"] = SCHEMA_VERSION + 1
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(document), encoding="utf-8")
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"benchmarks": []}', encoding="utf-8")
    with Store.open(":memory:") as target:
        with pytest.raises(StoreError, match="newer than this code"):
            import_run(target, newer)
        with pytest.raises(StoreError, match="not an exported harness run"):
            import_run(target, foreign)
        with pytest.raises(StoreError, match="cannot read"):
            import_run(target, tmp_path / "missing.json")
        assert target.query("SELECT count(*) FROM runs")[1] == [(0,)]
    with pytest.raises(StoreError, match="no run"):
        export_run(store, "r-nope", tmp_path / "x.json")


BENCHMARK_JSON = {
    "machine_info": {"node": "box", "processor": "x86_64", "python_version": "3.11.7", "cpu": {"brand_raw": "Test CPU"}},
    "commit_info": {"id": "c" * 40, "branch": "main", "dirty": True, "project": "dspark-harness"},
    "benchmarks": [
        {"group": "draft", "name": "test_draft_step[markov]", "fullname": "tests/benchmarks/x.py::test_draft_step[markov]",
         "params": {"head": "markov"}, "param": "markov", "extra_info": {"tokens": 16},
         "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": 5},
         "stats": {"min": 0.001, "max": 0.003, "mean": 0.0015, "stddev": 0.0002, "rounds": 50, "median": 0.0014,
                   "iqr": 0.0001, "q1": 0.0013, "q3": 0.0016, "iqr_outliers": 2, "stddev_outliers": 3,
                   "outliers": "3;2", "ld15iqr": 0.001, "hd15iqr": 0.002, "ops": 666.6, "total": 0.075,
                   "data": [0.001] * 50, "iterations": 1}},
        {"group": None, "name": "test_scheduler", "fullname": "tests/benchmarks/y.py::test_scheduler",
         "params": None, "param": None, "extra_info": {}, "options": {},
         "stats": {"min": 0.1, "max": 0.2, "mean": 0.15, "stddev": 0.01, "rounds": 5, "median": 0.15,
                   "ops": 6.67, "total": 0.75, "iterations": 10}},
    ],
    "datetime": "2025-03-04T05:06:07.123456+00:00",
    "version": "5.2.3",
}


def test_ingest_pytest_benchmark_json(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(BENCHMARK_JSON), encoding="utf-8")
    with Store.open(":memory:") as store:
        run_id = ingest_benchmark_json(store, path, run_info(git_sha=None, git_branch=None, git_dirty=None))
        run = store.run(run_id)
        assert (run["kind"], run["status"], run["git_sha"], run["git_dirty"]) == ("benchmark", "finished", "c" * 40, True)
        assert run["started_at"] == dt.datetime(2025, 3, 4, 5, 6, 7, 123456)
        assert run["host"]["machine_info"]["cpu"]["brand_raw"] == "Test CPU"
        columns, rows = store.query("SELECT * FROM benchmarks WHERE run_id = ? ORDER BY name", [run_id])
        first = dict(zip(columns, rows[0]))
        assert (first["name"], first["bench_group"], first["mean"], first["rounds"], first["iterations"]) == \
            ("test_draft_step[markov]", "draft", 0.0015, 50, 1)
        assert json.loads(first["params"]) == {"head": "markov"}
        extra = json.loads(first["extra"])
        assert extra["extra_info"] == {"tokens": 16} and extra["stats"]["q1"] == 0.0013 and "data" not in extra["stats"]
        second = dict(zip(columns, rows[1]))
        assert second["params"] is None and second["bench_group"] is None and second["ops"] == 6.67
        assert store.query("SELECT benchmarks FROM v_runs WHERE run_id = ?", [run_id])[1] == [(2,)]
        # A benchmark run exports and imports like any other.
        export_run(store, run_id, tmp_path / "b.json")
        with Store.open(":memory:") as other:
            import_run(other, tmp_path / "b.json")
            assert rows_of(other, run_id)["benchmarks"] == rows_of(store, run_id)["benchmarks"]

    bad = tmp_path / "bad.json"
    bad.write_text('{"machine_info": {}}', encoding="utf-8")
    with Store.open(":memory:") as store, pytest.raises(StoreError, match="not pytest-benchmark JSON"):
        ingest_benchmark_json(store, bad, run_info())


def test_read_only_query(source, tmp_path):
    store, run_id = source
    path = store.path
    store.close()
    columns, rows = read_only_query(path, "SELECT run_id, cells_ok, cells_failed FROM v_runs")
    assert columns == ["run_id", "cells_ok", "cells_failed"] and rows == [(run_id, 2, 1)]
    for sql in ("DELETE FROM runs", "UPDATE runs SET label = 'x'", "DROP VIEW v_runs", "CREATE TABLE x (a INT)",
                "SELECT 1; INSERT INTO runs (run_id) VALUES ('x')"):
        with pytest.raises(StoreError) as info:
            read_only_query(path, sql)
        assert str(info.value).startswith("the query tried to write") and "\n" not in str(info.value)
    with pytest.raises(StoreError, match="query failed: Catalog Error") as info:
        read_only_query(path, "SELECT * FROM no_such_table")
    assert "\n" not in str(info.value)
    with pytest.raises(StoreError, match="empty query"):
        read_only_query(path, "  ")
    with pytest.raises(StoreError, match="no result store"):
        read_only_query(tmp_path / "missing.duckdb", "SELECT 1")
    with Store.open(path) as reopened:
        assert reopened.run(run_id)["status"] == "finished"
