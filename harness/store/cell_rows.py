"""A `CellResult` as columns of the store's raw tables, and back.

Why both directions in one place: the round trip is the contract — whatever a backend reported can be
read back as the same `CellResult` (records, steps, window, metrics, bins), so metrics can be re-derived
from the store with new code, and the SQL views see exactly the rows the Python metrics saw.

Layout (one row per raw item, as `harness.metrics` names them): `requests` one per request (turn),
`request_steps` one per verify step (`step` from 0), `request_tokens` one per output token that has a
time, `step_confidences` one per verified draft (`position` from 1), `engine_steps` one per engine
step, `calibration_bins` one per bin, `metrics` one per `MetricSet` row. Values go in as they are:
floats are stored as DOUBLE, so they come back bit for bit.
"""

from __future__ import annotations

import json
from typing import Any

from contracts.cells import CalibrationBin, CellResult, RequestResult
from contracts.metric import Metric, MetricSet
from contracts.records import MeasurementWindow, RequestRecord, StepRecord


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: equal values give equal text (for comparisons in SQL and in exports)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def result_columns(result: CellResult) -> dict[str, dict[str, list]]:
    """{table: {column: values}} for the raw tables of one cell (without run_id, cell_id, repeat)."""
    requests: dict[str, list] = {name: [] for name in (
        "request_id", "prompt_key", "sample_index", "turn", "warmup", "prompt_tokens", "output_tokens",
        "arrival_s", "first_token_s", "finish_s", "finish_reason", "error", "num_drafts", "output_ids", "all_steps")}
    steps: dict[str, list] = {name: [] for name in (
        "request_id", "step", "num_drafts", "num_verified", "num_accepted")}
    tokens: dict[str, list] = {"request_id": [], "token_index": [], "t_s": []}
    confidences: dict[str, list] = {"request_id": [], "step": [], "position": [], "logit": []}
    seen: set[str] = set()
    for rr in result.requests:
        rec = rr.record
        if rec.request_id in seen:
            raise ValueError(f"request_id {rec.request_id!r} appears twice in one cell; the store keys rows by it")
        seen.add(rec.request_id)
        for name, value in (
            ("request_id", rec.request_id), ("prompt_key", rr.prompt_key), ("sample_index", rr.sample_index),
            ("turn", rr.turn), ("warmup", rr.warmup), ("prompt_tokens", rec.prompt_tokens),
            ("output_tokens", rec.output_tokens), ("arrival_s", rec.arrival_s),
            ("first_token_s", rec.first_token_s), ("finish_s", rec.finish_s),
            ("finish_reason", rec.finish_reason), ("error", rec.error), ("num_drafts", rec.num_drafts),
            ("output_ids", list(rr.output_ids)), ("all_steps", rec.all_steps),
        ):
            requests[name].append(value)
        num_steps = rec.num_steps
        steps["request_id"].extend([rec.request_id] * num_steps)
        steps["step"].extend(range(num_steps))
        steps["num_drafts"].extend([rec.num_drafts] * num_steps)
        steps["num_verified"].extend(rec.num_verified)
        steps["num_accepted"].extend(rec.num_accepted)
        times = rec.token_times_s
        tokens["request_id"].extend([rec.request_id] * len(times))
        tokens["token_index"].extend(range(len(times)))
        tokens["t_s"].extend(times)
        for step, logits in enumerate(rec.confidence_logits):
            confidences["request_id"].extend([rec.request_id] * len(logits))
            confidences["step"].extend([step] * len(logits))
            confidences["position"].extend(range(1, len(logits) + 1))
            confidences["logit"].extend(logits)
    engine: dict[str, list[Any]] = {
        "step": [s.step for s in result.steps], "t_s": [s.t_s for s in result.steps],
        "batch_size": [s.batch_size for s in result.steps], "num_verified": [s.num_verified for s in result.steps],
        "num_accepted": [s.num_accepted for s in result.steps], "wall_s": [s.wall_s for s in result.steps],
        "draft_length": [s.draft_length for s in result.steps], "num_prefilled": [s.num_prefilled for s in result.steps],
    }
    bin_fields = ("kind", "position", "bin", "lower", "upper", "count", "confidence_sum", "outcome_sum")
    bins = {name: [getattr(b, name) for b in result.calibration_bins] for name in bin_fields}
    metric_rows = result.metrics.rows()
    metrics = {name: [row[i] for row in metric_rows] for i, name in enumerate(("metric", "value", "unit", "n"))}
    return {
        "requests": requests, "request_steps": steps, "request_tokens": tokens, "step_confidences": confidences,
        "engine_steps": engine, "calibration_bins": bins, "metrics": metrics,
    }


def build_result(cell_row: dict, tables: dict[str, list[dict]]) -> CellResult | None:
    """The `CellResult` a cell's rows describe; None for a cell recorded without a result (no window).

    `cell_row` is the `cells` row, `tables` the rows of each raw table (dicts by column), any order."""
    if cell_row["window_start_s"] is None or cell_row["window_end_s"] is None:
        return None
    steps_of: dict[str, list[dict]] = {}
    for row in sorted(tables["request_steps"], key=lambda r: r["step"]):
        steps_of.setdefault(row["request_id"], []).append(row)
    times_of: dict[str, list[float]] = {}
    for row in sorted(tables["request_tokens"], key=lambda r: r["token_index"]):
        times_of.setdefault(row["request_id"], []).append(row["t_s"])
    logits_of: dict[tuple[str, int], list[float]] = {}
    for row in sorted(tables["step_confidences"], key=lambda r: r["position"]):
        logits_of.setdefault((row["request_id"], row["step"]), []).append(row["logit"])
    has_confidences = {request_id for request_id, _ in logits_of}

    requests = []
    for row in tables["requests"]:
        rid = row["request_id"]
        steps = steps_of.get(rid, [])
        logits = tuple(tuple(logits_of.get((rid, s["step"]), ())) for s in steps) if rid in has_confidences else ()
        record = RequestRecord(
            request_id=rid, prompt_tokens=row["prompt_tokens"], output_tokens=row["output_tokens"],
            arrival_s=row["arrival_s"], first_token_s=row["first_token_s"], finish_s=row["finish_s"],
            token_times_s=tuple(times_of.get(rid, ())), num_drafts=row["num_drafts"],
            num_verified=tuple(s["num_verified"] for s in steps), num_accepted=tuple(s["num_accepted"] for s in steps),
            confidence_logits=logits, finish_reason=row["finish_reason"], error=row["error"],
            all_steps=row.get("all_steps") is not False,
        )
        requests.append(RequestResult(
            record=record, prompt_key=row["prompt_key"], sample_index=row["sample_index"], turn=row["turn"],
            warmup=row["warmup"], output_ids=tuple(row["output_ids"] or ()),
        ))
    engine_steps = [
        StepRecord(step=r["step"], t_s=r["t_s"], batch_size=r["batch_size"], num_verified=r["num_verified"],
                   num_accepted=r["num_accepted"], wall_s=r["wall_s"], draft_length=r.get("draft_length") or 0,
                   num_prefilled=r.get("num_prefilled") or 0)
        for r in sorted(tables["engine_steps"], key=lambda r: r["step"])
    ]
    bins = [
        CalibrationBin(kind=r["kind"], position=r["position"], bin=r["bin"], lower=r["lower"], upper=r["upper"],
                       count=r["count"], confidence_sum=r["confidence_sum"], outcome_sum=r["outcome_sum"])
        for r in tables["calibration_bins"]
    ]
    metrics = MetricSet({r["metric"]: Metric(r["value"], r["unit"], r["n"]) for r in tables["metrics"]})
    sts, offsets = cell_row["sts_temperatures"], cell_row.get("sts_offsets")
    return CellResult(
        requests=requests,
        steps=engine_steps,
        window=MeasurementWindow(cell_row["window_start_s"], cell_row["window_end_s"]),
        provenance=json.loads(cell_row["provenance"]) if cell_row["provenance"] else {},
        sts_temperatures=tuple(json.loads(sts)) if sts else None,
        sts_offsets=tuple(json.loads(offsets)) if offsets else None,
        metrics=metrics,
        calibration_bins=bins,
        log=cell_row["log"] or "",
    )
