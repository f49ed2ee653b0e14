"""run_gate end to end on synthetic runs in DuckDB: reruns pass, doctored regressions fail, and the exit
codes for incomparable, invalid and failed runs."""

from __future__ import annotations

from dataclasses import replace

import duckdb
import pytest

from gate_tables import (
    DSPARK,
    PLAIN,
    V_SPEEDUP,
    SynthCell,
    SynthRun,
    add_run,
    copy_run,
    create_tables,
    lower_acceptance,
    new_store,
)
from harness.gate import ExitCode, GateRule, Validity, run_gate, to_text
from harness.gate.evaluate import seed_for

RULES = [
    GateRule("acceptance_length", "higher"),
    GateRule("accepted_per_step", "higher"),
    GateRule("ece_raw", "lower", relative=None, absolute=0.01),
    GateRule("ece_calibrated", "lower", relative=None, absolute=0.01),
    GateRule("throughput", "higher", test="mann_whitney", min_samples=1),
    GateRule("window_s", "higher", test="threshold"),
]


@pytest.fixture
def store():
    conn = new_store()
    add_run(conn, SynthRun("base"))
    return conn


def by(report, metric, cell=DSPARK):
    (c,) = [c for c in report.comparisons if c.metric == metric and c.cell_id == cell.cell_id]
    return c


def test_identical_rerun_passes(store):
    copy_run(store, "base", "cand")
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert report.exit_code == ExitCode.OK, to_text(report)
    tau = by(report, "acceptance_length")
    assert tau.verdict == "pass" and tau.estimate.effect == 0 and tau.estimate.p_value == 1.0
    assert tau.estimate.n == 50
    assert by(report, "ece_calibrated").estimate.effect == 0
    # ECE does not apply to plain decoding: no comparison, not an inconclusive one.
    assert not [c for c in report.comparisons if c.cell_id == PLAIN.cell_id and c.metric.startswith("ece")]
    assert {c.verdict for c in report.comparisons} <= {"pass", "inconclusive"}


def test_baseline_from_another_connection(store):
    """CI: the baseline is an export loaded into an in-memory database, the candidate lives in the store."""
    other = copy_run(store, "base", "base", dst=create_tables(duckdb.connect()))
    copy_run(store, "base", "cand")
    report = run_gate((store, "cand"), (other, "base"), RULES)
    assert report.exit_code == ExitCode.OK
    assert by(report, "acceptance_length").estimate.effect == 0


def test_doctored_regression_fails_and_names_metric_and_cell(store):
    copy_run(store, "base", "cand")
    lower_acceptance(store, "cand", DSPARK)
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert report.exit_code == ExitCode.REGRESSION
    tau = by(report, "acceptance_length")
    assert tau.verdict == "regression"
    assert tau.estimate.effect < -0.02 and tau.estimate.p_value < 0.05 and tau.estimate.ci[1] < 0
    text = to_text(report)
    line = next(l for l in text.splitlines() if l.startswith("REGRESSION") and "acceptance_length" in l)
    assert DSPARK.label in line and "→" in line and "CI" in line and "detectable ≥" in line
    # Plain decoding has no drafting step, so no τ (harness.metrics.acceptance): no comparison at all.
    assert not [c for c in report.comparisons if c.cell_id == PLAIN.cell_id and c.metric == "acceptance_length"]


def test_warn_level_regression_is_reported_but_passes(store):
    copy_run(store, "base", "cand")
    lower_acceptance(store, "cand", DSPARK)
    report = run_gate((store, "cand"), (store, "base"), [GateRule("acceptance_length", "higher", level="warn")])
    assert report.exit_code == ExitCode.OK
    assert "REGRESSION (warn)" in to_text(report)
    assert report.summary.startswith("PASS") and "1 warning" in report.summary


def test_a_worse_confidence_head_is_an_ece_regression(store):
    copy_run(store, "base", "cand")
    store.execute("UPDATE step_confidences SET logit = logit + 2 WHERE run_id = 'cand'")
    report = run_gate((store, "cand"), (store, "base"), RULES)
    ece = by(report, "ece_raw")
    assert ece.verdict == "regression" and ece.estimate.scale == "absolute" and ece.estimate.effect > 0.01
    assert by(report, "acceptance_length").verdict == "pass"  # acceptance did not change
    assert report.exit_code == ExitCode.REGRESSION


def test_gate_is_deterministic(store):
    copy_run(store, "base", "cand")
    lower_acceptance(store, "cand", DSPARK, every=7)
    a = run_gate((store, "cand"), (store, "base"), RULES)
    b = run_gate((store, "cand"), (store, "base"), RULES)
    assert to_text(a) == to_text(b)
    assert seed_for(DSPARK.cell_id) == seed_for(DSPARK.cell_id) != seed_for(PLAIN.cell_id)


def test_conversations_are_the_resampled_unit():
    conn = new_store()
    mt = SynthCell(task="mt_bench", turns=2, num_prompts=20)
    add_run(conn, SynthRun("base", cells=[mt]))
    copy_run(conn, "base", "cand")
    report = run_gate((conn, "cand"), (conn, "base"), [GateRule("acceptance_length", "higher")])
    assert by(report, "acceptance_length", mt).estimate.n == 20  # 40 prompts, 20 conversations


def test_no_comparable_baseline_names_what_differs(store):
    add_run(store, SynthRun("cand", host_fingerprint="host-b", packages={"torch": "2.14.0", "transformers": "4.56.0",
                                                                          "numpy": "9"}))
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert report.exit_code == ExitCode.NO_BASELINE
    assert not report.comparisons
    reasons = "; ".join(r for m in report.unmatched for r in m.reasons)
    assert "host fingerprint: host-a → host-b" in reasons
    assert "package torch: 2.13.0 → 2.14.0" in reasons
    assert "numpy" not in reasons  # only the packages that do the work
    assert "NO BASELINE" in to_text(report)


def test_changed_draft_is_named(store):
    run = SynthRun("cand")
    add_run(store, replace(run, provenance={**run.provenance, "draft_hash": "d2"}))
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert report.exit_code == ExitCode.NO_BASELINE
    assert any("provenance draft_hash: d1 → d2" in r for m in report.unmatched for r in m.reasons)


def test_new_cell_without_baseline_is_skipped_not_failed(store):
    fresh = SynthCell(drafter="dflash", method="dflash")
    add_run(store, SynthRun("cand", cells=[PLAIN, DSPARK, fresh]))
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert report.exit_code == ExitCode.OK
    assert [m.cell_id for m in report.unmatched] == [fresh.cell_id]
    assert report.unmatched[0].reasons == ("no baseline cell with this id",)


def test_interrupted_run_is_invalid(store):
    copy_run(store, "base", "cand")
    store.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = 'cand'")
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert report.exit_code == ExitCode.INVALID
    assert any("'interrupted'" in r for r in report.validity.reasons)
    assert not report.comparisons


def test_too_few_requests_is_invalid(store):
    copy_run(store, "base", "cand")
    report = run_gate((store, "cand"), (store, "base"), RULES, Validity(min_requests=51, min_duration_s=200))
    assert report.exit_code == ExitCode.INVALID
    text = "\n".join(report.validity.reasons)
    assert "50 succeeded requests in the window < min_requests 51" in text  # the warm-up request does not count
    assert "< min_duration_s 200" in text


def test_failed_requests_beyond_the_allowance_are_invalid(store):
    copy_run(store, "base", "cand")
    store.execute("UPDATE requests SET error = 'oom' WHERE run_id = 'cand' AND request_id IN ('r1-0', 'r2-0')")
    assert run_gate((store, "cand"), (store, "base"), RULES).exit_code == ExitCode.INVALID
    ok = run_gate((store, "cand"), (store, "base"), RULES, Validity(max_failed_fraction=0.05))
    assert ok.exit_code == ExitCode.OK
    assert by(ok, "acceptance_length").estimate.n == 48  # the failed prompts are not paired


def test_failed_cell_fails_the_gate(store):
    copy_run(store, "base", "cand")
    store.execute("UPDATE cells SET status = 'failed', error = 'Traceback …\nRuntimeError: CUDA error' "
                  "WHERE run_id = 'cand' AND cell_id = ?", [DSPARK.cell_id])
    report = run_gate((store, "cand"), (store, "base"), RULES, Validity(max_failed_fraction=0.5))
    assert report.exit_code == ExitCode.REGRESSION
    assert [f.cell_id for f in report.failed_cells] == [DSPARK.cell_id]
    assert "FAILED CELL" in to_text(report) and "RuntimeError: CUDA error" in to_text(report)
    # Beyond the allowance of failed cells (default: none) the run is not judged at all.
    assert run_gate((store, "cand"), (store, "base"), RULES).exit_code == ExitCode.INVALID


def test_unfinished_baseline_is_no_baseline(store):
    copy_run(store, "base", "cand")
    store.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = 'base'")
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert report.exit_code == ExitCode.NO_BASELINE
    assert report.notes


def test_speedup_from_the_view_or_computed_agree():
    from harness.gate.data import has_relation

    computed, viewed = new_store(), new_store()
    computed.execute("DROP VIEW IF EXISTS v_speedup")
    if not has_relation(viewed, "v_speedup"):  # the store's own view where the tables are the store's
        viewed.execute(V_SPEEDUP)
    rules = [GateRule("speedup", "higher", test="mann_whitney", min_samples=2)]
    reports = []
    for conn in (computed, viewed):
        add_run(conn, SynthRun("base", repeats=2))
        copy_run(conn, "base", "cand")
        reports.append(run_gate((conn, "cand"), (conn, "base"), rules))
    for report in reports:
        (c,) = report.comparisons  # the plain cell has no speedup over itself
        assert c.cell_id == DSPARK.cell_id
        assert c.estimate.baseline == pytest.approx(2.5)
        assert c.verdict == "inconclusive" and "n too small to detect anything at alpha" in c.reason
    assert reports[0].comparisons[0].estimate == reports[1].comparisons[0].estimate


def test_threshold_rule_compares_means_without_statistics(store):
    copy_run(store, "base", "cand")
    store.execute("UPDATE metrics SET value = value * 0.9 WHERE run_id = 'cand' AND metric = 'throughput'")
    rule = GateRule("throughput", "higher", test="threshold", relative=0.05)
    report = run_gate((store, "cand"), (store, "base"), [rule])
    c = by(report, "throughput")
    assert c.verdict == "regression" and c.estimate.p_value is None
    assert c.estimate.effect == pytest.approx(-0.1)
    assert report.exit_code == ExitCode.REGRESSION


def test_bootstrap_rule_on_a_repeat_metric_falls_back_to_mann_whitney(store):
    copy_run(store, "base", "cand")
    report = run_gate((store, "cand"), (store, "base"), [GateRule("throughput", "higher", min_samples=1)])
    c = by(report, "throughput")
    assert c.estimate.method == "mann_whitney" and "Mann-Whitney over repeats" in c.estimate.note


def test_misspelt_metric_is_noted(store):
    copy_run(store, "base", "cand")
    report = run_gate((store, "cand"), (store, "base"), [GateRule("acceptence_length", "higher", test="mann_whitney")])
    assert report.exit_code == ExitCode.OK and not report.comparisons
    assert any("acceptence_length" in n for n in report.notes)


def test_unknown_test_is_an_error(store):
    copy_run(store, "base", "cand")
    with pytest.raises(ValueError, match="test must be one of"):
        run_gate((store, "cand"), (store, "base"), [GateRule("acceptance_length", "higher", test="t_test")])
    with pytest.raises(ValueError, match="direction must be one of"):
        run_gate((store, "cand"), (store, "base"), [GateRule("acceptance_length", "up")])


def test_calibrated_ece_uses_each_runs_own_temperatures(store):
    copy_run(store, "base", "cand")
    store.execute("UPDATE cells SET sts_temperatures = '[0.3,0.3,0.3,0.3,0.3,0.3,0.3]' WHERE run_id = 'cand'"
                  " AND method <> 'none'")
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert by(report, "ece_raw").estimate.effect == 0
    assert by(report, "ece_calibrated").verdict == "regression"


def test_calibrated_ece_applies_each_runs_level_offsets(store):
    torch = pytest.importorskip("torch")
    from dspark_core.calibration import expected_calibration_error
    from harness.gate import data

    copy_run(store, "base", "cand")
    store.execute("UPDATE cells SET sts_offsets = '[-0.5,-0.5,-0.5,-0.5,-0.5,-0.5,-0.5]' WHERE run_id = 'cand'"
                  " AND method <> 'none'")
    report = run_gate((store, "cand"), (store, "base"), RULES)
    assert by(report, "ece_raw").estimate.effect == 0
    cycles = data.confidence_cycles(store, "cand", DSPARK.cell_id)
    args = (torch.tensor(cycles.logits), torch.tensor(cycles.num_verified), torch.tensor(cycles.num_accepted))
    temps = torch.full((7,), 1.6, dtype=torch.float64)
    shifted = expected_calibration_error(*args, temperatures=temps, offsets=torch.full((7,), -0.5, dtype=torch.float64))
    assert by(report, "ece_calibrated").estimate.candidate == pytest.approx(shifted.ece, rel=1e-12)
    assert shifted.ece != pytest.approx(expected_calibration_error(*args, temperatures=temps).ece, rel=1e-3)


def test_gate_ece_equals_dspark_core_on_the_stored_rows(store):
    torch = pytest.importorskip("torch")
    from dspark_core.calibration import expected_calibration_error
    from harness.gate import data

    copy_run(store, "base", "cand")
    report = run_gate((store, "cand"), (store, "base"), RULES)
    cycles = data.confidence_cycles(store, "base", DSPARK.cell_id)
    args = (torch.tensor(cycles.logits), torch.tensor(cycles.num_verified), torch.tensor(cycles.num_accepted))
    raw = expected_calibration_error(*args).ece
    calibrated = expected_calibration_error(*args, temperatures=torch.full((7,), 1.6, dtype=torch.float64)).ece
    assert by(report, "ece_raw").estimate.baseline == pytest.approx(raw, rel=1e-12)
    assert by(report, "ece_calibrated").estimate.baseline == pytest.approx(calibrated, rel=1e-12)


def test_prompts_of_one_run_only_are_left_out_and_noted(store):
    copy_run(store, "base", "cand")
    store.execute("DELETE FROM requests WHERE run_id = 'cand' AND request_id IN ('r3-0', 'r4-0')")
    tau = by(run_gate((store, "cand"), (store, "base"), RULES), "acceptance_length")
    assert tau.estimate.n == 48 and tau.estimate.effect == 0
    assert "2 prompts measured by one run only" in tau.estimate.note
