"""One derived value and the long-form set of them that the store keeps.

A `Metric` is (value, unit, n): n is the size of the population the value aggregates — the denominator
of a ratio (steps for τ, verified drafts for the wasted fraction), the number of samples behind a
percentile, the number of requests behind a throughput. Keeping n beside the value lets reports over
several runs be pooled by re-weighting rather than averaged blindly. An undefined value (n = 0, or a
zero-length window) is None, never NaN: DuckDB and JSON both take NULL, neither takes NaN.
"""

from __future__ import annotations

import math
from typing import Iterator, Mapping, NamedTuple


class Metric(NamedTuple):
    value: float | None  # None where undefined
    unit: str
    n: int  # population behind the value (a ratio's denominator count, a percentile's sample count)


def ratio(numerator: float, denominator: float, unit: str, n: int | None = None) -> Metric:
    """numerator / denominator, None when the denominator is 0; n defaults to the denominator (a count)."""
    n = int(denominator) if n is None else n
    value = numerator / denominator if denominator else None
    return Metric(value, unit, n)


class MetricSet(Mapping[str, Metric]):
    """Derived metrics by name, in insertion order; `rows()` gives the long form the store inserts.

    Names are flat strings; a per-position metric carries its position as `_k<k>` (1-indexed), a
    percentile as `_p<q>`, so `regexp_extract(metric, '_k(\\d+)$', 1)` recovers the position in SQL.
    """

    def __init__(self, metrics: Mapping[str, Metric] | None = None):
        self._metrics: dict[str, Metric] = {}
        for name, metric in (metrics or {}).items():
            self._metrics[name] = _clean(metric)

    def __getitem__(self, name: str) -> Metric:
        return self._metrics[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)

    def __repr__(self) -> str:
        return f"MetricSet({len(self)} metrics)"

    def value(self, name: str) -> float | None:
        """The value alone, None if the metric is undefined or absent."""
        metric = self._metrics.get(name)
        return None if metric is None else metric.value

    def rows(self) -> list[tuple[str, float | None, str, int]]:
        """(metric, value, unit, n) per metric: one INSERT row each."""
        return [(name, m.value, m.unit, m.n) for name, m in self._metrics.items()]


def _clean(metric: Metric) -> Metric:
    value = metric.value
    if value is not None:
        value = float(value)
        if not math.isfinite(value):
            value = None
    return Metric(value, metric.unit, int(metric.n))
