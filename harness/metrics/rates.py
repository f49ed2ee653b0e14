"""System-wide rates over a measurement window: throughput, goodput under an SLA, failures, speedup.

Each function applies the window rule itself (`window.py`: a request counts whole iff it finished in
`[start_s, end_s)`), so it may be given a whole run. Throughput divides by the window's duration, not by
the span of the counted requests, so idle time inside the window costs throughput as it should.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from contracts.cells import SLA
from harness.metrics import latency
from contracts.metric import Metric, ratio
from contracts.records import RequestRecord
from harness.metrics.window import MeasurementWindow, requests_in, succeeded
from harness.metrics.dependencies import HARDWARE


def throughput(records: Sequence[RequestRecord], window: MeasurementWindow) -> Metric:
    """Output tokens/s of the whole system: Σ output_tokens of succeeded requests finished in the
    window ÷ window duration. Tokens of failed requests are not output. n = requests counted.

    SQL: `sum(output_tokens) / (:end_s - :start_s) FROM ok`.
    """
    ok = succeeded(requests_in(records, window))
    return ratio(sum(r.output_tokens for r in ok), window.duration_s, "tokens/s", n=len(ok))


def request_throughput(records: Sequence[RequestRecord], window: MeasurementWindow) -> Metric:
    """Succeeded requests finished per second of window.

    SQL: `count(*) / (:end_s - :start_s) FROM ok`.
    """
    ok = succeeded(requests_in(records, window))
    return ratio(len(ok), window.duration_s, "requests/s", n=len(ok))


def failed_request_rate(records: Sequence[RequestRecord], window: MeasurementWindow) -> Metric:
    """Failed ÷ all requests that finished or failed in the window (failure time decides the window).
    Failed requests appear in no other metric. n = all requests in the window.

    SQL: `avg((error IS NOT NULL)::DOUBLE) FROM requests WHERE finish_s >= :start_s AND finish_s < :end_s`.
    """
    inside = requests_in(records, window)
    return ratio(sum(r.failed for r in inside), len(inside), "fraction")


def meets(sla: SLA, record: RequestRecord) -> bool:
    """SQL: `error IS NULL AND coalesce(ttft <= :ttft_s, true) AND coalesce(tpot <= :tpot_s, true)
    AND coalesce(user_speed >= :min_user_tokens_per_s, true)` (NULL metric or NULL bound passes)."""
    if record.failed:
        return False
    checks = (
        (sla.ttft_s, latency.ttft(record), lambda x, bound: x <= bound),
        (sla.tpot_s, latency.tpot(record), lambda x, bound: x <= bound),
        (sla.min_user_tokens_per_s, latency.user_speed(record), lambda x, bound: x >= bound),
    )
    return all(bound is None or x is None or ok(x, bound) for bound, x, ok in checks)


def goodput(records: Sequence[RequestRecord], window: MeasurementWindow, sla: SLA) -> Metric:
    """Throughput counting only requests that meet every SLA bound: Σ output_tokens of succeeded
    in-window requests meeting the SLA ÷ window duration. n = requests meeting it.

    SQL: `sum(output_tokens) FILTER (WHERE meets_sla) / (:end_s - :start_s) FROM ok`.
    """
    good = [r for r in requests_in(records, window) if meets(sla, r)]
    return ratio(sum(r.output_tokens for r in good), window.duration_s, "tokens/s", n=len(good))


def sla_attainment(records: Sequence[RequestRecord], window: MeasurementWindow, sla: SLA) -> Metric:
    """Share of the window's requests that meet the SLA; a failed request is a miss. n = all requests.

    SQL: `avg(meets_sla::DOUBLE) FROM requests WHERE finish_s >= :start_s AND finish_s < :end_s`.
    """
    inside = requests_in(records, window)
    return ratio(sum(meets(sla, r) for r in inside), len(inside), "fraction")


SPEEDUP_OF = {"speedup": "throughput", "speedup_user_speed": "user_speed_mean"}


def speedup(spec: Mapping[str, Metric], plain: Mapping[str, Metric]) -> dict[str, Metric]:
    """Speculative ÷ plain decoding of the same target, measured in the same run (same prompts,
    hardware and load; never against a number from another run):

    - `speedup` = throughput_spec / throughput_plain (system tokens/s);
    - `speedup_user_speed` = user_speed_mean_spec / user_speed_mean_plain (what one user feels).

    n = requests behind the speculative numerator. SQL: a join of the two cases' metric rows on the
    metric name, `s.value / p.value`.
    """
    out: dict[str, Metric] = {}
    for name, source in SPEEDUP_OF.items():
        s, p = spec.get(source), plain.get(source)
        if s is None or p is None:
            continue
        value = s.value / p.value if s.value is not None and p.value else None
        out[name] = Metric(value, "x", s.n)
    return out


# Comparability (harness.metrics.dependencies): rates and speedups are measured in seconds, on a machine.
DEPENDS_ON = {name: HARDWARE for name in (
    "throughput", "request_throughput", "failed_request_rate", "goodput", "sla_attainment",
    "throughput_speedup", *SPEEDUP_OF,
)}
