"""Comparability per metric: acceptance and ECE are judged against a baseline from another machine, speed
metrics there say "hardware differs", and exit 3 is left for runs where nothing at all could be compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate_tables import DSPARK, PLAIN, SynthRun, add_run, copy_run, lower_acceptance, new_store
from harness.gate import ExitCode, GateRule, run_gate, to_junit, to_markdown, to_text
from harness.metrics.dependencies import CONTENT, HARDWARE, declared, depends_on

CI_RULES = [  # the gates of suites/ci.yaml, and a speed gate that can fire
    GateRule("acceptance_length", "higher", relative=0.01),
    GateRule("ece_calibrated", "lower", relative=None, absolute=0.02),
    GateRule("throughput", "higher", test="mann_whitney", min_samples=1),
    GateRule("speedup", "higher", test="mann_whitney", relative=0.3, min_samples=1, level="warn"),
]


def another_cpu(conn, run_id: str) -> None:
    """Doctor a run into one measured on another CPU: the host, its fingerprint and the stored key (which
    folds the host in) change; params, packages and provenance stay."""
    conn.execute("UPDATE runs SET host_fingerprint = 'host-b', host = ? WHERE run_id = ?",
                 [json.dumps({"cpu": "other-cpu", "gpu": None}), run_id])
    conn.execute("UPDATE cells SET comparability_key = 'k-' || cell_id WHERE run_id = ?", [run_id])


@pytest.fixture
def store():
    conn = new_store()
    add_run(conn, SynthRun("base", repeats=3))
    copy_run(conn, "base", "cand")
    another_cpu(conn, "base")
    return conn


def by(report, metric, cell=DSPARK):
    (c,) = [c for c in report.comparisons if c.metric == metric and c.cell_id == cell.cell_id]
    return c


def test_baseline_from_another_cpu_gates_acceptance_and_ece_speed_says_hardware_differs(store):
    report = run_gate((store, "cand"), (store, "base"), CI_RULES)
    assert report.exit_code == ExitCode.OK, to_text(report)
    assert by(report, "acceptance_length").verdict == "pass"
    assert by(report, "acceptance_length").estimate.n == 50
    assert by(report, "ece_calibrated").verdict == "pass"
    for metric in ("throughput", "speedup"):
        speed = by(report, metric)
        assert speed.verdict == "incomparable" and speed.estimate is None
        assert speed.reason.startswith("hardware differs: host fingerprint: host-b → host-a")
    assert not report.unmatched  # the cells compare, on their content metrics
    assert "incomparable" in report.summary and report.summary.startswith("PASS")
    text = to_text(report)
    assert "INCOMPARABLE throughput" in text and "hardware differs" in text
    assert "↔️ incomparable" in to_markdown(report)
    assert 'skipped message="incomparable: hardware differs' in to_junit(report)


def test_doctored_acceptance_against_another_cpu_fails(store):
    lower_acceptance(store, "cand", DSPARK)
    report = run_gate((store, "cand"), (store, "base"), CI_RULES)
    assert report.exit_code == ExitCode.REGRESSION, to_text(report)
    assert by(report, "acceptance_length").verdict == "regression"
    assert by(report, "throughput").verdict == "incomparable"


def test_only_speed_gates_on_another_cpu_compare_nothing(store):
    report = run_gate((store, "cand"), (store, "base"), CI_RULES[2:])
    assert report.exit_code == ExitCode.NO_BASELINE
    assert {c.verdict for c in report.comparisons} == {"incomparable"}


def test_same_machine_still_gates_speed():
    conn = new_store()
    add_run(conn, SynthRun("base", repeats=3))
    copy_run(conn, "base", "cand")
    report = run_gate((conn, "cand"), (conn, "base"), CI_RULES)
    speed = by(report, "throughput")
    assert speed.verdict != "incomparable" and speed.estimate is not None and speed.estimate.n == 3


def test_another_device_kind_is_other_content(store):
    """cpu → cuda changes the kernels, so acceptance is not compared either; the ordinal does not."""
    store.execute("UPDATE cells SET provenance = json_merge_patch(provenance, '{\"device\": \"cuda:1\"}') "
                  "WHERE run_id = 'base'")
    store.execute("UPDATE cells SET provenance = json_merge_patch(provenance, '{\"device\": \"cuda\"}') "
                  "WHERE run_id = 'cand'")
    assert by(run_gate((store, "cand"), (store, "base"), CI_RULES), "acceptance_length").verdict == "pass"
    store.execute("UPDATE cells SET provenance = json_merge_patch(provenance, '{\"device\": \"cpu\"}') "
                  "WHERE run_id = 'cand'")
    report = run_gate((store, "cand"), (store, "base"), CI_RULES)
    assert report.exit_code == ExitCode.NO_BASELINE
    reasons = "; ".join(r for m in report.unmatched for r in m.reasons)
    assert "provenance device: cuda → cpu" in reasons and "host fingerprint" in reasons
    assert {m.cell_id for m in report.unmatched} == {PLAIN.cell_id, DSPARK.cell_id}


@pytest.mark.parametrize("name, scope", [
    ("acceptance_length", CONTENT), ("position_acceptance_conditional_k3", CONTENT), ("ece_calibrated", CONTENT),
    ("brier_raw", CONTENT), ("throughput", HARDWARE), ("speedup", HARDWARE), ("ttft_p99", HARDWARE),
    ("user_speed_mean", HARDWARE), ("step_time_p50", HARDWARE), ("no_such_metric", HARDWARE),
])
def test_scopes_resolve_by_base_name(name, scope):
    assert depends_on(name) == scope


def test_every_stored_metric_declares_its_scope():
    """Each metric of a real run (the CI baseline) is declared beside its definition."""
    path = Path(__file__).resolve().parents[3] / "results" / "baselines" / "ci.json"
    table = json.loads(path.read_text())["tables"]["metrics"]
    col = table["columns"].index("metric")
    names = {row[col] for row in table["rows"]}
    assert len(names) > 20
    assert [n for n in sorted(names) if declared(n) is None] == []
