"""Resources and cost: the suite's optional `resources:` per backend (the hash unchanged without it), what
a cell reserves, GPU/CPU-seconds per cell in the store and the run's summary, the dry run's estimate
from history, and the run command's executor options."""

from __future__ import annotations

import io
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from harness.cli import main
from harness.executors import CellRun, reserved
from harness.progress import PlainDisplay
from harness.runner import dry_run, run_suite
from harness.store import Store
from harness.suite import SuiteError, load_suite, parse_suite_text

REPO = Path(__file__).resolve().parents[3]
CI = REPO / "suites" / "ci.yaml"
ONLY = ["task=gsm8k", "concurrency=4"]




def ci_with(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "ci.yaml"
    text = CI.read_text().replace("include: [common.yaml]", f"include: [{REPO / 'suites' / 'common.yaml'}]")
    path.write_text(text + extra)
    return path


def test_resources_are_optional_per_backend_and_change_the_hash_only_when_given(tmp_path):
    plain = load_suite(CI)
    assert plain.resources == {} and "resources" not in plain.resolved_text
    # ci.yaml as committed (4 rounds, speedup on paired rounds, throughput on Mann-Whitney), as results/baselines/ci.json records it
    assert plain.hash == "0dab1436f708ddbc3afa3e62c93cc743dc7900d8ef94c4e2631ce1f4a5bc0c43"
    suite = load_suite(ci_with(tmp_path, "resources:\n  inhouse: {num_cpus: 2}\n  vllm: {num_gpus: 1, num_cpus: 4, memory_gb: 64}\n"))
    assert suite.hash != plain.hash
    assert reserved(suite.resources["vllm"]) == {"num_cpus": 4.0, "num_gpus": 1.0, "memory_gb": 64.0}
    assert reserved(suite.resources["inhouse"]) == {"num_cpus": 2.0, "num_gpus": 0.0}
    assert reserved(suite.resources.get("sglang")) == {"num_cpus": 1.0, "num_gpus": 0.0}
    again = parse_suite_text(suite.resolved_text)
    assert again.hash == suite.hash and again.resources == suite.resources
    for bad, message in [
        ("resources:\n  inhouse: {num_gpu: 1}\n", "unknown key 'num_gpu' (did you mean 'num_gpus'?)"),
        ("resources:\n  inhouse: {num_gpus: -1}\n", "must be at least 0"),
        ("resources:\n  vlm: {num_gpus: 1}\n", "unknown backend 'vlm' (did you mean 'vllm'?)"),
        ("resources:\n  inhouse: {num_cpus: \"4\"}\n", "expected a number"),
    ]:
        with pytest.raises(SuiteError, match="resources") as info:
            load_suite(ci_with(tmp_path, bad))
        assert message in str(info.value)


class Canned:
    """An executor that measures nothing: every cell fails after `wall_s`, with what it reserved."""

    def __init__(self, wall_s: float):
        self.wall_s = wall_s

    def run(self, work, options_for, display, resources_for=None):
        for cell, repeat in work:
            display.cell_started(cell, repeat)
            now = datetime.now(timezone.utc)
            yield CellRun(cell, repeat, None, "canned", "", now, now, self.wall_s, resources=resources_for(cell))

    def close(self):
        pass


def test_costs_are_recorded_summed_and_estimated_from_history(tmp_path, data_env):
    suite = ci_with(tmp_path, "resources:\n  inhouse: {num_cpus: 2, num_gpus: 1}\n")
    db = tmp_path / "h.duckdb"
    out = io.StringIO()
    dry_run(suite, ONLY, repeats=3, out=out, db_path=db)
    assert "estimated cost" not in out.getvalue()  # no store yet, no history
    summary = io.StringIO()
    outcome = run_suite(suite, db_path=db, only=ONLY, repeats=2, display=PlainDisplay(summary), executor=Canned(3.0))
    # 6 passes (2 rounds × plain, speculative, closing plain) × 3 s × 1 GPU / 2 CPUs
    assert (outcome.gpu_seconds, outcome.cpu_seconds) == (18.0, 36.0)
    assert "cost: 18.0 GPU-seconds, 36.0 CPU-seconds" in summary.getvalue()
    with Store.open(db, read_only=True) as store:
        _, rows = store.query("SELECT repeats, num_gpus, num_cpus, gpu_seconds, cpu_seconds, run_gpu_seconds FROM v_costs")
        # the speculative cell's 2 rounds, the plain cell's 2 rounds and 2 closing passes (repeats 2 + r)
        assert sorted(rows) == [(2, 1.0, 2.0, 6.0, 12.0, 18.0), (4, 1.0, 2.0, 12.0, 24.0, 18.0)]
        assert store.cell(outcome.run_id, outcome.outcomes[0].cell.cell_id, 0)["resources"] == \
            '{"num_cpus":2.0,"num_gpus":1.0}'

    out = io.StringIO()
    dry_run(suite, ONLY, repeats=3, out=out, db_path=db)
    text = out.getvalue()
    # 3 rounds × (plain, speculative, closing plain) = 9 passes of 3 GPU-s each
    assert "2 cells × 3 repeats = 9 cell runs (3 closing plain passes of speedup sandwiches)" in text
    assert f"estimated cost from run {outcome.run_id}: 27.0 GPU-seconds, 54.0 CPU-seconds for 9 of 9 cell runs" in text
    assert text.count("3.0 GPU-s  6.0 CPU-s per pass") == 2
    out = io.StringIO()
    dry_run(suite, ["task=gsm8k"], repeats=1, out=out, db_path=db)
    # 4 cells in 2 sandwiches: 6 runs; the known plain cell runs twice (opening, closing), its speculative one once
    assert "9.0 GPU-seconds, 18.0 CPU-seconds for 3 of 6 cell runs" in out.getvalue()
    assert out.getvalue().count("no history") == 2


def test_local_executor_stamps_the_suite_resources(tmp_path, data_env):
    from harness.executors import get_executor

    class Quick:
        def run_cell(self, cell, progress=None):
            raise RuntimeError("no model needed")

        def close(self):
            pass

    executor = get_executor("local")
    executor.backends["inhouse"] = Quick()
    suite = ci_with(tmp_path, "resources:\n  inhouse: {num_cpus: 2}\n")
    outcome = run_suite(suite, db_path=tmp_path / "h.duckdb", only=ONLY, repeats=1, display=PlainDisplay(io.StringIO()),
                        executor=executor)
    with Store.open(tmp_path / "h.duckdb", read_only=True) as store:
        _, rows = store.query("SELECT resources, gpu_seconds, cpu_seconds >= 0 FROM cells WHERE run_id = ?", [outcome.run_id])
    assert rows == [('{"num_cpus":2.0,"num_gpus":0.0}', 0.0, True)] * 3  # plain, speculative, closing plain


def test_run_command_executor_options(tmp_path, monkeypatch, capsys):
    db = tmp_path / "h.duckdb"
    assert main(["run", str(CI), "--db", str(db), "--address", "auto"]) == 2
    assert "--address needs --executor ray" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["run", str(CI), "--db", str(db), "--executor", "ray"]) == 2
    assert "pip install 'dspark-harness[ray]'" in capsys.readouterr().err
    assert not db.exists()
