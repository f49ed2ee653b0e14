"""A Ray instance the executor starts itself: an interrupted run cancels what is left, shuts that instance
down and keeps the finished cells, and `--resume` finishes the run (locally, or on Ray from the CLI)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from harness.progress import PlainDisplay  # noqa: E402
from harness.runner import Interrupted, run_suite  # noqa: E402
from harness.store import Store  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
CI = REPO / "suites" / "ci.yaml"
ONLY = ["task=gsm8k", "concurrency=4"]




@pytest.fixture
def no_ray():
    if ray.is_initialized():
        pytest.skip("a Ray instance is already initialised in this process")
    import doubles

    ray.cloudpickle.register_pickle_by_value(doubles)
    yield
    if ray.is_initialized():
        ray.shutdown()


class CtrlCAfterFirst(PlainDisplay):
    """Ctrl-C as the driver sees it, right after the first cell is recorded."""

    def cell_finished(self, outcome) -> None:
        super().cell_finished(outcome)
        raise Interrupted("SIGINT")


def test_interrupt_cancels_the_rest_shuts_down_ray_and_resume_finishes(tmp_path, data_env, no_ray):
    from doubles import Empty, sleeper
    from harness.executors import get_executor
    from harness.executors.ray import RayExecutor
    from harness.suite import expand, load_suite, select

    quick = select(expand(load_suite(CI)), ONLY)[0]
    db = tmp_path / "h.duckdb"
    executor = RayExecutor(init_options={"num_cpus": 2}, backend_factory=sleeper(quick=quick.cell_id, seconds=120))
    outcome = run_suite(CI, db_path=db, only=ONLY, repeats=2, display=CtrlCAfterFirst(io.StringIO()), executor=executor)
    assert outcome.interrupted and outcome.exit_code == 130
    assert not ray.is_initialized()  # started by the executor, so shut down by it
    with Store.open(db, read_only=True) as store:
        assert store.run(outcome.run_id)["status"] == "interrupted"
        assert list(store.cell_status(outcome.run_id).values()) == ["failed"]  # the quick test double's cell
    local = get_executor("local")
    local.backends["inhouse"] = Empty()  # resume's bookkeeping is the point here, not the model
    resumed = run_suite(CI, db_path=db, only=ONLY, repeats=2, resume=outcome.run_id, display=PlainDisplay(io.StringIO()),
                        executor=local)
    assert resumed.exit_code == 0 and len(resumed.outcomes) == 6  # 2 rounds × (plain, speculative, closing plain)
    with Store.open(db, read_only=True) as store:
        assert store.run(outcome.run_id)["status"] == "finished"
        assert sorted(store.cell_status(outcome.run_id).values()) == ["ok"] * 6
        assert store.query("SELECT count(*) FROM superseded_cells")[1] == [(1,)]


@pytest.mark.slow  # ~60 s: two Ray instances start in subprocesses, workers cold
def test_sigterm_on_the_cli_then_resume_on_ray(tmp_path, data_env):
    db = tmp_path / "h.duckdb"
    argv = [sys.executable, "-m", "harness", "run", str(CI), "--db", str(db), "--repeats", "2", "--executor", "ray"]
    for only in ONLY:
        argv += ["--only", only]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[1/"):
            proc.send_signal(signal.SIGTERM)  # ray.init installs its own SIGTERM handler; the runner's must win
    assert proc.wait(timeout=120) == 130, "".join(lines)
    run_id = next(line.split()[1].rstrip(":") for line in lines if line.startswith("run "))
    assert any(f"--resume {run_id}" in line for line in lines)
    with Store.open(db, read_only=True) as store:
        assert store.run(run_id)["status"] == "interrupted"
        assert 1 <= len(store.cell_status(run_id)) < 6
    done = subprocess.run(argv + ["--resume", run_id], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with Store.open(db, read_only=True) as store:
        assert sorted(store.cell_status(run_id).values()) == ["ok"] * 6  # 2 rounds × (plain, speculative, closing plain)
        assert store.run(run_id)["status"] == "finished"
