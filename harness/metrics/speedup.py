"""Speedup over plain decoding as a paired, per-round ratio with its interval and a baseline-drift check.

Why paired rounds (asv's interleaved rounds): a shared machine's speed drifts by far more than the
effect measured (1.02× and 3.3× for the same cell on the same code, depending only on when other work
started). The runner therefore measures the plain cell and each speculative cell of a group once per
round, in an order that rotates per round, so both sides of one round's ratio saw nearly the same
machine. Per round r:

    s_r = tokens/s(speculative, round r) ÷ tokens/s(plain, round r)          (store: `v_speedup`)

Summary over the R rounds (all of them valid, else the cell is invalid — never a median that hides a
bad round):

    speedup   exp(mean_r log s_r)                        the geometric mean of the per-round ratios
    95% CI    exp(mean ± t_{0.975, R−1} · sd(log s) / √R)  a t interval on log ratios (none for R = 1)
    drift     max_r plain_r ÷ min_r plain_r − 1          how far the plain baseline moved between rounds

A group whose drift exceeds `DRIFT_BOUND` is `unstable`: its ratios are shown but never judged as pass
or fail (run summary, `v_speedup_summary`, gate). The t interval is the one the gate's `paired_rounds`
test inverts (`harness.gate.stats.rounds_test`), so the interval and the p-value always agree.

SQL mirror: `v_speedup_summary` (harness/store/views.py), value for value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from harness.metrics.student_t import t_quantile

DRIFT_BOUND = 0.25  # the plain baseline may move 25% (max ÷ min − 1) across rounds before a group is unstable
CONFIDENCE = 0.95
# A round of a speculative cell is invalid when drafts were verified and its acceptance length stays
# below this: nothing was accepted, so the drafter or verifier is broken, not slow (`v_rounds`).
MIN_ACCEPTANCE_LENGTH = 1.01
METHOD = "geometric mean of per-round ratios; t interval on log ratios"


@dataclass(frozen=True)
class RoundPair:
    """One round of one speculative cell: its throughput, its plain cell's, and what is wrong with
    either round (`problems`, empty when both are valid)."""

    round: int
    spec: float | None
    plain: float | None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class PairedSpeedup:
    value: float | None  # geometric mean of the per-round ratios
    ci: tuple[float, float] | None  # CONFIDENCE interval; None with fewer than 2 rounds
    ratios: tuple[float, ...]  # per round, in round order
    rounds: int  # rounds planned
    baseline_drift: float | None  # max ÷ min − 1 of the plain throughput over the rounds
    status: str  # ok | unstable | invalid
    reason: str = ""

    def shown(self) -> str:
        """`1.84× [1.79, 1.90] (5 rounds, plain drift 4%)`, and the status when it is not ok."""
        if self.value is None:
            return f"{self.status}: {self.reason}"
        ci = f" [{self.ci[0]:.2f}, {self.ci[1]:.2f}]" if self.ci else " [no interval: 1 round]"
        drift = f", plain drift {100 * self.baseline_drift:.0f}%" if self.baseline_drift is not None else ""
        tail = "" if self.status == "ok" else f" — {self.status.upper()}: {self.reason}"
        return f"{self.value:.2f}×{ci} ({len(self.ratios)} rounds{drift}){tail}"


def log_interval(logs: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, tuple[float, float] | None]:
    """(mean, t interval or None for n < 2) of log ratios."""
    n = len(logs)
    mean = sum(logs) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return mean, (mean - half, mean + half)


def baseline_drift(plain: Sequence[float]) -> float | None:
    """max ÷ min − 1 of the plain throughput over rounds (None: fewer than two positive values)."""
    values = [p for p in plain if p is not None and p > 0]
    return max(values) / min(values) - 1 if len(values) >= 2 else None


def paired_speedup(rounds: Sequence[RoundPair], planned: int, drift_bound: float = DRIFT_BOUND,
                   confidence: float = CONFIDENCE) -> PairedSpeedup:
    """The summary of one speculative cell's rounds (module docstring). `planned`: rounds the run planned;
    fewer recorded (an interrupted or truncated run) makes the cell invalid, as does any invalid round."""
    rounds = sorted(rounds, key=lambda r: r.round)
    bad = [f"round {r.round}: {'; '.join(r.problems)}" for r in rounds if r.problems]
    bad += [f"round {r.round}: no throughput" for r in rounds
            if not r.problems and not (r.spec and r.plain and r.spec > 0 and r.plain > 0)]
    if len(rounds) < planned:
        seen = {r.round for r in rounds}
        missing = [str(i) for i in range(planned) if i not in seen]
        bad.append(f"round{'s' if len(missing) > 1 else ''} {', '.join(missing)} not measured")
    good = [r for r in rounds if not r.problems and r.spec and r.plain and r.spec > 0 and r.plain > 0]
    ratios = tuple(r.spec / r.plain for r in good)
    drift = baseline_drift([r.plain for r in good])
    if not ratios:
        return PairedSpeedup(None, None, (), planned, drift, "invalid", "; ".join(bad) or "no round measured")
    mean, interval = log_interval([math.log(x) for x in ratios], confidence)
    ci = (math.exp(interval[0]), math.exp(interval[1])) if interval else None
    if bad:
        status, reason = "invalid", "; ".join(bad)
    elif drift is not None and drift > drift_bound:
        status, reason = "unstable", f"plain baseline moved {100 * drift:.0f}% between rounds (> {100 * drift_bound:g}%)"
    else:
        status, reason = "ok", ""
    return PairedSpeedup(math.exp(mean), ci, ratios, planned, drift, status, reason)


def summary_lines(speedups: Sequence[tuple[str, PairedSpeedup]]) -> list[str]:
    """The run summary's block: one line per speculative cell, unstable and invalid ones marked."""
    if not speedups:
        return []
    lines = [f"speedup over plain decoding, paired per round ({METHOD}, {100 * CONFIDENCE:g}% CI; "
             f"unstable: plain drift > {100 * DRIFT_BOUND:g}%):"]
    width = max(len(label) for label, _ in speedups)
    lines += [f"  {label.ljust(width)}  {summary.shown()}" for label, summary in speedups]
    flagged = [s.status for _, s in speedups if s.status != "ok"]
    if flagged:
        lines.append(f"  {flagged.count('unstable')} unstable, {flagged.count('invalid')} invalid: "
                     "reported, never judged as pass or fail")
    return lines
