"""Every derived metric of the project, defined once, with its convention beside it (DSPARK.md §4).

Backends report raw records (`contracts.records`): per request, token counts, timestamps and per-step
(verified, accepted, confidence) counters; per engine step, batch size, verified/accepted drafts and
wall time. Every ratio is derived here, as a simple aggregate over those records, so that the store's
DuckDB views can mirror each definition (the SQL beside each function). One module per concept:

    window.py       the measurement window's rule: requests count by finish time, warm-up excluded
                    (the records and the window themselves: `contracts.records`)
    acceptance.py   τ = 1 + accepted / drafting steps (vLLM's convention), draft coverage, tokens per
                    target forward, tokens cut at the budget, wasted fraction, per-position α_k/β_k
    confidence.py   ECE/Brier raw and STS-calibrated via dspark_core.calibration
    latency.py      TTFT, TPOT, per-user speed, ITL per emission event and per token
    percentiles.py  linear-interpolation percentiles (numpy default = DuckDB quantile_cont)
    rates.py        throughput, goodput under an SLA, failed-request rate, speedup over plain decoding
    steps.py        engine steps: batch size, tokens verified per forward, step time
    summary.py      summarise(...) → MetricSet of (metric, value, unit, n) rows

Populations: failed requests (error set) appear only in the failed-request rate and SLA attainment;
every other request metric is over the window's succeeded requests. Ratios are step-weighted (sums,
then one division), never means of per-request ratios; latency percentiles weigh each request (each
gap for ITL) once.

Tables the SQL assumes (one row per raw item; `:start_s`, `:end_s` are the window):

    requests(request_id, prompt_tokens, output_tokens, arrival_s, first_token_s, finish_s, finish_reason, error,
             all_steps)
    request_steps(request_id, step, num_drafts, num_verified, num_accepted)
    request_tokens(request_id, token_index, t_s)
    step_confidences(request_id, step, position, logit)
    engine_steps(step, t_s, batch_size, num_verified, num_accepted, wall_s, draft_length, num_prefilled)

    ok              = requests WHERE error IS NULL AND finish_s >= :start_s AND finish_s < :end_s
    ok_steps        = request_steps JOIN ok USING (request_id)
    ok_tokens       = request_tokens JOIN ok USING (request_id)
    ok_engine_steps = engine_steps WHERE t_s >= :start_s AND t_s < :end_s
"""

from harness.metrics.acceptance import (
    acceptance_length,
    accepted_per_step,
    budget_cut_tokens,
    draft_acceptance_rate,
    draft_coverage,
    position_acceptance_conditional,
    position_acceptance_unconditional,
    tokens_per_target_forward,
    verified_per_step,
    wasted_verification_fraction,
)
from harness.metrics.confidence import calibration_metrics, calibration_reports, confidence_table
from harness.metrics.latency import (
    emission_events,
    itl_samples,
    tpot,
    tpot_samples,
    ttft,
    ttft_samples,
    user_speed,
    user_speed_samples,
)
from harness.metrics.percentiles import describe, percentile
from harness.metrics.summary import summarise
from harness.metrics.rates import (
    failed_request_rate,
    goodput,
    meets,
    request_throughput,
    sla_attainment,
    speedup,
    throughput,
)
from harness.metrics.window import requests_in, steps_in, succeeded

# The record and value types the metrics read and return live in the leaf `contracts` (backends fill them);
# they are named here too so that harness code has one import for "records in, metrics out".
from contracts.cells import SLA
from contracts.metric import Metric, MetricSet
from contracts.records import MeasurementWindow, RequestRecord, StepRecord

__all__ = [
    "SLA", "MeasurementWindow", "Metric", "MetricSet", "RequestRecord", "StepRecord", "acceptance_length",
    "accepted_per_step", "budget_cut_tokens", "calibration_metrics", "calibration_reports", "confidence_table",
    "describe", "draft_acceptance_rate", "draft_coverage", "emission_events", "failed_request_rate",
    "goodput", "meets", "itl_samples", "percentile", "position_acceptance_conditional",
    "position_acceptance_unconditional", "request_throughput", "requests_in", "sla_attainment", "speedup",
    "steps_in", "succeeded", "summarise", "throughput", "tokens_per_target_forward", "tpot", "tpot_samples", "ttft",
    "ttft_samples", "user_speed", "user_speed_samples", "verified_per_step", "wasted_verification_fraction",
]
