"""The gate's statistics on known cases: bootstrap, ECE under the bootstrap, Mann-Whitney, Hodges-Lehmann."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from harness.gate import stats
from harness.gate.rules import GateRule
from harness.gate.stats import (
    bootstrap_interval,
    EceTable,
    bootstrap_p_value,
    ece_bootstrap,
    ece_table,
    hodges_lehmann,
    mann_whitney,
    mde_factor,
    midranks,
    ratio_bootstrap,
    ratio_statistic,
    repeats_test,
)
from harness.gate.verdict import judge

TAU = GateRule("acceptance_length", "higher")


def prompts(n: int, seed: int = 0, steps: int = 20, gamma: int = 7):
    """Per-prompt (Σ(accepted + 1), steps) of a drafter with prompt-dependent quality."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.5, 0.9, size=n)
    accepted = np.array([rng.binomial(gamma, qi, size=steps).sum() for qi in q], dtype=float)
    den = np.full(n, float(steps))
    return accepted + den, den


def test_identical_data_has_no_effect_and_passes():
    num, den = prompts(50)
    est = ratio_bootstrap(num, den, num.copy(), den.copy(), seed=1)
    assert est.effect == 0 and est.ci == (0.0, 0.0)
    assert est.p_value == 1.0
    assert judge(TAU, est)[0] == "pass"


def test_ten_percent_drop_on_50_prompts_is_a_regression():
    num, den = prompts(50)
    rng = np.random.default_rng(5)
    cand = num * 0.9 * rng.uniform(0.97, 1.03, size=num.size)  # a 10% drop with prompt-level noise
    est = ratio_bootstrap(num, den, cand, den, seed=2)
    assert est.scale == "relative"
    assert est.effect == pytest.approx(cand.sum() / num.sum() - 1)
    assert est.ci[0] < est.effect < est.ci[1] < 0
    assert est.p_value < 0.01 and est.p_value >= 2 / 2001
    verdict, why = judge(TAU, est)
    assert verdict == "regression", why
    # The same drop read as "lower is better" is an improvement; under a 15% allowance a pass.
    assert judge(GateRule("acceptance_length", "lower"), est)[0] == "improvement"
    assert judge(GateRule("acceptance_length", "higher", relative=0.15), est)[0] == "pass"


def test_ratio_is_a_ratio_of_sums_not_a_mean_of_ratios():
    base_num, base_den = np.array([4.0, 300.0]), np.array([2.0, 100.0])  # τ per prompt 2 and 3
    est = ratio_bootstrap(base_num, base_den, base_num, base_den, resamples=10)
    assert est.baseline == pytest.approx(304 / 102)


def test_mde_shrinks_with_more_prompts():
    def mde(n):
        num, den = prompts(n, seed=n)
        rng = np.random.default_rng(n + 1)
        cand = num * rng.uniform(0.95, 1.05, size=n)
        return ratio_bootstrap(num, den, cand, den, seed=3).mde

    small, large = mde(25), mde(400)
    assert large < small / 2.5  # ≈ 1/√16 = 1/4 in expectation


def test_mde_is_2_8_bootstrap_standard_errors_at_alpha_0_05():
    assert mde_factor(0.05) == pytest.approx(1.95996 + 0.84162, abs=1e-4)


def test_bootstrap_is_reproducible_for_a_seed():
    num, den = prompts(30)
    cand = num * 0.97
    a, b = (ratio_bootstrap(num, den, cand, den, seed=9) for _ in range(2))
    assert a == b


def test_the_one_sample_interval_covers_a_ratio_of_sums_as_the_normal_theory_does():
    """The card's form: the same draws, one statistic. For a ratio of sums over 400 units its percentile
    interval matches the delta-method interval to a few percent, and it brackets the estimate."""
    rng = np.random.default_rng(3)
    den = rng.integers(5, 30, 400).astype(float)
    num = rng.binomial(den.astype(int), 0.6).astype(float)
    value, low, high = bootstrap_interval(ratio_statistic(num, den), 400, resamples=4000)
    r = num.sum() / den.sum()
    se = math.sqrt(np.sum((num - r * den) ** 2)) / den.sum()  # delta method for a ratio estimator
    assert value == pytest.approx(r) and low < r < high
    assert (high - low) == pytest.approx(2 * 1.96 * se, rel=0.08)
    assert bootstrap_interval(ratio_statistic(num, den), 400, resamples=4000) == (value, low, high)  # seeded
    assert bootstrap_interval(ratio_statistic(num[:1] * 0, den[:1] * 0), 1)[1:] == (None, None)  # undefined


def test_bootstrap_p_value_is_two_sided_and_never_zero():
    assert bootstrap_p_value(np.zeros(99)) == 1.0
    assert bootstrap_p_value(-np.ones(99)) == pytest.approx(2 / 100)
    draws = np.r_[-np.ones(90), np.ones(10)]
    assert bootstrap_p_value(draws) == pytest.approx(2 * 11 / 101)


def test_zero_baseline_ratio_falls_back_to_an_absolute_change():
    est = ratio_bootstrap(np.zeros(10), np.ones(10), np.full(10, 0.1), np.ones(10), resamples=50)
    assert est.scale == "absolute" and est.effect == pytest.approx(0.1)


# ------------------------------------------------------------------------------------------------ ECE


def cycles(num_cycles: int, gamma: int = 7, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.5, 0.9, size=num_cycles)
    logits = np.log(q / (1 - q))[:, None] + 0.8 + rng.normal(0, 0.7, size=(num_cycles, gamma))
    verified = rng.integers(0, gamma + 1, size=num_cycles)
    runs = rng.random((num_cycles, gamma)) < q[:, None]
    accepted = np.minimum(np.where(runs.all(1), gamma, np.argmin(runs, axis=1)), verified)
    return logits, verified, accepted


@pytest.mark.parametrize("calibrated", [False, True])
def test_ece_point_estimate_equals_dspark_core(calibrated):
    torch = pytest.importorskip("torch")
    from dspark_core.calibration import expected_calibration_error

    logits, verified, accepted = cycles(3000)
    temps = np.linspace(0.8, 2.0, 7) if calibrated else None
    unit = np.arange(3000) % 60
    table = ece_table(logits, verified, accepted, unit, 60, temps)
    mine = float(table.ece(np.ones((1, 60)))[0])
    ref = expected_calibration_error(
        torch.tensor(logits), torch.tensor(verified), torch.tensor(accepted),
        temperatures=None if temps is None else torch.tensor(temps),
    )
    assert mine == pytest.approx(ref.ece, rel=1e-12)
    assert table.counts.sum() == int(ref.num_observed.sum())


def test_ece_tables_group_like_their_cycles():
    logits, verified, accepted = cycles(500)
    unit = np.arange(500) % 10
    per_prompt = ece_table(logits, verified, accepted, unit, 10)
    pooled = per_prompt.grouped(np.arange(10), np.zeros(10, dtype=np.int64), 1)
    direct = ece_table(logits, verified, accepted, np.zeros(500, dtype=np.int64), 1)
    np.testing.assert_allclose(pooled.gaps, direct.gaps, atol=1e-9)
    assert pooled.ece(np.ones((1, 1)))[0] == pytest.approx(direct.ece(np.ones((1, 1)))[0])


def test_ece_bootstrap_identical_and_worse():
    logits, verified, accepted = cycles(5000)
    unit = np.arange(5000) % 100
    base = ece_table(logits, verified, accepted, unit, 100)
    same = ece_bootstrap(base, EceTable(base.gaps.copy(), base.counts.copy()), seed=4)
    assert same.effect == 0 and same.p_value == 1.0 and same.scale == "absolute"
    worse = ece_bootstrap(base, ece_table(logits + 1.5, verified, accepted, unit, 100), seed=4)
    assert worse.effect > 0.02 and worse.p_value < 0.01 and worse.ci[0] > 0
    rule = GateRule("ece_raw", "lower", relative=None, absolute=0.01)
    assert judge(rule, worse)[0] == "regression"


def test_ece_bootstrap_is_fast():
    """2000 resamples over 100 prompts × 50 steps × γ=7, table building included: well under a second."""
    logits, verified, accepted = cycles(5000)
    unit = np.repeat(np.arange(100), 50)
    t0 = time.perf_counter()
    base = ece_table(logits, verified, accepted, unit, 100)
    cand = ece_table(logits + 0.2, verified, accepted, unit, 100)
    ece_bootstrap(base, cand, resamples=2000, seed=0)
    elapsed = time.perf_counter() - t0
    assert elapsed < 3.0, f"{elapsed:.2f} s"  # target ≤ 1 s; slack for a busy shared CPU


# --------------------------------------------------------------------------------------- Mann-Whitney


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
@pytest.mark.parametrize("n_b,n_c", [(2, 2), (3, 5), (6, 6), (10, 8), (10, 10)])
def test_mann_whitney_exact_matches_scipy(n_b, n_c, alternative):
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(n_b * 100 + n_c)
    b, c = rng.normal(size=n_b), rng.normal(0.7, size=n_c)
    mine = mann_whitney(b, c, alternative)
    ref = scipy_stats.mannwhitneyu(c, b, alternative=alternative, method="exact")
    assert mine.method == "exact"
    assert mine.u == ref.statistic
    assert mine.p_value == pytest.approx(ref.pvalue, rel=1e-9)


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_mann_whitney_normal_matches_scipy_with_ties(alternative):
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    b, c = rng.integers(0, 6, size=14).astype(float), rng.integers(1, 7, size=17).astype(float)
    mine = mann_whitney(b, c, alternative)
    ref = scipy_stats.mannwhitneyu(c, b, alternative=alternative, method="asymptotic")
    assert mine.method == "normal"
    assert mine.p_value == pytest.approx(ref.pvalue, rel=1e-9)


def test_mann_whitney_exact_with_ties_is_the_permutation_distribution():
    b, c = np.array([1.0, 2, 2, 3]), np.array([2.0, 3, 3, 4, 5])
    ranks = midranks(np.r_[b, c])
    observed = ranks[4:].sum()
    sums = np.array([ranks[list(i)].sum() for i in itertools.combinations(range(9), 5)])
    brute = min(1.0, 2 * min((sums <= observed + 1e-9).mean(), (sums >= observed - 1e-9).mean()))
    assert mann_whitney(b, c).p_value == pytest.approx(brute)


def test_two_repeats_each_cannot_reach_significance():
    est = repeats_test([100.0, 101.0], [80.0, 81.0])
    assert est.min_p == pytest.approx(1 / 3)
    assert est.p_value == pytest.approx(1 / 3)
    verdict, why = judge(GateRule("throughput", "higher", test="mann_whitney", min_samples=2), est)
    assert verdict == "inconclusive"
    assert "n too small to detect anything at alpha" in why
    assert math.isinf(est.mde)


def test_repeats_test_detects_a_clear_shift_with_enough_repeats():
    rng = np.random.default_rng(3)
    base = 100 * rng.uniform(0.99, 1.01, size=8)
    cand = 90 * rng.uniform(0.99, 1.01, size=8)
    est = repeats_test(base, cand)
    assert est.scale == "relative" and est.effect == pytest.approx(-0.1, abs=0.01)
    assert est.ci[0] <= est.effect <= est.ci[1] < 0
    assert est.p_value < 0.001 and est.mde < 0.05
    assert judge(GateRule("throughput", "higher", test="mann_whitney"), est)[0] == "regression"


def test_hodges_lehmann_shift_and_interval():
    base = np.arange(1.0, 11.0)
    est, low, high = hodges_lehmann(base, base + 3.0, alpha=0.05)
    assert est == 3.0 and low < 3.0 < high
    # Coverage by construction: the interval holds the true shift in most seeded draws.
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(200):
        b, c = rng.normal(size=9), rng.normal(size=9) + 1.0
        _, lo, hi = hodges_lehmann(b, c, alpha=0.1)
        hits += lo <= 1.0 <= hi
    assert hits >= 170  # nominal ≥ 90%


# ---- the per-position acceptance interval over conversations -------------------------------------------------


def _clustered_draws(rng, true_p: float, clusters: int, spread: float):
    """One card cell's counts: each conversation its own acceptance rate around true_p (Beta with that mean;
    `spread` 0: independent trials) and its own number of verify steps."""
    trials = rng.integers(20, 120, size=clusters).astype(float)
    if spread == 0:
        rates = np.full(clusters, true_p)
    else:
        a = true_p * (1 / spread - 1)
        rates = rng.beta(a, a * (1 - true_p) / true_p, size=clusters)
    return rng.binomial(trials.astype(int), rates).astype(float), trials


def test_clustered_wilson_covers_a_clustered_rate_where_wilson_does_not():
    """8 conversations whose rates differ (the card's cells): Wilson over the pooled steps covers the mean rate about
    a third of the time; on the effective count ≈ 0.87 (z, not t with 7 degrees of freedom, so short of 0.95 with
    this few conversations). Independent trials: both near 95%."""
    rng = np.random.default_rng(0)

    def coverage(spread: float, interval) -> float:
        hits = 0
        for _ in range(600):
            successes, trials = _clustered_draws(rng, 0.3, 8, spread)
            low, high = interval(successes, trials)
            hits += low <= 0.3 <= high
        return hits / 600

    pooled = lambda s, t: stats.wilson_interval(s.sum(), t.sum())  # noqa: E731
    assert coverage(0.2, pooled) < 0.5
    assert coverage(0.2, stats.clustered_wilson) > 0.83
    assert coverage(0.0, stats.clustered_wilson) > 0.92 and coverage(0.0, pooled) > 0.92


def test_clustered_wilson_is_wilson_without_clustering_and_keeps_a_bound_at_zero():
    even = np.array([10.0, 10.0, 10.0]), np.array([40.0, 40.0, 40.0])  # every conversation at the pooled rate
    assert stats.clustered_wilson(*even) == pytest.approx(stats.wilson_interval(30.0, 120.0))
    none = np.zeros(3), np.array([40.0, 50.0, 60.0])
    low, high = stats.clustered_wilson(*none)
    assert low == 0.0 and 0.0 < high == pytest.approx(stats.wilson_interval(0.0, 150.0)[1])
    looping = np.array([95.0, 2.0, 3.0]), np.array([100.0, 50.0, 50.0])  # one answer that loops
    assert np.diff(stats.clustered_wilson(*looping)) > 3 * np.diff(stats.wilson_interval(100.0, 200.0))
