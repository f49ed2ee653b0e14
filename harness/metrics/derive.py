"""One cell run's raw records → its metrics and reliability bins: the one place a backend's output is derived.

Backends return raw records only (`contracts.cells.CellResult`: requests, engine steps, the window, the
drafter's STS temperatures, and, for servers that report no per-request steps, their counters); the
executor calls `derive` on each result before it is stored, so every backend's numbers come from the same
definitions (`summarise`, `server_counts`, `confidence.reliability_bins`) and mean the same.
"""

from __future__ import annotations

from dataclasses import replace

from contracts.cells import CalibrationBin, Cell, CellResult
from contracts.metric import Metric, MetricSet
from harness.metrics.confidence import reliability_bins
from harness.metrics.server_counts import spec_count_metrics, ttft_server_mean
from harness.metrics.summary import summarise
from harness.metrics.window import requests_in, succeeded


def derive(cell: Cell, result: CellResult) -> CellResult:
    """`result` with its `metrics` and `calibration_bins` derived from its records (anything there is replaced).

    Acceptance comes from the per-request steps, except where the backend could report only server-wide
    counters (`result.spec_counts`), which then define it; a synthetic-acceptance cell carries the flag
    metric `synthetic_acceptance` = 1, so a query over acceptance or throughput can exclude (or select) it."""
    records = [r.record for r in result.requests]
    temperatures, offsets = result.sts_temperatures, result.sts_offsets
    metrics = dict(summarise(records, result.steps, result.window, sla=cell.sla, temperatures=temperatures,
                             offsets=offsets))
    if result.spec_counts is not None:
        metrics.update(spec_count_metrics(result.spec_counts, cell.num_drafts))
    if result.server_ttft is not None:
        metrics["ttft_server_mean"] = ttft_server_mean(result.server_ttft)
    if cell.is_synthetic:
        metrics["synthetic_acceptance"] = Metric(1.0, "flag", 1)
    in_window = succeeded(requests_in(records, result.window))
    bins = [CalibrationBin(*row) for row in reliability_bins(in_window, temperatures, offsets=offsets)]
    return replace(result, metrics=MetricSet(metrics), calibration_bins=bins)


def measure(backend, cell: Cell, progress=None) -> CellResult:
    """`backend.run_cell(cell)` with its metrics derived: what an executor stores, for callers outside one
    (benchmarks, tests) that want a cell's numbers directly."""
    return derive(cell, backend.run_cell(cell, progress=progress))
