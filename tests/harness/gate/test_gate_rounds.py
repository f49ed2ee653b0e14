"""The speedup gate over paired rounds: Welch's t on log per-round ratios (checked against scipy), an
interval that agrees with its p, a gate that fires at 3 rounds where Mann-Whitney cannot, and drifted
baselines reported as unstable."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from gate_tables import DSPARK, PLAIN, SynthRun, add_run, copy_run, new_store
from harness.gate import ExitCode, GateRule, run_gate
from harness.gate.rules import rounds_needed
from harness.gate.stats import repeats_test, rounds_test


@pytest.mark.parametrize("seed", range(4))
def test_rounds_test_is_welchs_t_on_log_ratios(seed):
    rng = np.random.default_rng(seed)
    base = np.exp(rng.normal(0.6, 0.05, size=3 + seed))
    cand = np.exp(rng.normal(0.55, 0.08, size=4))
    est = rounds_test(base, cand)
    ref = stats.ttest_ind(np.log(cand), np.log(base), equal_var=False)
    assert est.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert est.effect == pytest.approx(math.exp(np.log(cand).mean() - np.log(base).mean()) - 1)
    low, high = ref.confidence_interval(0.95)
    assert est.ci == pytest.approx((math.expm1(low), math.expm1(high)), rel=1e-9)


def test_the_interval_excludes_zero_exactly_when_p_is_below_alpha():
    rng = np.random.default_rng(7)
    for _ in range(200):
        base, cand = np.exp(rng.normal(0.5, 0.1, 3)), np.exp(rng.normal(0.5 + rng.normal(0, 0.15), 0.1, 3))
        est = rounds_test(base, cand)
        assert (est.ci[0] > 0 or est.ci[1] < 0) == (est.p_value < 0.05)


def test_mann_whitney_at_three_repeats_prints_no_interval_that_excludes_zero():
    est = repeats_test([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert est.p_value == pytest.approx(0.1) and est.ci == (-1.0, math.inf)  # relative: −100% … ∞, 0 inside


def test_rounds_needed():
    assert rounds_needed(GateRule("speedup", "higher", test="mann_whitney", min_samples=3)) == 4
    assert rounds_needed(GateRule("speedup", "higher", test="paired_rounds", min_samples=3)) == 3
    assert rounds_needed(GateRule("speedup", "higher", test="paired_rounds", min_samples=1)) == 2
    assert rounds_needed(GateRule("speedup", "higher", min_samples=3)) == 3  # paired_bootstrap: no prompt form
    assert rounds_needed(GateRule("acceptance_length", "higher")) is None
    assert rounds_needed(GateRule("throughput", "higher", test="threshold")) is None


def scale_throughput(conn, run_id: str, cell, factors) -> None:
    for rep, factor in enumerate(factors):
        conn.execute("UPDATE metrics SET value = value * ? WHERE run_id = ? AND cell_id = ? AND \"repeat\" = ? "
                     "AND metric = 'throughput'", [factor, run_id, cell.cell_id, rep])


@pytest.fixture
def runs():
    conn = new_store()
    add_run(conn, SynthRun("base", repeats=3))
    copy_run(conn, "base", "cand")
    scale_throughput(conn, "base", DSPARK, [1.0, 1.03, 0.98])  # per-round noise of the ratio
    scale_throughput(conn, "cand", DSPARK, [0.6, 0.62, 0.59])  # speculative decoding lost 40%
    return conn


def test_the_paired_rounds_gate_fires_at_three_rounds_where_mann_whitney_cannot(runs):
    rounds = GateRule("speedup", "higher", test="paired_rounds", relative=0.3, min_samples=3)
    report = run_gate((runs, "cand"), (runs, "base"), [rounds])
    (c,) = report.comparisons
    assert c.verdict == "regression" and c.estimate.p_value < 0.01 and c.estimate.ci[1] < -0.3
    assert report.exit_code == ExitCode.REGRESSION
    unpaired = GateRule("speedup", "higher", test="mann_whitney", relative=0.3, min_samples=3)
    (c,) = run_gate((runs, "cand"), (runs, "base"), [unpaired]).comparisons
    assert c.verdict == "inconclusive" and "n too small" in c.reason


def test_a_drifted_plain_baseline_is_unstable_never_pass_or_fail(runs):
    scale_throughput(runs, "cand", PLAIN, [1.0, 1.6, 1.0])
    scale_throughput(runs, "cand", DSPARK, [1.0, 1.6, 1.0])
    rules = [GateRule("speedup", "higher", test="paired_rounds", relative=0.3, min_samples=3),
             GateRule("throughput", "higher", test="mann_whitney", min_samples=1),
             GateRule("acceptance_length", "higher")]
    report = run_gate((runs, "cand"), (runs, "base"), rules)
    verdicts = {(c.cell_id, c.metric): c for c in report.comparisons}
    assert verdicts[(DSPARK.cell_id, "speedup")].verdict == "unstable"
    assert "plain baseline moved 62%" in verdicts[(DSPARK.cell_id, "speedup")].reason
    assert verdicts[(PLAIN.cell_id, "throughput")].verdict == "unstable"
    assert verdicts[(DSPARK.cell_id, "acceptance_length")].verdict == "pass"  # not a timing metric
    assert report.exit_code == ExitCode.OK and "unstable" in report.summary
