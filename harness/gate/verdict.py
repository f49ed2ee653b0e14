"""What makes a change a regression: the one decision of the gate, given a rule and an estimate.

A **regression** needs all of:
- enough data: at least `min_samples` units, and a sample that can reach significance at all (a test
  whose smallest possible p-value is ≥ α can only ever "pass", so it is reported as inconclusive);
- significance: p < α (two-sided tests, `harness.gate.stats`); a `threshold` rule has no test;
- an effect in the worsening direction beyond every allowance the rule sets — `relative` (a fraction of
  the baseline) and `absolute` (metric units): setting both tolerates a change that stays within either,
  so a tiny absolute move on a near-zero baseline (ECE, failure rates) is not a 50% regression — and
  beyond `min_effect` (relative).

An **improvement** is the mirror image; everything else is a **pass**. When nothing is significant but
the test could not have detected a change of the allowed size (MDE above the allowance), the pass says
so: it is a pass of this rule at this sample size, not evidence that nothing changed.
"""

from __future__ import annotations

from harness.gate.rules import GateRule
from harness.gate.stats import Estimate

INCOMPARABLE = "incomparable"  # the cell compares, but not on this metric's scope (e.g. hardware differs)

# unstable: the plain baseline of the cell's group drifted between rounds (harness.metrics.speedup);
# invalid: a round of the cell failed validation (`v_rounds`). Both are reported, never pass or fail.
VERDICTS = ("regression", "improvement", "inconclusive", "unstable", "invalid", "pass", INCOMPARABLE)
DIRECTIONS = ("higher", "lower")
LEVELS = ("fail", "warn")


def _allowance(rule: GateRule) -> str:
    parts = []
    if rule.relative is not None:
        parts.append(f"{100 * rule.relative:g}%")
    if rule.absolute is not None:
        parts.append(f"{rule.absolute:g} absolute")
    if rule.min_effect:
        parts.append(f"min effect {100 * rule.min_effect:g}%")
    return " and ".join(parts) if parts else "no allowance"


def _beyond(rule: GateRule, est: Estimate, sign: int) -> bool:
    """Whether the change is beyond every allowance in the direction `sign` (+1: worse, −1: better)."""
    rel = est.effect if est.scale == "relative" else est.relative
    abs_ = est.effect if est.scale == "absolute" else est.absolute
    if sign * (-1 if rule.direction == "higher" else 1) * est.effect <= 0:
        return False
    bad = -1 if rule.direction == "higher" else 1  # sign of a worsening change
    moved_rel = None if rel is None else sign * bad * rel  # > 0: moved the asked way; None: baseline 0
    moved_abs = sign * bad * abs_
    if rule.relative is not None and moved_rel is not None and not moved_rel > rule.relative:
        return False
    if rule.absolute is not None and not moved_abs > rule.absolute:
        return False
    if moved_rel is not None and not moved_rel > rule.min_effect:
        return False
    return moved_rel is not None or moved_abs > 0


def judge(rule: GateRule, est: Estimate) -> tuple[str, str]:
    """(verdict, why) of one rule on one estimate."""
    if rule.direction not in DIRECTIONS:
        raise ValueError(f"gate rule {rule.metric}: direction must be one of {DIRECTIONS}, got {rule.direction!r}")
    if est.method != "threshold":
        if est.n < rule.min_samples:
            return "inconclusive", f"n={est.n} < min_samples={rule.min_samples}"
        if est.min_p is not None and est.min_p >= rule.alpha:
            return "inconclusive", (f"n too small to detect anything at alpha={rule.alpha:g} "
                                    f"(smallest possible p={est.min_p:.2g})")
        if est.p_value is None:
            return "inconclusive", est.note or "no test result"
    significant = est.p_value is None or est.p_value < rule.alpha
    test = "" if est.p_value is None else f" and significant (p={est.p_value:.2g} < {rule.alpha:g})"
    if significant and _beyond(rule, est, +1):
        return "regression", f"worse than allowed ({_allowance(rule)}){test}"
    if significant and _beyond(rule, est, -1):
        return "improvement", f"better beyond the allowance ({_allowance(rule)}){test}"
    if not significant:
        why = f"not significant (p={est.p_value:.2g} ≥ {rule.alpha:g})"
    else:
        why = f"within the allowance ({_allowance(rule)})"
    allowed = rule.relative if est.scale == "relative" else rule.absolute
    if est.mde is not None and allowed is not None and est.mde > allowed:
        why += "; underpowered: the detectable change exceeds the allowance"
    return "pass", why
