"""Percentiles and means of latency-like samples: one convention for the whole project.

Percentile = linear interpolation between closest ranks ("type 7"): sort x_0 ≤ … ≤ x_{n-1},
h = (n − 1)·q, result x_⌊h⌋ + (h − ⌊h⌋)·(x_⌊h⌋+1 − x_⌊h⌋). This is numpy's default
(`np.percentile(x, 100·q)`), DuckDB's `quantile_cont(x, q)` and PostgreSQL's `percentile_cont(q)`, so
the SQL views reproduce the Python numbers exactly. Chosen over nearest-rank because small benchmark
runs (tens of requests) would otherwise report p99 = max and jump between runs by whole samples.

Every sample counts once (a request for TTFT/TPOT/speed, a gap for ITL); n is the number of samples.
"""

from __future__ import annotations

import math
from typing import Sequence

from contracts.metric import Metric

LATENCY_PERCENTILES = (50, 90, 99)  # lower is better: the tail is high
SPEED_PERCENTILES = (1, 10, 50)  # higher is better: the tail is low


def percentile(samples: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in 0 … 100) by linear interpolation; None for no samples.

    SQL: `quantile_cont(x, q / 100)`.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must lie in 0 … 100, got {q}")
    if not samples:
        return None
    xs = sorted(samples)
    h = (len(xs) - 1) * q / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def describe(name: str, samples: Sequence[float], unit: str, percentiles: Sequence[int]) -> dict[str, Metric]:
    """`<name>_mean` and `<name>_p<q>` for each q, every one over the same n samples.

    SQL: `avg(x)`, `quantile_cont(x, q / 100)`, `count(x)`.
    """
    n = len(samples)
    out = {f"{name}_mean": Metric(sum(samples) / n if n else None, unit, n)}
    for q in percentiles:
        out[f"{name}_p{q}"] = Metric(percentile(samples, q), unit, n)
    return out
