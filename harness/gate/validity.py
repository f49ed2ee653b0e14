"""Whether a run is fit to be judged at all (`harness.gate.rules.Validity`).

An invalid run says nothing about the code — an interrupted run, a window too short to hold a steady
state, a cell that measured three requests — so the gate refuses it (exit 2) with the reasons, instead
of passing or failing it on noise. Checks, on the candidate run:

- the run finished (`runs.status = 'finished'`; running, interrupted and failed runs are incomplete);
- failed cell repeats ÷ cell repeats ≤ `max_failed_fraction` (within that allowance failed cells are
  still reported and fail the gate, exit 1: a crash is a regression; beyond it the run is too broken to
  compare at all);
- per ok cell repeat: succeeded requests in the window ≥ `min_requests`, window duration ≥
  `min_duration_s`, failed ÷ all requests in the window ≤ `max_failed_fraction`.

Per round (`round_problems`, from the store's `v_rounds`): every recorded round of a cell is validated
before anything aggregates it — no request in the window, truncated (fewer requests than the cell's
fullest round), every output one token long, acceptance length below 1.01 although drafts were verified
over enough drafting steps to call the drafter broken (`MIN_DRAFTING_STEPS_TO_JUDGE`, in the round or in all
of the cell's rounds together).
A cell with such a round is `invalid` in the gate (every rule) and in the run summary's speedups, never
averaged in; failed rounds are failed cells (above).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from harness.gate import data
from harness.gate.rules import Validity


@dataclass(frozen=True)
class ValidityReport:
    run_id: str
    reasons: tuple[str, ...]  # empty: valid

    @property
    def valid(self) -> bool:
        return not self.reasons


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def round_problems(conn: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, list[str]]:
    """cell id → `round r: why` for each invalid ok round (`v_rounds`; nothing where the view is absent,
    e.g. raw tables without the store's views)."""
    if not data.has_relation(conn, "v_rounds"):
        return {}
    rows = conn.execute(
        'SELECT cell_id, "repeat", problems FROM v_rounds WHERE run_id = $run_id AND problems IS NOT NULL '
        "AND status = 'ok' ORDER BY cell_id, \"repeat\"", {"run_id": run_id}).fetchall()
    out: dict[str, list[str]] = {}
    for cell_id, rep, problems in rows:
        out.setdefault(cell_id, []).append(f"round {rep}: {problems}")
    return out


def check_validity(conn: duckdb.DuckDBPyConnection, run_id: str, validity: Validity) -> ValidityReport:
    run = data.run_info(conn, run_id)
    cells = data.cells(conn, run_id)
    counts = data.request_counts(conn, run_id)
    reasons: list[str] = []
    if run.status != "finished":
        reasons.append(f"run status is {run.status!r}, not 'finished'")

    repeats = [(cell, rep) for cell in cells.values() for rep in cell.repeats]
    if not repeats:
        reasons.append("the run has no cells")
    failed = [(cell, rep) for cell, rep in repeats if rep.status != "ok"]
    if repeats and len(failed) / len(repeats) > validity.max_failed_fraction:
        reasons.append(
            f"{len(failed)}/{len(repeats)} cell runs failed ({_pct(len(failed) / len(repeats))}) "
            f"> max_failed_fraction {_pct(validity.max_failed_fraction)}"
        )

    for cell, rep in repeats:
        if rep.status != "ok":
            continue
        where = cell.label if len(cell.repeats) == 1 else f"{cell.label} (repeat {rep.repeat})"
        window_s = rep.window_s
        if window_s is None:
            reasons.append(f"{where}: no measurement window")
            continue
        if window_s < validity.min_duration_s:
            reasons.append(f"{where}: window {window_s:.3g} s < min_duration_s {validity.min_duration_s:g} s")
        n = counts.get((cell.cell_id, rep.repeat), data.RequestCounts(0, 0))
        if n.succeeded < validity.min_requests:
            reasons.append(
                f"{where}: {n.succeeded} succeeded requests in the window < min_requests {validity.min_requests}"
            )
        total = n.succeeded + n.failed
        if total and n.failed / total > validity.max_failed_fraction:
            reasons.append(
                f"{where}: {n.failed}/{total} requests failed ({_pct(n.failed / total)}) "
                f"> max_failed_fraction {_pct(validity.max_failed_fraction)}"
            )
    return ValidityReport(run_id, tuple(reasons))
