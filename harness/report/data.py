"""What a report shows, read from the store's views in one place: `load_run(store, run_id) → RunData`.

Why aggregate in SQL: every number here is a sum over cells, then one division — the convention of
`harness.metrics` (step-weighted ratios, never means of ratios) — and the views already apply the
window rule, so pooling a drafter's cells (over loads, seeds and repeats) is a GROUP BY over the
views' raw counts. Rates and latencies (throughput, per-user speed, speedup), which have no counts to
pool, are averaged over repeats only; every other axis stays a line or a panel.

Only ok cells contribute to plots; failed cells appear in the header and the summary table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.report.history import HistoryRow, history
from harness.store import Store, StoreError

HISTORY_METRIC = "acceptance_length"

# The summary table: (metric name in v_metrics, column heading, factor for display)
SUMMARY_METRICS = (
    ("acceptance_length", "τ", 1.0),
    ("throughput", "throughput (tok/s)", 1.0),
    ("speedup", "speedup", 1.0),
    ("ece_raw", "ECE raw", 1.0),
    ("ece_calibrated", "ECE cal", 1.0),
    ("ttft_p50", "TTFT p50 (ms)", 1e3),
    ("tpot_p50", "TPOT p50 (ms)", 1e3),
)


@dataclass
class RunData:
    run: dict  # `runs` row (host, packages, argv decoded) + v_runs' duration_s, cells_ok, cells_failed
    cells: list[dict]  # v_cells rows of the run
    tau: list[dict]  # per (task, drafter, policy, temperature, num_drafts): pooled τ
    positions: list[dict]  # per (drafter, gamma = its largest γ, position): pooled α_k, β_k
    calibration: list[dict]  # per (drafter, kind, bin), position 0: pooled bin sums
    load: list[dict]  # per (task, drafter, method, num_drafts, policy, temperature, concurrency, rate)
    summary: list[dict]  # per (cell, repeat): label, repeat, status and SUMMARY_METRICS
    history: list[HistoryRow] = field(default_factory=list)  # HISTORY_METRIC of this run's speculative cells, same suite


def load_run(store: Store, run_id: str) -> RunData:
    """Everything the report of `run_id` plots; StoreError if the run is not in the store."""
    run = store.run(run_id)
    if run is None:
        raise StoreError(f"no run {run_id!r} in {store.path}")
    stats = _dicts(store, "SELECT duration_s, cells_ok, cells_failed FROM v_runs WHERE run_id = ?", [run_id])
    run.update(stats[0] if stats else {})
    cells = _dicts(store, "SELECT * FROM v_cells WHERE run_id = ? ORDER BY label, repeat", [run_id])
    data = RunData(
        run=run, cells=cells,
        tau=_dicts(store, TAU_SQL, [run_id]),
        positions=_dicts(store, POSITIONS_SQL, [run_id]),
        calibration=_dicts(store, CALIBRATION_SQL, [run_id]),
        load=_dicts(store, LOAD_SQL, [run_id, run_id]),
        summary=_dicts(store, SUMMARY_SQL, [run_id, run_id]),
    )
    # speculative cells only: plain decoding has τ = 1 by definition
    cell_ids = sorted({c["cell_id"] for c in cells if c["status"] == "ok" and c["method"] != "none"})
    if cell_ids and run.get("suite_name") is not None:
        data.history = history(store, HISTORY_METRIC, suite_name=run["suite_name"], cell_ids=cell_ids,
                               until=run["started_at"])
    return data


_OK_CELLS = "SELECT * FROM cells WHERE run_id = ? AND status = 'ok'"

# τ = (Σ accepted + Σ steps) / Σ steps over a line's cells: the acceptance_length of their pooled steps.
TAU_SQL = f"""
    SELECT c.task, c.drafter, c.policy, c.temperature, c.num_drafts,
           (sum(a.drafts_accepted) + sum(a.steps))::DOUBLE / nullif(sum(a.steps), 0) AS tau,
           sum(a.steps)::BIGINT AS steps
    FROM v_acceptance a JOIN ({_OK_CELLS}) c USING (run_id, cell_id, repeat)
    WHERE c.method <> 'none'
    GROUP BY ALL ORDER BY ALL
"""

# α_k = Σ accepted_k / Σ verified_k, β_k = Σ accepted_k / Σ reached_k over a drafter's cells at its largest γ.
POSITIONS_SQL = f"""
    WITH c AS ({_OK_CELLS}),
    top AS (SELECT drafter, max(num_drafts) AS gamma FROM c WHERE method <> 'none' GROUP BY drafter)
    SELECT c.drafter, top.gamma, p.position,
           sum(p.accepted_k)::DOUBLE / nullif(sum(p.verified_k), 0) AS unconditional,
           sum(p.accepted_k)::DOUBLE / nullif(sum(p.reached_k), 0) AS conditional,
           sum(p.verified_k)::BIGINT AS verified
    FROM v_positions p JOIN c USING (run_id, cell_id, repeat)
    JOIN top ON top.drafter = c.drafter AND c.num_drafts = top.gamma
    GROUP BY ALL ORDER BY ALL
"""

# Bins have the same edges in every cell, so pooled bin sums are the reliability diagram of the pooled cycles.
CALIBRATION_SQL = f"""
    SELECT c.drafter, b.kind, b.bin, min(b.lower) AS lower, max(b.upper) AS upper,
           sum(b.count)::BIGINT AS count, sum(b.confidence_sum) AS confidence_sum, sum(b.outcome_sum) AS outcome_sum
    FROM v_calibration b JOIN ({_OK_CELLS}) c USING (run_id, cell_id, repeat)
    WHERE b.position = 0
    GROUP BY ALL ORDER BY ALL
"""

# Rates: the mean over repeats of each (line, load) point; speedup from v_speedup (plain of the same run).
LOAD_SQL = f"""
    WITH m AS (
        SELECT task, drafter, method, num_drafts, policy, temperature, concurrency, rate,
               avg(value) FILTER (WHERE metric = 'throughput') AS throughput,
               avg(value) FILTER (WHERE metric = 'user_speed_p50') AS user_speed_p50
        FROM v_metrics WHERE run_id = ? AND status = 'ok' AND metric IN ('throughput', 'user_speed_p50')
        GROUP BY ALL
    ), s AS (
        SELECT task, drafter, method, num_drafts, policy, temperature, concurrency, rate, avg(speedup) AS speedup
        FROM v_speedup WHERE run_id = ? GROUP BY ALL
    )
    SELECT m.*, s.speedup
    FROM m LEFT JOIN s ON s.task = m.task AND s.drafter = m.drafter AND s.method = m.method
     AND s.num_drafts = m.num_drafts AND s.policy = m.policy
     AND s.temperature IS NOT DISTINCT FROM m.temperature
     AND s.concurrency IS NOT DISTINCT FROM m.concurrency AND s.rate IS NOT DISTINCT FROM m.rate
    ORDER BY m.task, m.method = 'none' DESC, m.drafter, m.num_drafts, m.policy, m.temperature, m.concurrency, m.rate
"""

_PIVOT = ",\n".join(
    f"max(m.value) FILTER (WHERE m.metric = '{name}') AS {name}" for name, _, _ in SUMMARY_METRICS if name != "speedup"
)

# Speedup: v_speedup's pair within the run (its mean if several plain cells match), else a stored 'speedup'.
SUMMARY_SQL = f"""
    WITH s AS (SELECT cell_id, repeat, avg(speedup) AS speedup FROM v_speedup WHERE run_id = ? GROUP BY ALL)
    SELECT c.cell_id, c.label, c.repeat, c.status, c.error,
           {_PIVOT},
           coalesce(any_value(s.speedup), max(m.value) FILTER (WHERE m.metric = 'speedup')) AS speedup
    FROM cells c
    LEFT JOIN metrics m USING (run_id, cell_id, repeat)
    LEFT JOIN s USING (cell_id, repeat)
    WHERE c.run_id = ?
    GROUP BY c.cell_id, c.label, c.repeat, c.status, c.error
    ORDER BY c.label, c.repeat
"""


def _dicts(store: Store, sql: str, params: list[Any]) -> list[dict]:
    columns, rows = store.query(sql, params)
    return [dict(zip(columns, row)) for row in rows]
