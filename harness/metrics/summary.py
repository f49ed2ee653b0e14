"""`summarise`: every derived metric of one measured case, as a long-form `MetricSet` for the store."""

from __future__ import annotations

from typing import Mapping, Sequence

from harness.metrics import acceptance, confidence, latency, rates, steps as step_metrics
from contracts.metric import Metric, MetricSet
from harness.metrics.percentiles import LATENCY_PERCENTILES, SPEED_PERCENTILES, describe
from contracts.records import RequestRecord, StepRecord
from harness.metrics.window import MeasurementWindow, requests_in, steps_in, succeeded
from harness.metrics.dependencies import HARDWARE


def summarise(
    records: Sequence[RequestRecord],
    steps: Sequence[StepRecord],
    window: MeasurementWindow,
    sla: rates.SLA | None = None,
    plain: Mapping[str, Metric] | None = None,
    temperatures=None,
    offsets=None,
) -> MetricSet:
    """Derived metrics of one case (one engine × drafter × task × load …) over `window`.

    `records`/`steps` may cover the whole run: the window rule selects (requests by finish time, steps
    by end time; warm-up lies before `window.start_s`). `sla` adds goodput and attainment; `plain`, the
    MetricSet of plain decoding measured in the same run, adds the speedups; `temperatures` (STS T_j,
    [γ], with `offsets` b_j where the draft's fit has them) adds the calibrated ECE. Metrics that need data
    the records lack (no token times, no confidences, no steps) are left out; metrics with an empty
    population are present with value None.
    """
    inside = requests_in(records, window)
    ok = succeeded(inside)
    window_steps = steps_in(steps, window)
    out: dict[str, Metric] = {
        "window_s": Metric(window.duration_s, "s", len(inside)),
        "requests": Metric(len(ok), "requests", len(inside)),
        "requests_failed": Metric(len(inside) - len(ok), "requests", len(inside)),
        "failed_request_rate": rates.failed_request_rate(inside, window),
        "output_tokens": Metric(sum(r.output_tokens for r in ok), "tokens", len(ok)),
        "throughput": rates.throughput(inside, window),
        "request_throughput": rates.request_throughput(inside, window),
    }
    if sla is not None:
        out["goodput"] = rates.goodput(inside, window, sla)
        out["sla_attainment"] = rates.sla_attainment(inside, window, sla)

    out["acceptance_length"] = acceptance.acceptance_length(ok)
    out["accepted_per_step"] = acceptance.accepted_per_step(ok)
    out["verified_per_step"] = acceptance.verified_per_step(ok)
    out["draft_coverage"] = acceptance.draft_coverage(ok)
    out["tokens_per_target_forward"] = acceptance.tokens_per_target_forward(ok)
    out["budget_cut_tokens"] = acceptance.budget_cut_tokens(ok)
    out["draft_acceptance_rate"] = acceptance.draft_acceptance_rate(ok)
    out["wasted_verification_fraction"] = acceptance.wasted_verification_fraction(ok)
    for k, m in enumerate(acceptance.position_acceptance_unconditional(ok), start=1):
        out[f"position_acceptance_unconditional_k{k}"] = m
    for k, m in enumerate(acceptance.position_acceptance_conditional(ok), start=1):
        out[f"position_acceptance_conditional_k{k}"] = m
    out.update(confidence.calibration_metrics(ok, temperatures, offsets=offsets))

    out.update(describe("ttft", latency.ttft_samples(ok), "s", LATENCY_PERCENTILES))
    out.update(describe("tpot", latency.tpot_samples(ok), "s/token", LATENCY_PERCENTILES))
    if any(r.token_times_s for r in ok):
        out.update(describe("itl", latency.itl_samples(ok), "s", LATENCY_PERCENTILES))
        out.update(describe("itl_per_token", latency.itl_samples(ok, per_token=True), "s", LATENCY_PERCENTILES))
    out.update(describe("user_speed", latency.user_speed_samples(ok), "tokens/s", SPEED_PERCENTILES))

    if window_steps:
        out["step_batch_size_mean"] = step_metrics.batch_size_mean(window_steps)
        out["step_verify_tokens_mean"] = step_metrics.verify_tokens_per_step(window_steps)
        out["step_emitted_tokens_mean"] = step_metrics.emitted_tokens_per_step(window_steps)
        out["steps_per_s"] = step_metrics.steps_per_second(window_steps)
        out.update(describe("step_time", step_metrics.step_times(window_steps), "s", LATENCY_PERCENTILES))

    if plain is not None:
        out.update(rates.speedup(out, plain))
    return MetricSet(out)


# Comparability (harness.metrics.dependencies): the window and what finished inside it are timing.
DEPENDS_ON = {name: HARDWARE for name in ("window_s", "requests", "requests_failed", "output_tokens")}
