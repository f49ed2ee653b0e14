"""Every field the GPU suite uses is exercised on the CPU by a suite CI runs.

`fields` lists what a suite uses: its key paths (named entries as `*`), and the values that select code
(drafter methods, policies, backends, dtypes, gate tests, levels and metrics, multi-turn). The coverage test
checks h100.yaml's against the union of the CI-run suites' (ci.yaml, ci-fields.yaml, and vLLM-cpu's once it
exists), less what cannot run on a CPU, each with its reason. The slow test runs ci-fields.yaml as CI does:
every cell ok, goodput and SLA attainment stored for each, its gates evaluated."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from harness.suite import expand, load_suite

REPO = Path(__file__).resolve().parents[2]
# CI-run suite → the file that runs it (checked: that file names the suite)
CI_SUITES = {"ci.yaml": ".ci/run", "ci-fields.yaml": "tests/harness/test_ci_fields.py",
             "vllm-cpu.yaml": "scripts/ci_vllm.sh"}
NOT_ON_CPU = {
    "backend=sglang": "SGLang has no CPU build; tests/backends/sglang replay its responses from a stand-in",
    "backend_options.sglang": "SGLang's options: no CPU build",
    "backend_options.sglang.mem_fraction_static": "an SGLang flag, passed through as it is",
    "backend_options.vllm.gpu_memory_utilization": "a vLLM flag passed through as it is; "
                                                   "test_every_h100_vllm_argv_parses_with_the_real_vllm checks it",
}
ONCE_VLLM_CPU_IS_MERGED = {"backend=vllm", "backend_options.vllm"}  # suites/vllm-cpu.yaml (its own helper)
SERVE_PORT = 18437  # ci-fields.yaml's backend_options.openai.base_url


def fields(path: Path) -> set[str]:
    """What the suite at `path` uses (includes merged): key paths, and the values that select code."""
    suite = load_suite(path)
    doc = yaml.safe_load(suite.resolved_text)
    out: set[str] = set()

    def walk(node, prefix: str, named: bool) -> None:
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            name = "*" if named else str(key)
            here = f"{prefix}.{name}" if prefix else name
            out.add(here)
            walk(value, here, named=here in ("targets", "drafters", "tasks", "policies", "gates"))

    walk(doc, "", named=False)
    out.update(f"backend_options.{b}.{k}" for b, opts in (doc.get("backend_options") or {}).items() for k in opts)
    out.update(f"backend_options.{b}" for b in doc.get("backend_options") or {})
    out.discard("backend_options.*")
    out.update(f"gates={metric}" for metric in doc.get("gates") or {})
    for key in ("test", "level", "direction"):
        out.update(f"gates.{key}={rule[key]}" for rule in (doc.get("gates") or {}).values() if key in rule)
    for cell in expand(suite):
        out |= {f"backend={cell.backend}", f"method={cell.drafter.method}", f"policy={cell.policy.name}",
                f"dtype={cell.target.dtype}", f"multi_turn={cell.task.multi_turn and cell.task.name == 'mt_bench'}",
                f"load={'concurrency' if cell.concurrency is not None else 'rate'}", f"sla={cell.sla is not None}"}
    return out


def test_every_h100_field_is_exercised_by_a_suite_ci_runs():
    covered: set[str] = set()
    for suite, runner in CI_SUITES.items():
        if (REPO / "suites" / suite).exists():
            assert suite in (REPO / runner).read_text(), f"{runner} does not run suites/{suite}"
            covered |= fields(REPO / "suites" / suite)
    pending = ONCE_VLLM_CPU_IS_MERGED if not (REPO / "suites" / "vllm-cpu.yaml").exists() else set()
    missing = fields(REPO / "suites" / "h100.yaml") - covered - set(NOT_ON_CPU) - pending
    assert not missing, f"h100.yaml uses what no CI-run suite exercises: {sorted(missing)}"
    h100 = fields(REPO / "suites" / "h100.yaml")
    for key in ("sla.ttft_s", "validity.min_requests", "gates=speedup", "multi_turn=True", "method=eagle3",
                "policy=adaptive", "backend=vllm"):
        assert key in h100  # the extraction sees what the suite holds


@pytest.mark.slow
def test_the_ci_fields_suite_runs_every_cell_ok_with_its_sla_and_gates(tmp_path, data_env, capsys):
    from backends.process import ServerProcess
    from harness.cli import main
    from harness.store import read_only_query

    serve = [sys.executable, "-m", "harness", "serve", "--port", str(SERVE_PORT), "--drafter-method", "dspark",
             "--drafter-checkpoint", "embedded:dspark", "--num-drafts", "3", "--num-threads", "1"]
    db = tmp_path / "fields.duckdb"
    with ServerProcess(serve, f"http://127.0.0.1:{SERVE_PORT}/health", cwd=REPO, startup_timeout_s=120):
        assert main(["run", str(REPO / "suites" / "ci-fields.yaml"), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "16 ok, 0 failed" in out  # 14 cells, and the closing plain pass of each c1 speedup sandwich
    _, rows = read_only_query(db, "select count(distinct cell_id) from metrics where metric = 'goodput'")
    _, attained = read_only_query(db, "select count(distinct cell_id) from metrics where metric = 'sla_attainment'")
    assert rows[0][0] == attained[0][0] == 14
    _, runs = read_only_query(db, "select run_id from runs")
    run_id = runs[0][0]
    assert main(["gate", "--db", str(db), "--run", run_id, "--baseline", run_id]) == 0  # every gate judged
    report = capsys.readouterr().out
    for metric in ("acceptance_length", "ece_calibrated", "throughput", "speedup", "tpot_p50"):
        assert f"PASS         {metric}" in report
