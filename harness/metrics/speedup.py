"""Speedup over plain decoding: the median of per-round ratios over a plain-decoding sandwich, with a
distribution-free interval and two drift checks.

Why paired rounds (asv's interleaved rounds): a shared machine's speed drifts by far more than the
effect measured (1.02× and 3.3× for the same cell on the same code, depending only on when other work
started). The runner therefore measures each group's cells once per round, the speculative cells in an
order that rotates per round, so both sides of one round's ratio saw nearly the same machine.

Why a sandwich (ABA): one cell is a whole pass over its prompts, so a round of five cells spans minutes,
and a plain pass at one end of it says little about the machine at the other. Each round therefore
measures the plain cell twice, opening it (before every speculative cell of the group) and closing it
(after them); the closing pass of round r is stored as repeat R + r (R: the rounds planned), so repeat r
stays round r everywhere. A speculative pass's baseline is the plain speed interpolated to its own time
(log-linear between the two plain passes, by the midpoints of the passes' wall-clock spans), which
cancels a load that drifts steadily through the round, wherever the rotation put the cell; rounds share
no pass, so they stay independent. Runs recorded before the sandwich (no closing pass) pair with the
opening pass alone, as they did.

Why the median: a load that changes in steps (another job starting) breaks the pairing of the one round
it falls in, and that round's ratio can be off by the whole load factor (2–3×): the geometric mean moved
+11…+27% with two CPU hogs started 20 s into a run, while the per-round median moved +3…+15%. The median
ignores any minority of such rounds. Per round r, with plain passes P_r (opening) and P'_r (closing) and
the speculative pass's position w_r ∈ [0, 1] between them (½ when the times do not tell):

    b_r = P_r^(1 − w_r) · P'_r^(w_r)    (P_r without a closing pass)         (store: `v_speedup`)
    s_r = tokens/s(speculative, round r) ÷ b_r

Summary over the R rounds (all of them valid, else the cell is invalid — never a median that hides a
bad round):

    speedup   exp(median_r log s_r)    the median ratio (even R: geometric mean of the middle two)
    95% CI    [s_(k), s_(R+1−k)]       the sign test's order-statistic interval: k − 1 is the largest j
                                       with P(Bin(R, ½) ≤ j) ≤ 0.025; coverage 1 − 2·P(Bin(R, ½) ≤ k − 1)
                                       ≥ 95% for any continuous law of s_r (none below 6 rounds)
    drift     max ÷ min − 1 of every plain pass        how far the baseline moved across rounds
    sandwich  max_r (max ÷ min − 1 of P_r, P'_r)       how far it moved inside one round

Two drift checks make a cell `unstable` — its ratios are shown but never judged as pass or fail (run
summary, `v_speedup_summary`, gate): the baseline moved more than `DRIFT_BOUND` across rounds (the
ratio was measured under changing conditions), or at least half of the sandwiched rounds are unsteady,
their plain passes more than `SANDWICH_BOUND` apart (the pairing failed in so many rounds that the
median itself rests on them; fewer are outvoted). The gate's `paired_rounds` test is the two-sample
rank counterpart on the same per-round log ratios: Mann-Whitney with the Hodges-Lehmann shift and its
order-statistic interval from the same U distribution (`harness.gate.stats.rounds_test`), so the
interval excludes 0 exactly when p < α; it needs 4 rounds a side at α = 0.05.

SQL mirror: `v_speedup_summary` (harness/store/views.py), value for value.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

DRIFT_BOUND = 0.25  # the plain baseline may move 25% (max ÷ min − 1) across rounds before a group is unstable
# Inside one round the two plain passes may differ by 10%: their geometric mean is then within 5% of
# either, so under a monotone drift no speculative cell between them is compared with a baseline off by more.
SANDWICH_BOUND = 0.10
CONFIDENCE = 0.95
# A round of a speculative cell is invalid when drafts were verified and its acceptance length stays
# below this: nothing was accepted, so the drafter or verifier is broken, not slow (`v_rounds`) ...
MIN_ACCEPTANCE_LENGTH = 1.01
# ... over enough drafting steps to say so. A working drafter accepts its first draft at a rate of at least
# WORKING_ACCEPTANCE (the weakest trained here, DFlash on MT-Bench: α₁ 0.26), so nothing accepted in n drafting
# steps has probability (1 − WORKING_ACCEPTANCE)^n, below FALSE_ALARM from the count below on (44). Fewer steps
# are no evidence: a cost-aware policy drafts only a few exploring steps where drafting does not pay, and the
# main job's adaptive HumanEval cell once verified 9 in a round with none accepted (P ≈ 0.03 at α₁ 0.33), which
# the bare threshold called a broken drafter. Rounds too short to judge alone are judged together: every round
# of a cell is invalid when all of its rounds' drafting steps together are enough and accepted nothing.
WORKING_ACCEPTANCE = 0.1
FALSE_ALARM = 0.01
MIN_DRAFTING_STEPS_TO_JUDGE = math.ceil(math.log(FALSE_ALARM) / math.log(1 - WORKING_ACCEPTANCE))
METHOD = "median of per-round ratios over a plain sandwich; sign-test interval"
NO_CLOSING_PASS = "no closing plain pass"


@dataclass(frozen=True)
class RoundPair:
    """One round of one speculative cell: its throughput, its plain cell's opening pass (`plain`) and
    closing pass (`plain_after`, None: not measured), where the speculative pass sat between them
    (`position`, `sandwich_position`), and what is wrong with any of them (`problems`, empty when all
    are valid)."""

    round: int
    spec: float | None
    plain: float | None
    problems: tuple[str, ...] = ()
    plain_after: float | None = None
    position: float = 0.5

    @property
    def baseline(self) -> float | None:
        """b_r: P_r^(1 − w) · P'_r^w, or P_r without a closing pass."""
        if self.plain is None or self.plain <= 0:
            return None
        if not (self.plain_after and self.plain_after > 0):
            return self.plain
        return math.exp((1 - self.position) * math.log(self.plain) + self.position * math.log(self.plain_after))

    @property
    def sandwich_drift(self) -> float | None:
        """max ÷ min − 1 of the round's two plain passes (None: no closing pass)."""
        if not (self.plain and self.plain > 0 and self.plain_after and self.plain_after > 0):
            return None
        return max(self.plain, self.plain_after) / min(self.plain, self.plain_after) - 1

    @property
    def passes(self) -> list[float]:
        return [p for p in (self.plain, self.plain_after) if p is not None and p > 0]


@dataclass(frozen=True)
class PairedSpeedup:
    value: float | None  # median of the per-round ratios
    ci: tuple[float, float] | None  # order-statistic interval; None below 6 rounds (at 95%)
    ratios: tuple[float, ...]  # per round, in round order
    rounds: int  # rounds planned
    baseline_drift: float | None  # max ÷ min − 1 of every plain pass over the rounds
    status: str  # ok | unstable | invalid
    reason: str = ""
    ci_coverage: float | None = None  # the interval's exact coverage (≥ CONFIDENCE)
    sandwich_drift: float | None = None  # the largest move between a round's two plain passes
    unsteady_rounds: tuple[int, ...] = ()  # rounds whose plain passes moved more than SANDWICH_BOUND

    def shown(self) -> str:
        """`1.84× [1.79, 1.90] (6 rounds, plain drift 4%, in a round 2%)`, and the status when not ok."""
        if self.value is None:
            return f"{self.status}: {self.reason}"
        if self.ci:
            ci = f" [{self.ci[0]:.2f}, {self.ci[1]:.2f}]"
        else:
            need = sign_rounds_needed()
            ci = (f" [no {100 * CONFIDENCE:g}% interval below {need} rounds; "
                  f"range {min(self.ratios):.2f}–{max(self.ratios):.2f}]")
        drift = f", plain drift {100 * self.baseline_drift:.0f}%" if self.baseline_drift is not None else ""
        drift += f", in a round {100 * self.sandwich_drift:.0f}%" if self.sandwich_drift is not None else ""
        tail = "" if self.status == "ok" else f" — {self.status.upper()}: {self.reason}"
        return f"{self.value:.2f}×{ci} ({len(self.ratios)} rounds{drift}){tail}"


def sandwich_position(spec_mid: float, open_mid: float, close_mid: float) -> float:
    """w: where the speculative pass's midpoint lies between the plain passes' midpoints (seconds), clipped
    to [0, 1]; ½ when the plain passes' midpoints coincide (the times say nothing)."""
    if close_mid == open_mid:
        return 0.5
    return min(1.0, max(0.0, (spec_mid - open_mid) / (close_mid - open_mid)))


@lru_cache(maxsize=None)
def _binomial_half_cdf(n: int) -> tuple[float, ...]:
    """P(Bin(n, ½) ≤ j) for j = 0 … n (floats: pmf by the ratio recursion, exact enough for n ≤ 1000)."""
    pmf, cdf = 0.5 ** n, list[float]()
    for i in range(n + 1):
        cdf.append((cdf[-1] if cdf else 0.0) + pmf)
        pmf *= (n - i) / (i + 1)
    return tuple(cdf)


@lru_cache(maxsize=None)
def sign_interval_index(n: int, confidence: float = CONFIDENCE) -> int:
    """k of the order-statistic interval [x_(k), x_(n+1−k)] for the median of n values (module docstring):
    k − 1 is the largest j with P(Bin(n, ½) ≤ j) ≤ (1 − confidence) / 2; 0 when there is none (n < 6
    at 95%): no interval reaches `confidence`."""
    limit = (1 - confidence) / 2 + 1e-12
    return sum(1 for p in _binomial_half_cdf(n)[:n] if p <= limit)


def sign_coverage(n: int, k: int) -> float | None:
    """Exact coverage of [x_(k), x_(n+1−k)] for a continuous law: 1 − 2·P(Bin(n, ½) ≤ k − 1)
    (None for k = 0)."""
    return 1 - 2 * _binomial_half_cdf(n)[k - 1] if k >= 1 else None


def sign_rounds_needed(confidence: float = CONFIDENCE) -> int:
    """The fewest rounds with an order-statistic interval at `confidence` (6 at 95%)."""
    n = 1
    while not sign_interval_index(n, confidence):
        n += 1
    return n


def median_interval(values: Sequence[float],
                    confidence: float = CONFIDENCE) -> tuple[float, tuple[float, float] | None, float | None]:
    """(exp(median log x), interval or None, its coverage or None) of positive values."""
    logs = sorted(math.log(x) for x in values)
    k = sign_interval_index(len(logs), confidence)
    ordered = sorted(values)
    ci = (ordered[k - 1], ordered[len(ordered) - k]) if k else None
    return math.exp(statistics.median(logs)), ci, sign_coverage(len(logs), k)


def baseline_drift(plain: Sequence[float | None]) -> float | None:
    """max ÷ min − 1 of the plain throughput over passes (None: fewer than two positive values)."""
    values = [p for p in plain if p is not None and p > 0]
    return max(values) / min(values) - 1 if len(values) >= 2 else None


def instability(rounds: Sequence[RoundPair], drift_bound: float = DRIFT_BOUND,
                sandwich_bound: float = SANDWICH_BOUND) -> str:
    """Why the valid `rounds` of one cell are unstable (module docstring), or "" when they are not: one
    rule for the run summary, `v_speedup_summary` and the gate."""
    drift = baseline_drift([p for r in rounds for p in r.passes]) if len(rounds) >= 2 else None
    if drift is not None and drift > drift_bound:
        return f"plain baseline moved {100 * drift:.0f}% between rounds (> {100 * drift_bound:g}%)"
    moves = [r.sandwich_drift for r in rounds if r.sandwich_drift is not None]
    unsteady = [m for m in moves if m > sandwich_bound]
    if unsteady and 2 * len(unsteady) >= len(rounds):
        return (f"plain baseline moved more than {100 * sandwich_bound:g}% inside {len(unsteady)} of "
                f"{len(rounds)} rounds (up to {100 * max(unsteady):.0f}%)")
    return ""


def _usable(r: RoundPair) -> bool:
    return bool(r.spec and r.spec > 0 and r.baseline)


def paired_speedup(rounds: Sequence[RoundPair], planned: int, drift_bound: float = DRIFT_BOUND,
                   confidence: float = CONFIDENCE, sandwich_bound: float = SANDWICH_BOUND) -> PairedSpeedup:
    """The summary of one speculative cell's rounds (module docstring). `planned`: rounds the run planned;
    fewer recorded (an interrupted or truncated run) makes the cell invalid, as does any invalid round,
    and a round without a closing plain pass where other rounds have one (it failed or never ran)."""
    rounds = sorted(rounds, key=lambda r: r.round)
    sandwiched = any(r.plain_after is not None for r in rounds)
    if sandwiched:
        rounds = [r if r.plain_after is not None or r.problems else
                  RoundPair(r.round, r.spec, r.plain, (NO_CLOSING_PASS,), position=r.position) for r in rounds]
    bad = [f"round {r.round}: {'; '.join(r.problems)}" for r in rounds if r.problems]
    bad += [f"round {r.round}: no throughput" for r in rounds if not r.problems and not _usable(r)]
    if len(rounds) < planned:
        seen = {r.round for r in rounds}
        missing = [str(i) for i in range(planned) if i not in seen]
        bad.append(f"round{'s' if len(missing) > 1 else ''} {', '.join(missing)} not measured")
    good = [r for r in rounds if not r.problems and _usable(r)]
    ratios = tuple(r.spec / r.baseline for r in good)
    drift = baseline_drift([p for r in good for p in r.passes]) if len(good) >= 2 else None
    moves = [r.sandwich_drift for r in good if r.sandwich_drift is not None]
    sandwich_drift = max(moves) if moves else None
    unsteady = tuple(r.round for r in good if (r.sandwich_drift or 0) > sandwich_bound)
    if not ratios:
        return PairedSpeedup(None, None, (), planned, drift, "invalid", "; ".join(bad) or "no round measured",
                             sandwich_drift=sandwich_drift, unsteady_rounds=unsteady)
    value, ci, coverage = median_interval(ratios, confidence)
    unstable = instability(good, drift_bound, sandwich_bound)
    if bad:
        status, reason = "invalid", "; ".join(bad)
    elif unstable:
        status, reason = "unstable", unstable
    else:
        status, reason = "ok", ""
    return PairedSpeedup(value, ci, ratios, planned, drift, status, reason, coverage,
                         sandwich_drift=sandwich_drift, unsteady_rounds=unsteady)


def summary_lines(speedups: Sequence[tuple[str, PairedSpeedup]]) -> list[str]:
    """The run summary's block: one line per speculative cell, unstable and invalid ones marked."""
    if not speedups:
        return []
    lines = [f"speedup over plain decoding, paired per round ({METHOD}, {100 * CONFIDENCE:g}% CI; "
             f"unstable: plain drift > {100 * DRIFT_BOUND:g}% across rounds, or > {100 * SANDWICH_BOUND:g}% "
             "inside half the rounds):"]
    width = max(len(label) for label, _ in speedups)
    lines += [f"  {label.ljust(width)}  {summary.shown()}" for label, summary in speedups]
    flagged = [s.status for _, s in speedups if s.status != "ok"]
    if flagged:
        lines.append(f"  {flagged.count('unstable')} unstable, {flagged.count('invalid')} invalid: "
                     "reported, never judged as pass or fail")
    return lines
