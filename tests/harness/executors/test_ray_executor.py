"""The Ray executor on a local Ray instance (2 CPUs, this machine): the same records as the local executor
for the CI suite, a killed worker's cell retried (or recorded failed with the reason once retries are
spent), a cell no node can hold failed at once, and close() cancelling what is still queued."""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from harness.executors import reserved  # noqa: E402
from harness.executors.ray import RayExecutor, _fits, _lost  # noqa: E402
from harness.progress import PlainDisplay  # noqa: E402
from harness.runner import run_suite  # noqa: E402
from harness.store import Store  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CI = REPO / "suites" / "ci.yaml"
ONLY = ["task=gsm8k", "concurrency=4"]  # plain decoding and DSpark γ3: 2 cells of the CI suite




@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for the module; executors find it initialised and leave it running."""
    import doubles

    ray.cloudpickle.register_pickle_by_value(doubles)  # the workers cannot import tests/
    previous = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)  # ray.init's handler would turn pytest's SIGTERM into sys.exit
    yield
    ray.shutdown()


def quiet() -> PlainDisplay:
    return PlainDisplay(io.StringIO())


class Spy:
    """An executor that remembers the CellRuns it passes on (attempts are not stored)."""

    def __init__(self, inner):
        self.inner, self.runs = inner, []

    def run(self, *args, **kwargs):
        for cell_run in self.inner.run(*args, **kwargs):
            self.runs.append(cell_run)
            yield cell_run

    def close(self):
        self.inner.close()


def records(db: Path) -> dict:
    """What must not depend on where a cell ran: ids, status, τ, ECE and every request's output tokens."""
    with Store.open(db, read_only=True) as store:
        def rows(sql):
            return sorted(store.query(sql)[1])

        return {
            "cells": rows("SELECT cell_id, repeat, label, status, comparability_key, resources FROM cells"),
            "acceptance": rows("SELECT cell_id, repeat, steps, drafts_accepted, acceptance_length, accepted_per_step "
                               "FROM v_acceptance"),
            "metrics": rows("SELECT cell_id, repeat, metric, value FROM metrics WHERE metric IN "
                            "('acceptance_length', 'accepted_per_step', 'ece_raw', 'ece_calibrated')"),
            "outputs": rows("SELECT cell_id, repeat, prompt_key, output_ids FROM requests"),
            "steps": rows("SELECT cell_id, repeat, request_id, step, num_verified, num_accepted FROM request_steps"),
            "bins": rows("SELECT cell_id, kind, position, bin, count, confidence_sum, outcome_sum FROM calibration_bins"),
        }


# ---- no cluster ------------------------------------------------------------------------------------


def test_lost_tasks_are_retried_failed_cells_are_not():
    assert _lost(ray.exceptions.WorkerCrashedError())
    assert not _lost(ray.exceptions.TaskCancelledError())
    assert not _lost(ValueError("a cell's own failure"))


def test_placement_check_and_reserved_resources():
    node = {"CPU": 2.0, "memory": 8 * 2**30}
    assert _fits([node], reserved(None)) and reserved(None) == {"num_cpus": 1.0, "num_gpus": 0.0}
    assert not _fits([node], {"num_cpus": 1.0, "num_gpus": 1.0})
    assert not _fits([node], {"num_cpus": 4.0, "num_gpus": 0.0})
    assert not _fits([node], {"num_cpus": 1.0, "num_gpus": 0.0, "memory_gb": 64.0})
    assert _fits([node, {"CPU": 8.0, "GPU": 1.0, "memory": 80 * 2**30}], {"num_cpus": 4.0, "num_gpus": 1.0, "memory_gb": 64.0})
    assert _fits([], {"num_gpus": 8.0})  # no node known yet: an autoscaler may add one


def test_no_cluster_fails_every_cell_with_the_reason(monkeypatch):
    from harness.suite import expand, load_suite

    cells = expand(load_suite(CI))[:2]
    executor = RayExecutor(address="ray://nowhere:10001")

    def unreachable():
        raise ConnectionError("Failed to connect to nowhere:10001")

    monkeypatch.setattr(executor, "_connect", unreachable)
    runs = list(executor.run([(c, 0) for c in cells], lambda c: {}, quiet(), lambda c: reserved(None)))
    assert [r.cell for r in runs] == cells
    assert all(r.error == "cannot start or reach Ray (ray://nowhere:10001): Failed to connect to nowhere:10001"
               and "ConnectionError" in r.log for r in runs)


# ---- on a local Ray instance -----------------------------------------------------------------------


@pytest.mark.slow  # ~35 s: both executors run the cells, and the Ray workers start cold
def test_ray_records_what_the_local_executor_records(tmp_path, data_env, ray_cluster):
    local_db, ray_db = tmp_path / "local.duckdb", tmp_path / "ray.duckdb"
    assert run_suite(CI, db_path=local_db, only=ONLY, repeats=1, display=quiet()).exit_code == 0
    executor = Spy(RayExecutor())
    outcome = run_suite(CI, db_path=ray_db, only=ONLY, repeats=1, display=quiet(), executor=executor)
    assert outcome.exit_code == 0 and len(outcome.outcomes) == 3  # plain, DSpark, the closing plain pass
    local, remote = records(local_db), records(ray_db)
    assert [r[0] for r in remote["cells"]] == [r[0] for r in local["cells"]]
    for name in local:
        assert remote[name] == local[name], name
    assert len(local["outputs"]) == 30 and {r[2] for r in local["metrics"]} >= {"ece_raw", "ece_calibrated"}
    assert [r.attempts for r in executor.runs] == [1, 1, 1]
    with Store.open(ray_db, read_only=True) as store:
        _, costs = store.query("SELECT gpu_seconds, cpu_seconds, run_cpu_seconds FROM v_costs")
    assert all(gpu == 0.0 and cpu > 0 for gpu, cpu, _ in costs)
    assert costs[0][2] == pytest.approx(outcome.cpu_seconds)
    assert ray.is_initialized()  # not started by the executor: left running


@pytest.mark.slow  # ~20 s: Ray workers start cold
def test_ray_runs_a_familys_rounds_one_at_a_time_in_the_planned_order(tmp_path, data_env, ray_cluster):
    from harness.runner import load_cells, plan, round_slots

    db = tmp_path / "h.duckdb"
    assert run_suite(CI, db_path=db, only=ONLY, repeats=2, display=quiet(), executor=RayExecutor()).exit_code == 0
    with Store.open(db, read_only=True) as store:
        _, rows = store.query("SELECT cell_id, repeat, round_slot, started_at, finished_at FROM cells ORDER BY started_at")
    _, cells = load_cells(CI, ONLY, check_files=False)
    work = plan(cells, 2)  # plain and DSpark share a baseline: one chain, DSpark inside a plain sandwich
    slots = round_slots(work, 2)
    assert [row[:3] for row in rows] == [(c.cell_id, r, slots[(c.cell_id, r)]) for c, r in work]
    assert all(earlier[4] <= later[3] for earlier, later in zip(rows, rows[1:]))  # never two at once


def test_a_killed_worker_is_retried_and_then_recorded_failed(tmp_path, data_env, ray_cluster):
    from doubles import crash_once
    from harness.suite import expand, load_suite, select

    (cell,) = select(expand(load_suite(CI)), [*ONLY, "drafter=dspark"])
    db = tmp_path / "h.duckdb"

    marker = tmp_path / "crashed-once"
    executor = Spy(RayExecutor(backend_factory=crash_once(cell.cell_id, str(marker))))
    outcome = run_suite(CI, db_path=db, only=[*ONLY, "drafter=dspark"], repeats=1, display=quiet(), executor=executor)
    assert outcome.exit_code == 0 and marker.exists()  # the first attempt died in its worker
    assert [(r.attempts, r.error) for r in executor.runs] == [(2, None)]

    marker = tmp_path / "crashed-again"
    outcome = run_suite(CI, db_path=db, only=[*ONLY, "drafter=dspark"], repeats=1, display=quiet(),
                        executor=RayExecutor(max_retries=0, backend_factory=crash_once(cell.cell_id, str(marker), real=False)))
    assert outcome.exit_code == 1
    with Store.open(db, read_only=True) as store:
        status, error = store.query("SELECT status, error FROM cells WHERE run_id = ?", [outcome.run_id])[1][0]
    assert status == "failed" and error.startswith("WorkerCrashedError") and "attempt 1 of 1" in error


def test_a_cell_no_node_can_hold_fails_at_once(tmp_path, data_env, ray_cluster):
    suite = tmp_path / "gpu.yaml"
    text = CI.read_text().replace("include: [common.yaml]", f"include: [{REPO / 'suites' / 'common.yaml'}]")
    suite.write_text(text + "resources:\n  inhouse: {num_cpus: 1, num_gpus: 1}\n")
    outcome = run_suite(suite, db_path=tmp_path / "h.duckdb", only=ONLY, repeats=1, display=quiet(),
                        executor=RayExecutor())
    assert outcome.exit_code == 1
    assert all(o.status == "failed" and "no node of the Ray cluster can hold" in o.error for o in outcome.outcomes)


def test_close_cancels_queued_and_running_tasks(data_env, ray_cluster):
    from doubles import sleeper
    from harness.suite import expand, load_suite, select

    quick, slow = select(expand(load_suite(CI)), ONLY)
    work = [(quick, 0)] + [(slow, repeat) for repeat in range(3)]  # 4 tasks on 2 CPUs: two wait in Ray's queue
    executor = RayExecutor(backend_factory=sleeper(quick=quick.cell_id, seconds=120))
    stream = executor.run(work, lambda c: {}, quiet(), lambda c: reserved(None))
    first = next(stream)  # the quick cell; the other three are running or queued
    assert first.error.endswith("is a test double") and first.attempts == 1
    pending = list(executor._pending)
    assert len(pending) == 3
    executor.close()
    stream.close()
    assert not executor._pending and ray.is_initialized()
    for ref in pending:
        with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)):
            ray.get(ref, timeout=30)
