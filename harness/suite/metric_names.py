"""`known_metric`: whether a gate's metric is one the harness records, so a typo fails at load, not as a
gate that never finds its metric.

Why derived, not listed: every metric is defined once, in `harness.metrics`, and `summarise` is what
writes them; so the names are those `summarise` gives for one small synthetic case that has every
kind of data (steps, token times, confidence logits, an SLA, STS temperatures and a plain baseline),
with per-position names (`…_k3`) taken as families for any position 1…MAX_NUM_DRAFTS. A metric added
to `summarise` is gate-able at once. `FALLBACK` (the names as of this writing) is used only if the
synthetic case itself stops building, which the tests catch.
"""

from __future__ import annotations

import functools
import re

from harness.suite.schema import MAX_NUM_DRAFTS

_POSITION = re.compile(r"^(?P<family>.+)_k(?P<k>[0-9]+)$")
FALLBACK = frozenset({
    "window_s", "requests", "requests_failed", "failed_request_rate", "output_tokens", "throughput",
    "request_throughput", "goodput", "sla_attainment", "acceptance_length", "accepted_per_step",
    "verified_per_step", "draft_acceptance_rate", "draft_coverage", "tokens_per_target_forward",
    "budget_cut_tokens", "wasted_verification_fraction", "ece_raw", "brier_raw",
    "ece_calibrated", "brier_calibrated", "step_batch_size_mean", "step_verify_tokens_mean",
    "step_emitted_tokens_mean", "steps_per_s", "speedup", "speedup_user_speed",
    *(f"{name}_{stat}" for name in ("ttft", "tpot", "itl", "itl_per_token", "step_time")
      for stat in ("mean", "p50", "p90", "p99")),
    *(f"user_speed_{stat}" for stat in ("mean", "p1", "p10", "p50")),
    "position_acceptance_unconditional_k1", "position_acceptance_conditional_k1", "ece_position_raw_k1",
    "ece_position_calibrated_k1",
})


@functools.cache
def metric_names() -> tuple[frozenset[str], frozenset[str]]:
    """(plain names, per-position families) of every metric `harness.metrics.summarise` records."""
    try:
        names = frozenset(_synthetic_names())
    except Exception:  # noqa: BLE001 — a refactor of harness.metrics must not stop every suite loading
        names = FALLBACK
    families = {m.group("family") for m in map(_POSITION.match, names) if m}
    plain = {name for name in names if not ((m := _POSITION.match(name)) and m.group("family") in families)}
    return frozenset(plain), frozenset(families)


def known_metric(name: str) -> bool:
    plain, families = metric_names()
    match = _POSITION.match(name)
    if match and match.group("family") in families:
        return 1 <= int(match.group("k")) <= MAX_NUM_DRAFTS
    return name in plain


def choices() -> list[str]:
    """Every gate-able name, families written `<family>_k<j>`, sorted: what an error lists."""
    plain, families = metric_names()
    return sorted(plain) + sorted(f"{family}_k<j>" for family in families)


def _synthetic_names() -> set[str]:
    from harness.metrics import MeasurementWindow, RequestRecord, StepRecord, summarise
    from harness.metrics import rates

    gamma = 2
    records = [
        RequestRecord(request_id=f"r{i}", prompt_tokens=4, output_tokens=5, arrival_s=0.0, first_token_s=0.1,
                      finish_s=0.5, token_times_s=(0.1, 0.2, 0.2, 0.3, 0.5), num_drafts=gamma,
                      num_verified=(2, 2), num_accepted=(2, 0), confidence_logits=((1.0, 0.5), (0.2, -1.0)))
        for i in range(2)
    ]
    steps = [StepRecord(step=0, t_s=0.2, batch_size=2, num_verified=4, num_accepted=4, wall_s=0.1),
             StepRecord(step=1, t_s=0.3, batch_size=2, num_verified=4, num_accepted=0, wall_s=0.1)]
    window = MeasurementWindow(0.0, 1.0)
    sla = rates.SLA(ttft_s=1.0, tpot_s=1.0)
    plain = summarise(records, steps, window)
    return set(summarise(records, steps, window, sla=sla, plain=plain, temperatures=[1.0] * gamma))
