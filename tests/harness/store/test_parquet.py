"""Parquet export → import: every row of every table round-trips, imports are idempotent and pool runs from
several stores, a newer schema is refused, an older file loads, and the CLI verbs."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from harness.cli import main
from harness.store import SCHEMA_VERSION, Store, StoreError, export_parquet, import_parquet, ingest_benchmark_json
from harness.store.tables import ORDER_BY, RUN_TABLES
from store_fixtures import make_cell, make_result, run_info
from test_store_exchange import BENCHMARK_JSON

T0 = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)
T1 = dt.datetime(2025, 1, 2, 0, 5, tzinfo=dt.timezone.utc)


def everything(store) -> dict[str, list[tuple]]:
    """Every row of every run table, run_id included, in export order."""
    return {table: store.query(f"SELECT * FROM {table} ORDER BY run_id, {ORDER_BY[table]}")[1] for table in RUN_TABLES}


def fill(store: Store, label: str) -> list[str]:
    """A finished run (plain, DSpark, a failed cell, a failed cell retried ok, costs) and a benchmark run."""
    run_id = store.begin_run(run_info(label=label), started_at=T0)
    plain = make_result(seed=1, gamma=0, confidences=False)
    costs = {"resources": {"num_cpus": 4.0, "num_gpus": 1.0}, "gpu_seconds": 12.5, "cpu_seconds": 50.0}
    store.record_cell(run_id, make_cell("none"), 0, result=plain, error=None, started_at=T0, finished_at=T1,
                      comparability_key="k0", **costs)
    store.record_cell(run_id, make_cell(), 0, result=make_result(seed=2, plain=plain), error=None, started_at=T0,
                      finished_at=T1, comparability_key="k1")
    store.record_cell(run_id, make_cell("eagle3"), 0, result=None, error="boom", started_at=T0, finished_at=T1,
                      comparability_key="k2", log="it's broken")
    store.record_cell(run_id, make_cell(seed=3), 0, result=None, error="flaky", started_at=T0, finished_at=T1,
                      comparability_key="k3")
    store.record_cell(run_id, make_cell(seed=3), 0, result=make_result(seed=3), error=None, started_at=T0,
                      finished_at=T1, comparability_key="k3")  # the retry: the failure moves to superseded_cells
    store.finish_run(run_id)
    return [run_id, ingest_benchmark_json(store, bench_file(store), run_info(label=label))]


def bench_file(store):
    from pathlib import Path

    path = Path(store.path).with_suffix(".bench.json")
    path.write_text(json.dumps(BENCHMARK_JSON), encoding="utf-8")
    return path


@pytest.fixture
def source(tmp_path):
    with Store.open(tmp_path / "a.duckdb") as store:
        yield store, fill(store, "a")


def test_round_trip_keeps_every_row_of_every_table(source, tmp_path):
    store, run_ids = source
    files = export_parquet(store, run_ids, tmp_path / "pool")
    assert {f.parent.name for f in files} == set(RUN_TABLES)  # this run has rows in every table
    assert all(f.name.endswith(".parquet") and f.stem in run_ids for f in files)
    with Store.open(tmp_path / "b.duckdb") as target:
        assert import_parquet(target, tmp_path / "pool") == (sorted(run_ids), [])
        assert everything(target) == everything(store)
        cell = make_cell()
        assert target.cell_result(run_ids[0], cell.cell_id, 0) == store.cell_result(run_ids[0], cell.cell_id, 0)
        for view in ("v_acceptance", "v_positions", "v_costs", "v_runs"):
            assert sorted(target.query(f"SELECT * FROM {view}")[1], key=str) == \
                sorted(store.query(f"SELECT * FROM {view}")[1], key=str), view
        assert target.run(run_ids[0])["kind"] == "suite"  # a pooled history keeps kinds and labels

        before = everything(target)
        assert import_parquet(target, tmp_path / "pool") == ([], sorted(run_ids))  # idempotent
        assert everything(target) == before


def test_pooling_runs_from_two_machines(source, tmp_path):
    store, first = source
    export_parquet(store, first, tmp_path / "pool")
    with Store.open(tmp_path / "other.duckdb") as other:
        second = fill(other, "b")
        export_parquet(other, second[:1], tmp_path / "pool")
    with Store.open(tmp_path / "c.duckdb") as target:
        target_first = fill(target, "c")[:1]  # the importing machine has runs of its own
        export_parquet(target, target_first, tmp_path / "pool")  # …and shares them too
        imported, skipped = import_parquet(target, tmp_path / "pool")
        assert sorted(imported) == sorted(first + second[:1]) and skipped == target_first
        assert target.query("SELECT count(*) FROM runs")[1] == [(5,)]
        _, rows = target.query("SELECT DISTINCT run_id FROM read_parquet(?)", [str(tmp_path / "pool" / "cells" / "*.parquet")])
        assert len(rows) == 3  # the pool is also queryable where it lies


def test_newer_or_foreign_files_are_refused_and_nothing_is_written(source, tmp_path):
    store, run_ids = source
    export_parquet(store, run_ids[:1], tmp_path / "pool")
    runs = tmp_path / "pool" / "runs" / f"{run_ids[0]}.parquet"
    store.con.execute(f"COPY (SELECT * FROM read_parquet('{runs}')) TO '{tmp_path / 'newer.parquet'}' "
                      f"(FORMAT parquet, KV_METADATA {{schema_version: '{SCHEMA_VERSION + 1}'}})")
    (tmp_path / "newer.parquet").replace(runs)
    with Store.open(tmp_path / "b.duckdb") as target:
        with pytest.raises(StoreError, match="newer than this code knows"):
            import_parquet(target, tmp_path / "pool")
        with pytest.raises(StoreError, match="holds no exported runs"):
            import_parquet(target, tmp_path / "empty")
        store.con.execute(f"COPY (SELECT 1 AS x) TO '{runs}' (FORMAT parquet)")
        with pytest.raises(StoreError, match="not a harness parquet export"):
            import_parquet(target, tmp_path / "pool")
        assert target.query("SELECT count(*) FROM runs")[1] == [(0,)]
    with pytest.raises(StoreError, match="no run"):
        export_parquet(store, ["r-nope"], tmp_path / "x")


def test_a_schema_1_export_loads_with_null_costs(source, tmp_path):
    store, run_ids = source
    export_parquet(store, run_ids[:1], tmp_path / "pool")
    for table in RUN_TABLES:  # as schema 1 wrote them: no cost columns, version 1
        path = tmp_path / "pool" / table / f"{run_ids[0]}.parquet"
        if path.exists():
            drop = " EXCLUDE (resources, gpu_seconds, cpu_seconds)" if table == "cells" else ""
            store.con.execute(f"COPY (SELECT *{drop} FROM read_parquet('{path}')) TO '{tmp_path / 'v1.parquet'}' "
                              "(FORMAT parquet, KV_METADATA {schema_version: '1'})")
            (tmp_path / "v1.parquet").replace(path)
    with Store.open(tmp_path / "b.duckdb") as target:
        assert import_parquet(target, tmp_path / "pool") == (run_ids[:1], [])
        assert target.query("SELECT count(*), count(resources), count(gpu_seconds) FROM cells")[1] == [(4, 0, 0)]


def test_cli_export_and_import(source, tmp_path, capsys):
    store, run_ids = source
    path = store.path
    store.close()
    assert main(["export", run_ids[0], "latest", "--parquet", str(tmp_path / "pool"), "--db", path]) == 0
    assert "exported 2 run(s)" in capsys.readouterr().out
    db = tmp_path / "b.duckdb"
    assert main(["import", str(tmp_path / "pool"), "--db", str(db)]) == 0
    assert sorted(capsys.readouterr().out.split()) == sorted(run_ids)
    assert main(["import", str(tmp_path / "pool"), "--db", str(db)]) == 0
    assert "imported 0 run(s), 2 already in the store" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "nothing"), "--db", str(db)]) == 2
    assert main(["export", "r-nope", "--parquet", str(tmp_path / "x"), "--db", path]) == 2
