"""The speedup gate over paired rounds: Mann-Whitney with the Hodges-Lehmann shift on log per-round ratios
(checked against scipy), an interval that agrees with its p, a gate that fires at 4 rounds and holds
against one round a load step broke, and drifted baselines — across rounds or inside a round's plain
sandwich — reported as unstable."""

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
def test_rounds_test_is_mann_whitney_with_the_hodges_lehmann_shift_of_log_ratios(seed):
    rng = np.random.default_rng(seed)
    base = np.exp(rng.normal(0.6, 0.05, size=4 + seed))
    cand = np.exp(rng.normal(0.55, 0.08, size=5))
    est = rounds_test(base, cand)
    ref = stats.mannwhitneyu(np.log(cand), np.log(base), method="exact")
    assert est.method == "paired_rounds" and est.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    diffs = (np.log(cand)[None, :] - np.log(base)[:, None]).ravel()
    assert est.effect == pytest.approx(math.expm1(np.median(diffs)))
    assert est.baseline == pytest.approx(math.exp(np.median(np.log(base))))  # the run summary's median ratio
    assert est.candidate == pytest.approx(math.exp(np.median(np.log(cand))))


def test_the_interval_excludes_zero_exactly_when_p_is_below_alpha():
    rng = np.random.default_rng(7)
    for n in (4, 5, 6):
        for _ in range(150):
            base, cand = np.exp(rng.normal(0.5, 0.1, n)), np.exp(rng.normal(0.5 + rng.normal(0, 0.15), 0.1, n))
            est = rounds_test(base, cand)
            assert (est.ci[0] > 0 or est.ci[1] < 0) == (est.p_value < 0.05)


def test_one_round_a_load_step_broke_moves_the_rank_test_but_not_welchs_t():
    """Six quiet rounds a side, the same speedup; in the candidate one round's pairing broke (its ratio
    is 2.5× off). Welch's t on the logs, the test before, reads a significant change; the rank test
    does not, and its shift stays near 0."""
    rng = np.random.default_rng(11)
    base = np.exp(rng.normal(0.7, 0.02, 6))
    cand = np.exp(rng.normal(0.7, 0.02, 6))
    cand[2] *= 2.5
    welch = stats.ttest_ind(np.log(cand), np.log(base), equal_var=False)
    est = rounds_test(base, cand)
    assert est.p_value > 0.05 and abs(est.effect) < 0.03
    assert welch.pvalue > 0.05 or abs(math.expm1(np.log(cand).mean() - np.log(base).mean())) > 0.1


def test_mann_whitney_at_three_repeats_prints_no_interval_that_excludes_zero():
    est = repeats_test([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert est.p_value == pytest.approx(0.1) and est.ci == (-1.0, math.inf)  # relative: −100% … ∞, 0 inside
    assert rounds_test([1.0, 1.1, 1.2], [2.0, 2.1, 2.2]).ci == (-1.0, math.inf)


def test_rounds_needed():
    assert rounds_needed(GateRule("speedup", "higher", test="mann_whitney", min_samples=3)) == 4
    assert rounds_needed(GateRule("speedup", "higher", test="paired_rounds", min_samples=3)) == 4
    assert rounds_needed(GateRule("speedup", "higher", test="paired_rounds", min_samples=6)) == 6
    assert rounds_needed(GateRule("speedup", "higher", test="paired_rounds", alpha=0.01, min_samples=1)) == 5
    assert rounds_needed(GateRule("speedup", "higher", min_samples=3)) == 4  # paired_bootstrap: no prompt form
    assert rounds_needed(GateRule("acceptance_length", "higher")) is None
    assert rounds_needed(GateRule("throughput", "higher", test="threshold")) is None


def scale_throughput(conn, run_id: str, cell, factors) -> None:
    for rep, factor in enumerate(factors):
        conn.execute("UPDATE metrics SET value = value * ? WHERE run_id = ? AND cell_id = ? AND \"repeat\" = ? "
                     "AND metric = 'throughput'", [factor, run_id, cell.cell_id, rep])


@pytest.fixture(params=[False, True], ids=["one plain pass", "sandwich"])
def runs(request):
    conn = new_store()
    add_run(conn, SynthRun("base", repeats=4, sandwich=request.param))
    copy_run(conn, "base", "cand")
    scale_throughput(conn, "base", DSPARK, [1.0, 1.03, 0.98, 1.01])  # per-round noise of the ratio
    scale_throughput(conn, "cand", DSPARK, [0.6, 0.62, 0.59, 0.61])  # speculative decoding lost 40%
    return conn


def test_the_paired_rounds_gate_fires_at_four_rounds_and_not_at_three(runs):
    rounds = GateRule("speedup", "higher", test="paired_rounds", relative=0.3, min_samples=3)
    report = run_gate((runs, "cand"), (runs, "base"), [rounds])
    (c,) = report.comparisons
    assert c.verdict == "regression" and c.estimate.p_value < 0.05 and c.estimate.ci[1] < -0.3
    assert report.exit_code == ExitCode.REGRESSION
    runs.execute("DELETE FROM cells WHERE \"repeat\" = 3 AND run_id = 'cand'")
    runs.execute("DELETE FROM metrics WHERE \"repeat\" = 3 AND run_id = 'cand'")
    (c,) = run_gate((runs, "cand"), (runs, "base"), [rounds]).comparisons
    assert c.verdict == "inconclusive" and "n too small" in c.reason


def test_a_drifted_plain_baseline_is_unstable_never_pass_or_fail(runs):
    scale_throughput(runs, "cand", PLAIN, [1.0, 1.6, 1.0, 1.0])
    scale_throughput(runs, "cand", DSPARK, [1.0, 1.6, 1.0, 1.0])
    rules = [GateRule("speedup", "higher", test="paired_rounds", relative=0.3, min_samples=3),
             GateRule("throughput", "higher", test="mann_whitney", min_samples=1),
             GateRule("acceptance_length", "higher")]
    report = run_gate((runs, "cand"), (runs, "base"), rules)
    verdicts = {(c.cell_id, c.metric): c for c in report.comparisons}
    assert verdicts[(DSPARK.cell_id, "speedup")].verdict == "unstable"
    assert "plain baseline moved" in verdicts[(DSPARK.cell_id, "speedup")].reason
    assert verdicts[(PLAIN.cell_id, "throughput")].verdict == "unstable"
    assert verdicts[(DSPARK.cell_id, "acceptance_length")].verdict == "pass"  # not a timing metric
    assert report.exit_code == ExitCode.OK and "unstable" in report.summary


def test_plain_passes_apart_inside_half_the_rounds_are_unstable():
    conn = new_store()
    add_run(conn, SynthRun("base", repeats=4, sandwich=True))
    copy_run(conn, "base", "cand")
    rule = GateRule("speedup", "higher", test="paired_rounds", relative=0.3, min_samples=3)
    assert run_gate((conn, "cand"), (conn, "base"), [rule]).comparisons[0].verdict == "pass"
    for rep in (4, 6):  # the closing passes of rounds 0 and 2 ran 12% faster (≈ 16% above the opening ones)
        conn.execute("UPDATE metrics SET value = value * 1.12 WHERE run_id = 'cand' AND cell_id = ? AND \"repeat\" = ? "
                     "AND metric = 'throughput'", [PLAIN.cell_id, rep])
    (c,) = run_gate((conn, "cand"), (conn, "base"), [rule]).comparisons
    assert c.verdict == "unstable" and "inside 2 of 4 rounds" in c.reason
