"""Runs and cells: record and read back, failed cells, retries, one transaction per cell, run lookups,
and the speed of recording a large cell."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from harness import provenance
from harness.store import Store, StoreError
from harness.store import tables as store_tables
from store_fixtures import make_cell, make_result, run_info

T0 = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
T1 = T0 + dt.timedelta(seconds=42)


@pytest.fixture
def store():
    with Store.open(":memory:") as s:
        yield s


def record(store, run_id, cell, repeat=0, result=None, error=None, key="k" * 16):
    store.record_cell(run_id, cell, repeat, result=result, error=error, started_at=T0, finished_at=T1,
                      comparability_key=key)


def test_run_lifecycle_and_stamps(store):
    info = run_info()
    run_id = store.begin_run(info)
    assert run_id.startswith("r") and len(run_id) == len("r20250102T030405-abcdef")
    run = store.run(run_id)
    assert run["status"] == "running" and run["finished_at"] is None and run["kind"] == "suite"
    assert run["host"] == info.host and run["packages"] == info.packages and run["argv"] == info.argv
    assert (run["suite_text"], run["git_sha"], run["git_dirty"], run["repeats"]) == ("name: cpu\n", "0" * 40, False, 1)
    store.finish_run(run_id, "interrupted")
    assert store.run(run_id)["status"] == "interrupted" and store.run(run_id)["finished_at"] is not None
    store.set_run_status(run_id, "running")
    assert store.run(run_id)["finished_at"] is None
    store.finish_run(run_id)
    assert store.run(run_id)["status"] == "finished"
    with pytest.raises(ValueError):
        store.finish_run(run_id, "running")
    assert store.run("r-nope") is None


def test_round_trip_of_the_level_offsets(store):
    from dataclasses import replace

    run_id = store.begin_run(run_info())
    cell = make_cell()
    result = make_result(seed=1)
    levelled = replace(result, sts_offsets=tuple(-0.25 * (j + 1) for j in range(len(result.sts_temperatures))))
    record(store, run_id, cell, result=levelled, key="k")
    assert store.cell_result(run_id, cell.cell_id, 0) == levelled
    assert store.cell(run_id, cell.cell_id, 0)["sts_offsets"] == list(levelled.sts_offsets)
    columns, rows = store.query("SELECT * FROM v_cells")
    assert columns[-1] == "sts_offsets" and json.loads(rows[0][-1]) == list(levelled.sts_offsets)


def test_round_trip_of_a_cell_result(store):
    run_id = store.begin_run(run_info())
    cell = make_cell()
    result = make_result(seed=1)
    key = provenance.comparability_key(cell.params(), result.provenance, "f" * 12, {"torch": "2.13.0"})
    record(store, run_id, cell, result=result, key=key)

    back = store.cell_result(run_id, cell.cell_id, 0)
    assert back == result  # records, steps, window, provenance, STS temperatures, metrics, bins, log
    assert list(back.metrics) == list(result.metrics)  # insertion order too

    row = store.cell(run_id, cell.cell_id, 0)
    assert row["status"] == "ok" and row["error"] is None and row["label"] == cell.label()
    assert row["params"] == json.loads(json.dumps(cell.params()))
    assert {k: row[k] for k in cell.axes()} == cell.axes()
    assert row["started_at"] == T0.replace(tzinfo=None) and row["finished_at"] == T1.replace(tzinfo=None)
    assert row["comparability_key"] == key
    # The key can be recomputed from what the store keeps.
    run = store.run(run_id)
    assert provenance.comparability_key(row["params"], row["provenance"], run["host_fingerprint"],
                                        run["packages"]) == provenance.comparability_key(
        cell.params(), result.provenance, run["host_fingerprint"], run["packages"])

    counts = {t: store.query(f"SELECT count(*) FROM {t}")[1][0][0] for t in store_tables.CELL_TABLES}
    assert counts["requests"] == len(result.requests)
    assert counts["request_steps"] == sum(r.record.num_steps for r in result.requests)
    assert counts["request_tokens"] == sum(r.record.output_tokens for r in result.requests)
    assert counts["step_confidences"] == sum(r.record.num_drafted for r in result.requests)
    assert counts["engine_steps"] == len(result.steps)
    assert counts["metrics"] == len(result.metrics)
    assert counts["calibration_bins"] == len(result.calibration_bins)
    positions = store.query("SELECT min(position) FROM step_confidences")[1][0][0]
    assert positions == 1
    # how often the engine drafted at all is a query (the draft-length policy's decision reaches the store)
    drafted, prefilled = store.query("SELECT sum((draft_length > 0)::INT), sum(num_prefilled) FROM engine_steps")[1][0]
    assert drafted == sum(s.draft_length > 0 for s in result.steps) > 0 and prefilled == 4


def test_failed_cell_is_recorded_with_its_error_and_retried_on_resume(store):
    run_id = store.begin_run(run_info())
    cell, other = make_cell(), make_cell("none")
    record(store, run_id, cell, error="RuntimeError: CUDA out of memory")
    record(store, run_id, other, result=make_result(seed=2, gamma=0, confidences=False))
    assert store.cell_status(run_id) == {(cell.cell_id, 0): "failed", (other.cell_id, 0): "ok"}
    row = store.cell(run_id, cell.cell_id, 0)
    assert row["error"] == "RuntimeError: CUDA out of memory" and row["window_start_s"] is None
    assert store.cell_result(run_id, cell.cell_id, 0) is None

    # A partial result of a failed cell is kept for diagnosis.
    partial = make_result(seed=3)
    record(store, run_id, cell, result=partial, error="TimeoutError: server stopped answering")
    assert store.cell_status(run_id)[(cell.cell_id, 0)] == "failed"
    assert store.cell_result(run_id, cell.cell_id, 0) == partial

    # The retry replaces the failed rows; the failed attempts stay in superseded_cells.
    result = make_result(seed=4)
    record(store, run_id, cell, result=result)
    assert store.cell_status(run_id)[(cell.cell_id, 0)] == "ok"
    assert store.cell_result(run_id, cell.cell_id, 0) == result
    _, superseded = store.query("SELECT error FROM superseded_cells ORDER BY superseded_at, error")
    assert sorted(e for (e,) in superseded) == ["RuntimeError: CUDA out of memory", "TimeoutError: server stopped answering"]
    (n,) = store.query("SELECT count(*) FROM requests WHERE cell_id = ?", [cell.cell_id])[1][0]
    assert n == len(result.requests)

    with pytest.raises(StoreError, match="already recorded ok"):
        record(store, run_id, cell, result=result)
    with pytest.raises(ValueError):
        store.record_cell(run_id, cell, 1, result=None, error=None, started_at=T0, finished_at=T1,
                          comparability_key="k")
    with pytest.raises(StoreError, match="no run"):
        record(store, "r-nope", cell, result=result)


def test_a_cell_that_fails_mid_write_leaves_no_rows(store, monkeypatch):
    run_id = store.begin_run(run_info())
    cell = make_cell()
    real = store_tables.insert_columns

    def failing(con, table, *args, **kwargs):
        if table == "step_confidences":
            raise RuntimeError("disk full")
        return real(con, table, *args, **kwargs)

    monkeypatch.setattr("harness.store.store.insert_columns", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        record(store, run_id, cell, result=make_result())
    monkeypatch.undo()
    for table in store_tables.CELL_TABLES:
        assert store.query(f"SELECT count(*) FROM {table}")[1] == [(0,)], table
    record(store, run_id, cell, result=make_result())  # and the store is usable afterwards
    assert store.cell_status(run_id) == {(cell.cell_id, 0): "ok"}


def test_duplicate_request_ids_are_refused(store):
    import dataclasses

    run_id = store.begin_run(run_info())
    result = make_result()
    result.requests.append(dataclasses.replace(result.requests[0], prompt_key="again"))
    with pytest.raises(ValueError, match="appears twice"):
        record(store, run_id, make_cell(), result=result)


def test_latest_run_and_runs(store):
    a = store.begin_run(run_info(), started_at=T0)
    b = store.begin_run(run_info(git_branch="feature"), started_at=T0 + dt.timedelta(hours=1))
    c = store.begin_run(run_info(suite_name="gpu"), started_at=T0 + dt.timedelta(hours=2))
    for run_id in (a, b, c):
        store.finish_run(run_id)
    running = store.begin_run(run_info(), started_at=T0 + dt.timedelta(hours=3))

    assert store.latest_run() == c
    assert store.latest_run(status=None) == running
    assert store.latest_run(suite_name="cpu") == b
    assert store.latest_run(suite_name="cpu", branch="main") == a
    assert store.latest_run(before=b) == a
    assert store.latest_run(before=T0 + dt.timedelta(hours=2, minutes=1)) == c
    assert store.latest_run(exclude=c) == b
    assert store.latest_run(exclude=[c, b]) == a
    assert store.latest_run(suite_name="none") is None
    assert store.latest_run(kind="benchmark") is None

    rows = store.runs()
    assert [r["run_id"] for r in rows] == [running, c, b, a]
    assert [r["run_id"] for r in store.runs(suite_name="cpu", status="finished", limit=1)] == [b]
    record(store, a, make_cell(), error="boom")
    record(store, a, make_cell("none"), result=make_result(gamma=0, confidences=False))
    row = [r for r in store.runs() if r["run_id"] == a][0]
    assert (row["cells_ok"], row["cells_failed"]) == (1, 1) and row["duration_s"] >= 0


def test_read_only_store_refuses_writes(tmp_path):
    path = tmp_path / "h.duckdb"
    with Store.open(path) as store:
        run_id = store.begin_run(run_info())
    with Store.open(path, read_only=True) as store:
        with pytest.raises(StoreError, match="read-only"):
            store.begin_run(run_info())
        with pytest.raises(StoreError, match="read-only"):
            store.finish_run(run_id)
        with pytest.raises(StoreError, match="tried to write"):
            store.query("DELETE FROM runs")
        assert store.run(run_id)["status"] == "running"


def test_recording_a_large_cell_is_fast(store):
    """64 requests × ~200 tokens (≈ 13k token rows, 110 steps each, γ=4 confidences): printed, not asserted."""
    run_id = store.begin_run(run_info())
    result = make_result(seed=5, num_requests=64, num_steps=110)
    tokens = sum(r.record.output_tokens for r in result.requests)
    cell = make_cell()
    start = time.perf_counter()
    record(store, run_id, cell, result=result)
    elapsed = time.perf_counter() - start
    start = time.perf_counter()
    back = store.cell_result(run_id, cell.cell_id, 0)
    read = time.perf_counter() - start
    assert back == result
    print(f"\nrecord_cell: 64 requests, {tokens} token rows, "
          f"{sum(r.record.num_steps for r in result.requests)} steps: {elapsed * 1000:.0f} ms; read back {read * 1000:.0f} ms")
