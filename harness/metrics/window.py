"""The measurement window: which requests and steps a measurement counts (the window itself, a record the
backend reports, is `contracts.records.MeasurementWindow`).

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

from typing import Sequence

from contracts.records import MeasurementWindow, RequestRecord, StepRecord


def requests_in(records: Sequence[RequestRecord], window: MeasurementWindow) -> list[RequestRecord]:
    """Requests that finished or failed in the window, failed ones included."""
    return [r for r in records if window.contains(r.finish_s)]


def succeeded(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Requests without an error: the population of every metric except the failed-request rate."""
    return [r for r in records if not r.failed]


def steps_in(steps: Sequence[StepRecord], window: MeasurementWindow) -> list[StepRecord]:
    return [s for s in steps if window.contains(s.t_s)]
