"""What the gate hands back: one `Comparison` per comparable cell × rule, the cells it could not judge, and
the exit code — plain data that `format.py` renders as text, markdown or JUnit XML.

Exit codes, most severe first when several apply:
    2 INVALID      the candidate run is not fit to be judged (`validity.py`); nothing else is judged
    1 REGRESSION   a fail-level regression, or a failed cell in the candidate (a crash is a regression;
                   also when there is no baseline to compare the rest with)
    3 NO_BASELINE  nothing at all could be compared: no candidate cell has a baseline cell with the same
                   content, or every comparison is incomparable (e.g. only speed gates, other hardware)
    0 OK           everything else: passes, improvements, inconclusive comparisons and warn-level
                   regressions (reported, never blocking)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from harness.gate.comparability import CellMatch
from harness.gate.rules import GateRule
from harness.gate.stats import Estimate
from harness.gate.validity import ValidityReport


class ExitCode(IntEnum):
    OK = 0
    REGRESSION = 1
    INVALID = 2
    NO_BASELINE = 3


@dataclass(frozen=True)
class Comparison:
    """One rule on one comparable cell."""

    cell_id: str
    label: str
    rule: GateRule
    verdict: str  # pass | regression | improvement | inconclusive | unstable | invalid | incomparable
    reason: str
    estimate: Estimate | None = None  # None when there was nothing to estimate (missing data)

    @property
    def metric(self) -> str:
        return self.rule.metric

    @property
    def level(self) -> str:
        return self.rule.level

    @property
    def blocking(self) -> bool:
        return self.verdict == "regression" and self.rule.level == "fail"


@dataclass(frozen=True)
class FailedCell:
    cell_id: str
    label: str
    repeats: tuple[int, ...]
    error: str  # the first failed repeat's error


@dataclass(frozen=True)
class GateReport:
    candidate_run: str
    baseline_run: str
    exit_code: ExitCode
    validity: ValidityReport
    comparisons: tuple[Comparison, ...] = ()
    failed_cells: tuple[FailedCell, ...] = ()
    unmatched: tuple[CellMatch, ...] = ()  # candidate cells without a baseline cell of the same content
    notes: tuple[str, ...] = ()  # run-level remarks (e.g. an unusable baseline run)
    counts: dict[str, int] = field(default_factory=dict)  # verdict → number of comparisons

    @property
    def regressions(self) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.verdict == "regression")

    @property
    def summary(self) -> str:
        """The one-line verdict: `FAIL: cand against base: 2 regressions, 1 failed cell, 3 inconclusive, 9 passed`."""
        if self.exit_code == ExitCode.INVALID:
            n = len(self.validity.reasons)
            return f"INVALID: run {self.candidate_run} cannot be judged ({n} problem{_s(n)})"
        blocking = sum(c.blocking for c in self.comparisons)
        warned = sum(c.verdict == "regression" and not c.blocking for c in self.comparisons)
        counts = [
            (blocking, "regression", "regressions"),
            (warned, "warning", "warnings"),
            (len(self.failed_cells), "failed cell", "failed cells"),
            (self.counts.get("improvement", 0), "improvement", "improvements"),
            (self.counts.get("inconclusive", 0), "inconclusive", "inconclusive"),
            (self.counts.get("unstable", 0), "unstable", "unstable"),
            (self.counts.get("invalid", 0), "invalid", "invalid"),
            (self.counts.get("pass", 0), "passed", "passed"),
            (self.counts.get("incomparable", 0), "incomparable", "incomparable"),
            (len(self.unmatched), "cell without baseline", "cells without baseline"),
        ]
        parts = ", ".join(f"{n} {one if n == 1 else many}" for n, one, many in counts if n)
        verb = {ExitCode.OK: "PASS", ExitCode.REGRESSION: "FAIL", ExitCode.NO_BASELINE: "NO BASELINE"}[self.exit_code]
        return f"{verb}: {self.candidate_run} against {self.baseline_run}: {parts or 'nothing compared'}"


def _s(n: int) -> str:
    return "" if n == 1 else "s"
