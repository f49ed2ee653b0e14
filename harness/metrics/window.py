"""The measurement window: which requests and steps a measurement counts.

Rule: a request counts iff it *finished* (or failed) inside the half-open window
`start_s <= finish_s < end_s`; it then counts whole — all its tokens, steps and latencies — even if it
arrived during the warm-up. A step counts iff its end time `t_s` lies in the window.

- Warm-up is excluded by starting the window after it: requests that finish during warm-up (compiles,
  cache fills, the first requests of a ramp) are dropped, never truncated.
- Counting by finish time makes every counted request complete, so its TTFT, TPOT and acceptance are
  whole-request numbers; in steady state the tokens of requests straddling the start and those
  straddling the end balance out. Windows much shorter than one request are noisy under this rule.
- Half-open, so consecutive windows partition a run: each request lands in exactly one.

SQL: `WHERE finish_s >= :start_s AND finish_s < :end_s` (steps: `t_s` instead of `finish_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from harness.metrics.records import RequestRecord, StepRecord


@dataclass(frozen=True)
class MeasurementWindow:
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not self.end_s >= self.start_s:
            raise ValueError(f"window end {self.end_s} is before its start {self.start_s}")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def contains(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    @classmethod
    def after_warmup(cls, records: Sequence[RequestRecord], warmup_s: float = 0.0) -> MeasurementWindow:
        """From `warmup_s` after the first arrival to just past the last finish (so the last one counts)."""
        if not records:
            raise ValueError("no records to place a window on")
        start = min(r.arrival_s for r in records) + warmup_s
        end = math.nextafter(max(r.finish_s for r in records), math.inf)
        return cls(start, max(start, end))


    @classmethod
    def after_warmup_phase(cls, measured: Sequence[RequestRecord], warmup: Sequence[RequestRecord] = ()) -> MeasurementWindow:
        """For a warm-up run as its own phase before the measured load: from just after the last warm-up
        finish (else the first measured arrival) to just past the last measured finish, so every measured
        request counts and no warm-up request does."""
        measured = list(measured) or list(warmup)
        if not measured:
            raise ValueError("no records to place a window on")
        start = math.nextafter(max(r.finish_s for r in warmup), math.inf) if warmup else min(r.arrival_s for r in measured)
        end = math.nextafter(max(r.finish_s for r in measured), math.inf)
        return cls(start, max(start, end))


def requests_in(records: Sequence[RequestRecord], window: MeasurementWindow) -> list[RequestRecord]:
    """Requests that finished or failed in the window, failed ones included."""
    return [r for r in records if window.contains(r.finish_s)]


def succeeded(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Requests without an error: the population of every metric except the failed-request rate."""
    return [r for r in records if not r.failed]


def steps_in(steps: Sequence[StepRecord], window: MeasurementWindow) -> list[StepRecord]:
    return [s for s in steps if window.contains(s.t_s)]
