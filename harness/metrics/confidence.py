"""Calibration of the confidence head over the records: ECE and Brier, raw and calibrated.

Calibrated: with the drafter's own fitted calibration, its STS temperatures T_j and, where its build fitted
them (`dspark_core.calibration.fit_sts_level`), the level offsets b_j beside them (a draft without offsets
is calibrated by STS alone, b_j = 0). The cell row keeps both (`cells.sts_temperatures`, `cells.sts_offsets`).

The one ECE of the project (summary, store, views, report, gate): 20 equal-width bins of cumulative
survival a_j *per draft position j* (each position its own bins), observed positions only, and

    ece_<kind> = Σ_j Σ_b |Σ_b a_j − Σ_b y_j| / Σ_j N_j      (= the N_j-weighted mean of ECE_j)

defined once in `dspark_core.calibration`. Its per-position terms are a metric of their own name,
`ece_position_<kind>_k<j>` = Σ_b |Σ_b a_j − Σ_b y_j| / N_j, so no value named `ece_*` is ever a
different statistic. Pooling positions into one set of bins before taking the gaps is *not* this ECE
(gaps of different positions cancel) and nothing here computes it; the reliability bins the store keeps
(`reliability_bins`) are per position, and summing their |gaps| over positions and bins, then dividing
by their counts, gives back `ece_<kind>` exactly (the report's diagrams and the `v_ece` view do).
This module only builds the [cycles, γ] input from the records and names the results. A cycle is a verify step of a succeeded
request whose drafter carried a confidence head; unverified positions are padded and never observed.

SQL mirror: `step_confidences(request_id, step, position, logit)` joined to `ok_steps`; a_j is a
windowed `exp(sum(ln(sigmoid(logit / T_j + b_j))) OVER (PARTITION BY request_id, step ORDER BY position))`,
realised y_j = `num_accepted >= position` (rows with position <= num_verified only), bin
`least(floor(a_j * 20), 19)`; per (position, bin) `gap = sum(a_j) - sum(y_j)`, then per position
`ECE_j = sum(abs(gap)) / N_j` and overall `sum(abs(gap)) / sum(N_j)`; Brier `avg((a_j - y_j)^2)`.
"""

from __future__ import annotations

from typing import Sequence

from contracts.metric import Metric
from contracts.records import RequestRecord
from harness.metrics.dependencies import CONTENT


def confidence_table(records: Sequence[RequestRecord]):
    """(conf_logits [cycles, γ] float64, num_verified [cycles], num_accepted [cycles]) or None if no
    succeeded record carries confidences; γ is the largest num_drafts among those that do."""
    with_conf = [r for r in records if not r.failed and r.confidence_logits]
    if not with_conf:
        return None
    import torch
    gamma = max(r.num_drafts for r in with_conf)
    rows, verified, accepted = [], [], []
    for r in with_conf:
        for logits, v, a in zip(r.confidence_logits, r.num_verified, r.num_accepted):
            rows.append(list(logits) + [0.0] * (gamma - len(logits)))  # padding is never observed (j > v)
            verified.append(v)
            accepted.append(a)
    return (
        torch.tensor(rows, dtype=torch.float64).reshape(len(rows), gamma),
        torch.tensor(verified, dtype=torch.long),
        torch.tensor(accepted, dtype=torch.long),
    )


def calibration_reports(records: Sequence[RequestRecord], temperatures=None, num_bins: int = 20, *, offsets=None):
    """(raw report, calibrated report or None) from `dspark_core.calibration.expected_calibration_error`,
    the table built once; None if no record carries confidences. `temperatures`: STS T_j, [γ]; `offsets`:
    the level offsets b_j fitted with them (`calibration.fit_sts_level`), [γ], or None (0)."""
    table = confidence_table(records)
    if table is None:
        return None
    import torch

    from dspark_core.calibration import expected_calibration_error
    conf_logits, num_verified, num_accepted = table
    raw = expected_calibration_error(conf_logits, num_verified, num_accepted, num_bins=num_bins)
    calibrated = None
    if temperatures is not None:
        temps = torch.as_tensor(temperatures, dtype=torch.float64)
        if temps.shape != (conf_logits.shape[1],):
            raise ValueError(f"temperatures must be [γ={conf_logits.shape[1]}], got shape {tuple(temps.shape)}")
        levels = None
        if offsets is not None:
            levels = torch.as_tensor(offsets, dtype=torch.float64)
            if levels.shape != temps.shape:
                raise ValueError(f"offsets must be [γ={conf_logits.shape[1]}], got shape {tuple(levels.shape)}")
        calibrated = expected_calibration_error(conf_logits, num_verified, num_accepted, temperatures=temps,
                                                num_bins=num_bins, offsets=levels)
    return raw, calibrated


def calibration_metrics(records: Sequence[RequestRecord], temperatures=None, num_bins: int = 20, *,
                        offsets=None) -> dict[str, Metric]:
    """`ece_raw`, `brier_raw` and per position `ece_position_raw_k<j>` (n = observed cycles), and the same
    with `calibrated` when STS temperatures (and their level offsets, if any) are given. ECE and Brier are
    fractions (0 … 1), not percent."""
    reports = calibration_reports(records, temperatures, num_bins, offsets=offsets)
    if reports is None:
        return {}
    out: dict[str, Metric] = {}
    for label, report in zip(("raw", "calibrated"), reports):
        if report is None:
            continue
        total = int(report.num_observed.sum())
        out[f"ece_{label}"] = Metric(report.ece, "fraction", total)
        out[f"brier_{label}"] = Metric(report.brier, "fraction", total)
        for row in report.position_rows():
            out[f"ece_position_{label}_k{row['position']}"] = Metric(row["ece"], "fraction", row["num_observed"])
    return out


def reliability_bins(records: Sequence[RequestRecord], temperatures=None, num_bins: int = 20, *,
                     offsets=None) -> list[tuple]:
    """The non-empty reliability bins, per draft position: (kind, position ≥ 1, bin, lower, upper, count,
    Σ predicted survival, Σ realised survival), raw and (with temperatures) calibrated; [] without
    confidences. Σ|Σ pred − Σ real| / Σ count over a kind's rows is its `ece_<kind>`."""
    reports = calibration_reports(records, temperatures, num_bins, offsets=offsets)
    if reports is None:
        return []
    out = []
    for kind, report in zip(("raw", "calibrated"), reports):
        if report is None:
            continue
        for row in report.reliability_rows():
            count = int(row["count"])
            out.append((kind, int(row["position"]), int(row["bin"]), row["bin_lo"], row["bin_hi"], count,
                        float(row["mean_predicted"]) * count, float(row["mean_realised"]) * count))
    return out


# Comparability (harness.metrics.dependencies): confidences and acceptances are content, not timing.
DEPENDS_ON = {name: CONTENT for name in (
    "ece_raw", "ece_calibrated", "brier_raw", "brier_calibrated", "ece_position_raw", "ece_position_calibrated",
)}
