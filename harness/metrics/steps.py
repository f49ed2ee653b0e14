"""Engine-step metrics: what each target forward carried and how long it took.

Population: the `StepRecord`s whose end time lies in the window (callers pass those). Engine steps are
system-level, so they include the work of requests that later failed or finish outside the window;
their τ therefore need not equal the request-level τ exactly. Step-weighted, like everything else.
SQL names the window's steps `ok_engine_steps(step, t_s, batch_size, num_verified, num_accepted, wall_s)`.
"""

from __future__ import annotations

from typing import Sequence

from contracts.metric import Metric, ratio
from contracts.records import StepRecord
from harness.metrics.dependencies import HARDWARE


def batch_size_mean(steps: Sequence[StepRecord]) -> Metric:
    """Active requests per step. SQL: `avg(batch_size)`."""
    return ratio(sum(s.batch_size for s in steps), len(steps), "requests/step")


def verify_tokens_per_step(steps: Sequence[StepRecord]) -> Metric:
    """B: tokens the target verifies per forward, anchors included: Σ(num_verified + batch_size) / #steps.
    The x-axis of the scheduler's SPS(B) curve.

    SQL: `avg(num_verified + batch_size)`.
    """
    return ratio(sum(s.num_verified + s.batch_size for s in steps), len(steps), "tokens/step")


def emitted_tokens_per_step(steps: Sequence[StepRecord]) -> Metric:
    """Tokens committed per forward over the whole batch: Σ(num_accepted + batch_size) / #steps.

    SQL: `avg(num_accepted + batch_size)`.
    """
    return ratio(sum(s.num_accepted + s.batch_size for s in steps), len(steps), "tokens/step")


def steps_per_second(steps: Sequence[StepRecord]) -> Metric:
    """Steps per second of step wall time (busy time, idle gaps excluded): #steps / Σ wall_s.

    SQL: `count(*) / sum(wall_s)`.
    """
    return ratio(len(steps), sum(s.wall_s for s in steps), "steps/s", n=len(steps))


def step_times(steps: Sequence[StepRecord]) -> list[float]:
    """Step wall times, one sample per step (for `percentiles.describe`)."""
    return [s.wall_s for s in steps]


# Comparability (harness.metrics.dependencies): batch composition and step times follow the machine's timing.
DEPENDS_ON = {name: HARDWARE for name in (
    "step_batch_size", "step_verify_tokens", "step_emitted_tokens", "steps_per_s", "step_time",
)}
