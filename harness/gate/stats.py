"""The gate's statistics: a paired bootstrap over prompts (ratio metrics and ECE) and Mann-Whitney over repeats.

numpy and the standard library only (`statistics.NormalDist` for normal quantiles); scipy serves the tests
as a cross-check. Every test here is two-sided: the gate reports improvements as well as regressions, and
a two-sided test at α is, for the one direction that fails the gate, a one-sided test at α/2 —
conservative, which suits a gate that blocks merges.

**Paired bootstrap over prompts.** Baseline and candidate ran the same prompts; the paired unit is a
prompt (a conversation, when a task has several turns: its turns share a context and move together).
Each draw resamples units with replacement — one multinomial weight vector w ∈ ℕ^U, Σw = U, applied to
*both* runs, so prompt difficulty cancels out of the comparison — and recomputes both statistics:

    ratio metric (τ, accepted per step, …):  R(w) = Σ_u w_u·num_u / Σ_u w_u·den_u   (ratio of sums)
    relative effect                          δ(w) = R_cand(w) / R_base(w) − 1
    ECE (absolute effect)                    δ(w) = ECE_cand(w) − ECE_base(w)

and reports, from B draws δ*_1 … δ*_B:

    effect      δ(1): the point estimate on the data as they are (w = 1)
    CI          percentile interval [q_{α/2}(δ*), q_{1−α/2}(δ*)]
    p           2 · min(1 + #{δ* ≤ 0}, 1 + #{δ* ≥ 0}) / (B + 1), capped at 1: the smallest α at which the
                percentile interval excludes 0 (+1 so that p is never 0; its floor is 2/(B+1))
    MDE         (z_{1−α/2} + z_{0.80}) · SE,  SE = sd(δ*): the true effect this test detects with 80% power
                (normal approximation; 2.80 · SE at α = 0.05)

**ECE under the bootstrap.** ECE = Σ_{j,b} |Σa − Σy|_{j,b} / N over positions j and bins b (equal-width bins
of cumulative survival a_j, `dspark_core.calibration`). Sums are additive over prompts, so each prompt is
reduced once to a table of per-(position, bin) gaps G_u = Σa − Σy and its count N_u; a draw is then
ECE(w) = Σ_k |Σ_u w_u G_uk| / Σ_u w_u N_u — two matrix products, whatever the number of steps.

**Ranks over paired rounds** (`rounds_test`, the `paired_rounds` test of speedups). Each run's rounds
pair speculative and plain decoding in time (a plain sandwich around the speculative cells); the logs
of the per-round ratios of the two runs are compared by Mann-Whitney with the Hodges-Lehmann shift
(below), interval and p from one U distribution — the rank counterpart of the run summary's median
ratio and sign interval (`harness.metrics.speedup`), so a round whose pairing a load step broke is
outvoted, not averaged in. 4 rounds a side can reach significance at α = 0.05 (2/C(8,4) = 0.029).

**Mann-Whitney over repeats.** Metrics measured once per repeat (throughput, latency percentiles,
speedup) have no prompt-level decomposition; repeats are the unit, unpaired. U counts the (baseline,
candidate) pairs where the candidate is larger (ties ½). The p-value is exact (the permutation
distribution of the rank sum, midranks for ties, by dynamic programming) when both sides have ≤ 10
repeats, and otherwise normal with tie and continuity corrections (as scipy's `mannwhitneyu`). The effect
is Hodges-Lehmann: the median of all pairwise candidate/baseline ratios − 1 (differences, when a value is
≤ 0), with the distribution-free confidence interval of order statistics of those pairs. Tiny samples
cannot reach significance at all — 2 vs 2 repeats give p ≥ 1/3 — and `min_p` says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Callable, Sequence

import numpy as np

NUM_BINS = 20  # dspark_core.calibration.DEFAULT_NUM_BINS
POWER = 0.80  # the power at which the minimum detectable effect is stated
_NORMAL = NormalDist()


def z(q: float) -> float:
    """Standard normal quantile."""
    return _NORMAL.inv_cdf(q)


def mde_factor(alpha: float, power: float = POWER) -> float:
    """z_{1−α/2} + z_power: ≈ 2.80 at α = 0.05 and 80% power."""
    return z(1 - alpha / 2) + z(power)


@dataclass(frozen=True)
class Estimate:
    """One comparison of candidate with baseline, in the units of `scale`.

    `effect`, `ci` and `mde` are relative (candidate/baseline − 1) when `scale` is "relative", in the
    metric's own unit (candidate − baseline) when "absolute". `baseline`/`candidate` are the point values
    compared (ratios of sums for the bootstrap, medians for Mann-Whitney, means for a threshold).
    """

    method: str  # paired_bootstrap | mann_whitney | paired_rounds | threshold
    scale: str  # relative | absolute
    baseline: float
    candidate: float
    effect: float
    n: int  # paired units (bootstrap) or the smaller number of repeats (Mann-Whitney, threshold)
    alpha: float
    ci: tuple[float, float] | None = None
    p_value: float | None = None
    mde: float | None = None
    min_p: float | None = None  # smallest p the test can reach at this n; ≥ α means nothing is detectable
    note: str = ""

    @property
    def absolute(self) -> float:
        return self.candidate - self.baseline

    @property
    def relative(self) -> float | None:
        return self.candidate / self.baseline - 1 if self.baseline else None


# ------------------------------------------------------------------------------------------ bootstrap

# A draw's statistic: weights [draws, units] → values [draws].
Statistic = Callable[[np.ndarray], np.ndarray]


def bootstrap_p_value(draws: np.ndarray) -> float:
    """Two-sided percentile-bootstrap p-value of "no change" (module docstring); 1 when every draw is 0."""
    below = int(np.count_nonzero(draws <= 0))
    above = int(np.count_nonzero(draws >= 0))
    return min(1.0, 2 * (1 + min(below, above)) / (draws.size + 1))


def _effect(base: np.ndarray, cand: np.ndarray, scale: str) -> np.ndarray:
    if scale == "relative":
        with np.errstate(divide="ignore", invalid="ignore"):
            return cand / base - 1
    return cand - base


def bootstrap_weights(num_units: int, resamples: int, seed: int = 0, max_elements: int = 4_000_000):
    """Multinomial weight vectors [rows, units] (Σw = U per row), `resamples` rows in all, in chunks of at
    most `max_elements` weights so memory stays bounded for many units. The chunking depends only on
    `num_units`, so a seed reproduces the same draws; the one- and two-sample bootstraps share them."""
    rng = np.random.default_rng(seed)
    pvals = np.full(num_units, 1.0 / num_units)
    rows = max(1, max_elements // num_units)
    for start in range(0, resamples, rows):
        yield rng.multinomial(num_units, pvals, size=min(rows, resamples - start)).astype(np.float64)


def paired_bootstrap(
    base_stat: Statistic,
    cand_stat: Statistic,
    num_units: int,
    *,
    scale: str,
    resamples: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
    max_elements: int = 4_000_000,
) -> Estimate:
    """The paired bootstrap of the module docstring over `num_units` units, for any pair of statistics."""
    if num_units < 1:
        raise ValueError("the bootstrap needs at least one paired unit")
    ones = np.ones((1, num_units))
    base0, cand0 = float(base_stat(ones)[0]), float(cand_stat(ones)[0])
    effect = float(_effect(np.array(base0), np.array(cand0), scale))
    draws = np.concatenate([_effect(base_stat(w), cand_stat(w), scale)
                            for w in bootstrap_weights(num_units, resamples, seed, max_elements)])
    draws = draws[np.isfinite(draws)]  # a draw whose baseline statistic is undefined (0 denominator)
    if draws.size < 2:
        return Estimate("paired_bootstrap", scale, base0, cand0, effect, num_units, alpha,
                        note="no bootstrap draw defined")
    low, high = np.quantile(draws, [alpha / 2, 1 - alpha / 2])
    se = float(np.std(draws, ddof=1))
    return Estimate(
        method="paired_bootstrap", scale=scale, baseline=base0, candidate=cand0, effect=effect, n=num_units,
        alpha=alpha, ci=(float(low), float(high)), p_value=bootstrap_p_value(draws),
        mde=mde_factor(alpha) * se, min_p=2 / (resamples + 1),
    )


def bootstrap_interval(stat: Statistic, num_units: int, *, resamples: int = 2000, alpha: float = 0.05,
                       seed: int = 0) -> tuple[float, float | None, float | None]:
    """One sample's statistic with its percentile interval over the same draws the paired form uses:
    (value at w = 1, low, high); the bounds are None when fewer than two draws are defined. The model
    card's τ and ECE intervals come from here, so a card and a gate resample alike."""
    if num_units < 1:
        raise ValueError("the bootstrap needs at least one unit")
    value = float(stat(np.ones((1, num_units)))[0])
    draws = np.concatenate([stat(w) for w in bootstrap_weights(num_units, resamples, seed)])
    draws = draws[np.isfinite(draws)]
    if draws.size < 2 or value != value:
        return value, None, None
    low, high = np.quantile(draws, [alpha / 2, 1 - alpha / 2])
    return value, float(low), float(high)


def ratio_statistic(numerator: np.ndarray, denominator: np.ndarray) -> Statistic:
    """R(w) = Σ w·num / Σ w·den: a ratio of sums over the drawn units (never a mean of per-unit ratios)."""
    num = np.asarray(numerator, dtype=np.float64)
    den = np.asarray(denominator, dtype=np.float64)

    def stat(weights: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return (weights @ num) / (weights @ den)

    return stat


def wilson_interval(successes: float, trials: float, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (inside [0, 1], sane at 0 and at all successes);
    trials > 0, not necessarily whole (an effective count)."""
    p = min(max(successes / trials, 0.0), 1.0)
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def clustered_wilson(successes: np.ndarray, trials: np.ndarray, z: float = 1.96) -> tuple[float, float]:
    """Wilson's interval for Σ successes / Σ trials when the trials come in clusters (a conversation's verify
    steps): the count is shrunk to its effective size n / deff (Kish), deff the variance of the ratio of sums
    across clusters (linearised, U / (U − 1) for U clusters) over the binomial variance, never below 1. With
    independent trials deff ≈ 1 and this is Wilson's interval; with one looping conversation dominating, it is
    as wide as that conversation's weight makes it. Wilson, not a bootstrap, so that 0 successes still get an
    upper bound. successes, trials: [clusters]; Σ trials > 0."""
    n, x = float(trials.sum()), float(successes.sum())
    p = x / n
    used = int((trials > 0).sum())
    deff = 1.0
    if used >= 2 and 0.0 < p < 1.0:
        spread = used / (used - 1) * float(((successes - p * trials) ** 2).sum()) / (n * n)
        deff = max(1.0, spread / (p * (1 - p) / n))
    return wilson_interval(x / deff, n / deff, z)


def ratio_bootstrap(
    base_num: np.ndarray,
    base_den: np.ndarray,
    cand_num: np.ndarray,
    cand_den: np.ndarray,
    *,
    resamples: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> Estimate:
    """Relative change of a ratio-of-sums metric over paired units ([units] arrays, aligned by unit).

    Relative (R_cand/R_base − 1) unless the baseline ratio is 0 (e.g. accepted drafts of plain decoding),
    where only the absolute change is defined.
    """
    base_stat, cand_stat = ratio_statistic(base_num, base_den), ratio_statistic(cand_num, cand_den)
    units = len(base_num)
    base0 = float(base_stat(np.ones((1, units)))[0]) if units else float("nan")
    scale = "relative" if base0 != 0 else "absolute"
    return paired_bootstrap(base_stat, cand_stat, units, scale=scale, resamples=resamples, alpha=alpha, seed=seed)


# ------------------------------------------------------------------------------------------------ ECE


def cumulative_survival(logits: np.ndarray, temperatures: np.ndarray | None = None,
                        offsets: np.ndarray | None = None) -> np.ndarray:
    """a_j = Π_{i≤j} σ(c_i / T_i + b_i) ([cycles, γ]); NaN logits propagate to every later position.

    `temperatures` (STS) and `offsets` (the level offsets fitted with them; None: 0): [γ], or [cycles, γ] when
    cycles come from repeats calibrated differently.
    """
    x = np.asarray(logits, dtype=np.float64)
    if temperatures is not None:
        x = x / np.asarray(temperatures, dtype=np.float64)
    if offsets is not None:
        x = x + np.asarray(offsets, dtype=np.float64)
    return np.cumprod(1.0 / (1.0 + np.exp(-x)), axis=-1)


@dataclass(frozen=True)
class EceTable:
    """Per-unit calibration sums: gaps[u, j·bins + b] = Σ(a − y) over unit u's observed (cycle, position j)
    pairs in bin b, counts[u] = their number. ECE is a function of weighted sums of these rows."""

    gaps: np.ndarray  # [units, γ · bins] float64
    counts: np.ndarray  # [units] float64

    def ece(self, weights: np.ndarray) -> np.ndarray:
        """ECE of the units weighted by `weights` [draws, units] → [draws]; NaN where nothing is observed."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.abs(weights @ self.gaps).sum(axis=1) / (weights @ self.counts)

    def mean_gap(self, weights: np.ndarray) -> np.ndarray:
        """Mean of a − y over the observed positions of the units weighted by `weights` [draws, units] → [draws]:
        calibration in the large, signed (> 0: the confidences promise more acceptance than the verifier gives).
        ECE cannot tell a level shift from scatter; this can, and |mean gap| ≤ ECE."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return (weights @ self.gaps.sum(axis=1)) / (weights @ self.counts)

    def grouped(self, index: np.ndarray, group: np.ndarray, num_groups: int) -> EceTable:
        """Rows `index` summed into `num_groups` groups (`group[i]` receives row `index[i]`)."""
        gaps = np.zeros((num_groups, self.gaps.shape[1]))
        np.add.at(gaps, group, self.gaps[index])
        return EceTable(gaps, np.bincount(group, weights=self.counts[index], minlength=num_groups))


def ece_table(
    logits: np.ndarray,
    num_verified: np.ndarray,
    num_accepted: np.ndarray,
    unit: np.ndarray,
    num_units: int,
    temperatures: np.ndarray | None = None,
    num_bins: int = NUM_BINS,
    offsets: np.ndarray | None = None,
) -> EceTable:
    """Reduce cycles to per-unit ECE sums, conventions of `dspark_core.calibration`.

    logits [cycles, γ] (NaN: not stored), num_verified/num_accepted/unit [cycles]. Position j of a cycle is
    observed iff j ≤ num_verified (and its survival is defined); y_j = num_accepted ≥ j; its bin is
    min(⌊a_j · bins⌋, bins − 1), each position with its own bins.
    """
    logits = np.asarray(logits, dtype=np.float64)
    gamma = logits.shape[1]
    survival = cumulative_survival(logits, temperatures, offsets)  # [cycles, γ]
    positions = np.arange(1, gamma + 1)
    observed = (positions[None, :] <= np.asarray(num_verified)[:, None]) & np.isfinite(survival)
    realised = (positions[None, :] <= np.asarray(num_accepted)[:, None]).astype(np.float64)
    cycle_idx, pos_idx = np.nonzero(observed)
    predicted = survival[cycle_idx, pos_idx]
    bins = np.clip(np.floor(predicted * num_bins).astype(np.int64), 0, num_bins - 1)
    width = gamma * num_bins
    flat = np.asarray(unit)[cycle_idx] * width + pos_idx * num_bins + bins
    gaps = np.bincount(flat, weights=predicted - realised[cycle_idx, pos_idx], minlength=num_units * width)
    counts = np.bincount(np.asarray(unit)[cycle_idx], minlength=num_units).astype(np.float64)
    return EceTable(gaps.reshape(num_units, width), counts)


def ece_bootstrap(
    base: EceTable, cand: EceTable, *, resamples: int = 2000, alpha: float = 0.05, seed: int = 0
) -> Estimate:
    """Absolute change of ECE (ECE units) over paired units: tables aligned row by row."""
    if base.gaps.shape[0] != cand.gaps.shape[0]:
        raise ValueError("baseline and candidate ECE tables must have one row per paired unit")
    return paired_bootstrap(base.ece, cand.ece, base.gaps.shape[0], scale="absolute", resamples=resamples,
                            alpha=alpha, seed=seed)


# --------------------------------------------------------------------------------------- Mann-Whitney

EXACT_MAX = 10  # exact p-values while both samples have at most this many values


@dataclass(frozen=True)
class RankTest:
    u: float  # U of the candidate: pairs with candidate > baseline, ties ½
    p_value: float
    method: str  # exact | normal
    min_p: float  # the p-value of the most extreme untied outcome at these sample sizes


def midranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1 … n, tied values sharing the mean of their ranks."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    starts = np.cumsum(counts) - counts  # ranks before each distinct value
    return (starts + (counts + 1) / 2.0)[inverse]


def _rank_sum_distribution(ranks: np.ndarray, k: int) -> np.ndarray:
    """P(sum of 2·rank over a uniformly random k-subset = s), s = 0 … 2·Σranks: the permutation null.

    Dynamic programming over items (ways[c, s]: subsets of size c with doubled sum s), exact with ties
    because midranks doubled are integers.
    """
    doubled = np.rint(2 * ranks).astype(np.int64)
    total = int(doubled.sum())
    ways = np.zeros((k + 1, total + 1))
    ways[0, 0] = 1.0
    for r in doubled:
        ways[1:, r:] = ways[1:, r:] + ways[:-1, : total + 1 - r]
    return ways[k] / ways[k].sum()


def _p_from_tails(lower: float, upper: float, alternative: str) -> float:
    if alternative == "greater":
        return min(1.0, upper)
    if alternative == "less":
        return min(1.0, lower)
    return min(1.0, 2 * min(lower, upper))


def mann_whitney(
    base: Sequence[float], cand: Sequence[float], alternative: str = "two-sided", exact_max: int = EXACT_MAX
) -> RankTest:
    """Mann-Whitney U test of candidate against baseline (module docstring).

    alternative: "two-sided", "greater" (candidate tends to be larger) or "less".
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    b = np.asarray(base, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    n_b, n_c = b.size, c.size
    if n_b == 0 or n_c == 0:
        raise ValueError("Mann-Whitney needs at least one value on each side")
    ranks = midranks(np.concatenate([b, c]))
    rank_sum = float(ranks[n_b:].sum())
    u = rank_sum - n_c * (n_c + 1) / 2
    sides = 1 if alternative != "two-sided" else 2
    if max(n_b, n_c) <= exact_max:
        probs = _rank_sum_distribution(ranks, n_c)
        w2 = int(round(2 * rank_sum))
        p = _p_from_tails(float(probs[: w2 + 1].sum()), float(probs[w2:].sum()), alternative)
        min_p = min(1.0, sides / math.comb(n_b + n_c, n_c))
        return RankTest(u, p, "exact", min_p)
    n = n_b + n_c
    _, tie_counts = np.unique(ranks, return_counts=True)
    tie_term = float((tie_counts**3 - tie_counts).sum())
    mu = n_b * n_c / 2
    sigma = math.sqrt(n_b * n_c / 12 * ((n + 1) - tie_term / (n * (n - 1))))
    u_extreme = float(n_b * n_c)
    min_p = min(1.0, sides * _NORMAL.cdf(-(u_extreme - mu - 0.5) / math.sqrt(n_b * n_c * (n + 1) / 12)))
    if sigma == 0:  # every value tied: no evidence either way
        return RankTest(u, 1.0, "normal", min_p)
    if alternative == "greater":
        stat = u
    elif alternative == "less":
        stat = n_b * n_c - u
    else:
        stat = max(u, n_b * n_c - u)
    p = min(1.0, sides * _NORMAL.cdf(-(stat - mu - 0.5) / sigma))
    return RankTest(u, p, "normal", min_p)


def _hl_order_index(n_b: int, n_c: int, alpha: float, exact_max: int) -> int:
    """k of the distribution-free interval [D_(k), D_(mn+1−k)] for a shift (coverage ≥ 1 − α; 0: none exists).

    k − 1 is the largest u with P(U ≤ u) ≤ α/2 under the untied null (exact), or its normal approximation.
    """
    if max(n_b, n_c) <= exact_max:
        probs = _rank_sum_distribution(np.arange(1, n_b + n_c + 1, dtype=np.float64), n_c)
        offset = n_c * (n_c + 1)  # doubled minimum rank sum: U = (W2 − offset) / 2
        u_cdf = np.cumsum(probs[offset::2])  # P(U ≤ u), u = 0 … n_b·n_c
        return int(np.count_nonzero(u_cdf <= alpha / 2 + 1e-12))
    m = n_b * n_c
    return max(0, int(math.floor(m / 2 - z(1 - alpha / 2) * math.sqrt(m * (n_b + n_c + 1) / 12))))


def hodges_lehmann(
    base: Sequence[float], cand: Sequence[float], alpha: float = 0.05, log: bool = False,
    exact_max: int = EXACT_MAX,
) -> tuple[float, float, float]:
    """(estimate, low, high): median of all pairwise differences cand_j − base_i (of logs when `log`) and its
    1 − α interval; when the samples are too small for that coverage no finite interval has it, and the
    interval is (−∞, ∞) — never the range of the differences, which would exclude 0 beside a p ≥ α."""
    b = np.asarray(base, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    if log:
        b, c = np.log(b), np.log(c)
    diffs = np.sort((c[None, :] - b[:, None]).ravel())
    k = _hl_order_index(b.size, c.size, alpha, exact_max)
    low, high = (-math.inf, math.inf) if k < 1 else (diffs[k - 1], diffs[diffs.size - k])
    return float(np.median(diffs)), float(low), float(high)


def repeats_test(base: Sequence[float], cand: Sequence[float], alpha: float = 0.05) -> Estimate:
    """Mann-Whitney over repeats with a Hodges-Lehmann effect; baseline/candidate are the medians.

    Relative scale (median pairwise ratio − 1) when every value is positive, absolute otherwise. MDE, for a
    shift of normal data: (z_{1−α/2} + z_{0.8}) · s · √(1/n_b + 1/n_c) / √(3/π), s the pooled standard
    deviation (of logs on the relative scale; 3/π is the efficiency of the rank test against the t test);
    infinite when even the most extreme outcome would not be significant.
    """
    b = np.asarray(base, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    log = bool((b > 0).all() and (c > 0).all())
    test = mann_whitney(b, c)
    est, low, high = hodges_lehmann(b, c, alpha, log=log)
    n = int(min(b.size, c.size))
    if test.min_p >= alpha:
        mde = math.inf
    elif b.size + c.size > 2:
        tb, tc = (np.log(b), np.log(c)) if log else (b, c)
        dof = b.size + c.size - 2
        pooled = math.sqrt((((tb - tb.mean()) ** 2).sum() + ((tc - tc.mean()) ** 2).sum()) / dof) if dof else 0.0
        mde = mde_factor(alpha) * pooled * math.sqrt(1 / b.size + 1 / c.size) / math.sqrt(3 / math.pi)
        mde = math.expm1(mde) if log else mde
    else:
        mde = math.inf
    to_scale = math.expm1 if log else (lambda x: x)
    return Estimate(
        method="mann_whitney", scale="relative" if log else "absolute",
        baseline=float(np.median(b)), candidate=float(np.median(c)), effect=to_scale(est), n=n, alpha=alpha,
        ci=(to_scale(low), to_scale(high)), p_value=test.p_value, mde=mde, min_p=test.min_p,
        note=f"{test.method} U={test.u:g}",
    )


def rounds_test(base: Sequence[float], cand: Sequence[float], alpha: float = 0.05) -> Estimate:
    """Mann-Whitney on the logs of per-round paired ratios (speedup: spec ÷ plain tokens/s of one round's
    sandwich, `harness.metrics.speedup`), with the Hodges-Lehmann shift as the effect.

    The pairing is inside each run: a round's ratio cancels the machine's speed at that moment, so the
    ratios of a run vary far less than raw throughput does. Across runs the rounds are independent
    samples, compared by ranks — the two-sample counterpart of the run summary's median and sign
    interval, so one round whose pairing a load step broke moves neither: effect = exp(median of all
    pairwise differences log c_j − log b_i) − 1, its distribution-free 1 − α interval from the order
    statistics of those differences, and the exact p of the same U statistic — so the interval excludes 0
    exactly when p < α (untied ratios). Needs 4 rounds a side at α = 0.05 (`min_p` says so below that).
    baseline/candidate are each run's median ratio (exp of the median log, as the summary). MDE as
    `repeats_test`, on the relative scale.
    """
    b = np.asarray(base, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    est = repeats_test(b, c, alpha)
    return dataclasses.replace(
        est, method="paired_rounds", baseline=float(np.exp(np.median(np.log(b)))),
        candidate=float(np.exp(np.median(np.log(c)))), n=int(min(b.size, c.size)),
        note=f"{est.note}, {b.size} vs {c.size} rounds")


def mann_whitney_rounds_needed(alpha: float) -> int:
    """The fewest repeats per side (equal sides) at which Mann-Whitney's smallest two-sided p is < α."""
    n = 1
    while 2 / math.comb(2 * n, n) >= alpha:
        n += 1
    return n


def threshold_estimate(base: Sequence[float], cand: Sequence[float], alpha: float = 0.05) -> Estimate:
    """No test: means over repeats, compared as they are (for deterministic metrics)."""
    b, c = float(np.mean(base)), float(np.mean(cand))
    scale = "relative" if b != 0 else "absolute"
    effect = c / b - 1 if scale == "relative" else c - b
    return Estimate("threshold", scale, b, c, effect, int(min(len(base), len(cand))), alpha)
