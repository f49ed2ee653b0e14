"""Per-request latency samples: TTFT, TPOT, per-user speed and inter-token latency (ITL).

Population: succeeded requests only (a failed request's times describe the failure, not the service);
callers pass the window's requests. The samples here are aggregated by `percentiles.describe`, one
sample per request (TTFT, TPOT, speed) or per gap (ITL), so a request with more gaps weighs more in ITL.

SQL names `ok(request_id, output_tokens, arrival_s, first_token_s, finish_s)` the window's succeeded
requests and `ok_tokens(request_id, token_index, t_s)` their token emission times (package docstring).
"""

from __future__ import annotations

from typing import Sequence

from contracts.records import RequestRecord
from harness.metrics.dependencies import HARDWARE


def ttft(record: RequestRecord) -> float | None:
    """Time to first token: first_token_s − arrival_s, queueing and prefill included.

    SQL: `first_token_s - arrival_s`.
    """
    if record.failed or record.first_token_s is None:
        return None
    return record.first_token_s - record.arrival_s


def tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first: (finish_s − first_token_s) / (output_tokens − 1).

    TTFT is excluded (it is reported on its own, and depends on the prompt and the queue, not on the
    decoding method); the first token is excluded from the count for the same reason. Undefined (None)
    for a request with a single output token. Speculation lowers it by emitting several tokens a step.

    SQL: `(finish_s - first_token_s) / (output_tokens - 1) WHERE output_tokens > 1`.
    """
    if record.failed or record.first_token_s is None or record.output_tokens < 2:
        return None
    return (record.finish_s - record.first_token_s) / (record.output_tokens - 1)


def user_speed(record: RequestRecord) -> float | None:
    """Per-user speed, output tokens/s one user sees while decoding:
    (output_tokens − 1) / (finish_s − first_token_s) = 1 / TPOT.

    TTFT is excluded, and so is the first token it paid for: counting output_tokens over the decode
    interval would credit the prefill's token to decoding (a 2-token request would look twice as fast).
    This is the speed a "120 tokens/s per user" SLA means; the TTFT bound is a separate one.
    Undefined for a single output token or a zero decode interval.

    SQL: `(output_tokens - 1) / (finish_s - first_token_s) WHERE output_tokens > 1 AND finish_s > first_token_s`.
    """
    if record.failed or record.first_token_s is None or record.output_tokens < 2:
        return None
    decode_s = record.finish_s - record.first_token_s
    return (record.output_tokens - 1) / decode_s if decode_s > 0 else None


def _samples(records: Sequence[RequestRecord], per_request) -> list[float]:
    return [x for x in (per_request(r) for r in records) if x is not None]


def ttft_samples(records: Sequence[RequestRecord]) -> list[float]:
    return _samples(records, ttft)


def tpot_samples(records: Sequence[RequestRecord]) -> list[float]:
    return _samples(records, tpot)


def user_speed_samples(records: Sequence[RequestRecord]) -> list[float]:
    return _samples(records, user_speed)


def emission_events(record: RequestRecord) -> list[tuple[float, int]]:
    """(time, tokens) per emission event: consecutive tokens with the same timestamp arrived together
    (one verify step emits a + 1 of them)."""
    events: list[tuple[float, int]] = []
    for t in record.token_times_s:
        if events and events[-1][0] == t:
            events[-1] = (t, events[-1][1] + 1)
        else:
            events.append((t, 1))
    return events


def itl_samples(records: Sequence[RequestRecord], per_token: bool = False) -> list[float]:
    """Inter-token latency gaps, pooled over requests that reported token times.

    - per emission event (default, `itl`): the gap between consecutive emission events after the first
      token, one sample per event — how long a streaming user waits for the next chunk. With
      speculation a chunk holds a + 1 tokens, so this is about one step's time, not one token's; it is
      what vLLM's serving benchmark calls ITL (gaps between streamed chunks).
    - per token (`itl_per_token`): t_i − t_{i−1} for every token after the first, 0 for the tokens that
      arrived with the previous one. Its per-request mean is (t_last − t_first) / (n − 1) = TPOT.

    SQL (per event): `SELECT t_s - lag(t_s) OVER (PARTITION BY request_id ORDER BY t_s) AS gap
    FROM (SELECT DISTINCT request_id, t_s FROM ok_tokens)`; per token: the same lag over
    `ok_tokens ORDER BY token_index`; drop the NULL first gap.
    """
    gaps: list[float] = []
    for r in records:
        if r.failed:
            continue
        times = r.token_times_s if per_token else [t for t, _ in emission_events(r)]
        gaps.extend(b - a for a, b in zip(times, times[1:]))
    return gaps


# Comparability (harness.metrics.dependencies): seconds depend on the machine.
DEPENDS_ON = {name: HARDWARE for name in ("ttft", "tpot", "itl", "itl_per_token", "user_speed")}
