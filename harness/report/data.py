"""What a report shows, read from the store's views in one place: `load_run(store, run_id) → RunData`.

Why aggregate in SQL: every number here is a sum over cells, then one division — the convention of
`harness.metrics` (step-weighted ratios, never means of ratios) — and the views already apply the
window rule, so pooling a drafter's cells (over loads, seeds and repeats) is a GROUP BY over the
views' raw counts. Rates (throughput, per-user speed, speedup), which have no counts to pool, are
averaged over the seeds and repeats of a point; every other axis (backend, target, task, drafter, γ,
policy, temperature, load) stays a line, a panel or an x value.

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
    ("acceptance_length", "τ (tokens/step)", 1.0),
    ("throughput", "throughput (tok/s)", 1.0),
    ("speedup", "speedup (×)", 1.0),
    ("ece_raw", "ECE raw", 1.0),
    ("ece_calibrated", "ECE cal", 1.0),
    ("ttft_p50", "TTFT p50 (ms)", 1e3),
    ("tpot_p50", "TPOT p50 (ms)", 1e3),
)


@dataclass
class RunData:
    run: dict  # `runs` row (host, packages, argv decoded) + v_runs' duration_s, cells_ok, cells_failed
    cells: list[dict]  # v_cells rows of the run
    tau: list[dict]  # per (backend, target, task, drafter, method, γ, policy, temperature): pooled τ, and
    #                  tau_lo / tau_hi: the smallest and largest τ of one repeat (pooled the same way)
    positions: list[dict]  # per (backend, target, drafter, policy, gamma = its largest γ, position): α_k, β_k,
    #                        each with its 95% interval over conversations (alpha_lo/hi, beta_lo/hi)
    calibration: list[dict]  # per (backend, target, drafter, kind, position ≥ 1, bin): bin sums over cells
    load: list[dict]  # per (backend, target, task, drafter, method, γ, policy, temperature, concurrency, rate):
    #                   mean, min and max over repeats (<metric>, <metric>_lo, <metric>_hi) of LOAD_METRICS
    summary: list[dict]  # per (cell, repeat): label, repeat, status, axes, SUMMARY_METRICS, user_speed_p50
    # HISTORY_METRIC of this run's speculative cells over the runs of its suite up to it
    history: list[HistoryRow] = field(default_factory=list)
    sla: dict = field(default_factory=dict)  # the run's suite `sla:` ({ttft_s, tpot_s}), empty when none


def load_run(store: Store, run_id: str) -> RunData:
    """Everything the report of `run_id` plots; StoreError if the run is not in the store."""
    run = store.run(run_id)
    if run is None:
        raise StoreError(f"no run {run_id!r} in {store.path}")
    key = {"run_id": run_id}
    stats = _dicts(store, "SELECT duration_s, cells_ok, cells_failed FROM v_runs WHERE run_id = $run_id", key)
    run.update(stats[0] if stats else {})
    cells = _dicts(store, "SELECT * FROM v_cells WHERE run_id = $run_id ORDER BY label, repeat", key)
    data = RunData(
        run=run, cells=cells,
        tau=_dicts(store, TAU_SQL, key),
        positions=_with_intervals(store, run_id, _dicts(store, POSITIONS_SQL, key), cells),
        calibration=_dicts(store, CALIBRATION_SQL, key),
        load=_dicts(store, LOAD_SQL, key),
        summary=_dicts(store, SUMMARY_SQL, key),
    )
    # speculative cells only: plain decoding has τ = 1 by definition
    cell_ids = sorted({c["cell_id"] for c in cells if c["status"] == "ok" and c["method"] != "none"})
    if cell_ids and run.get("suite_name") is not None:
        data.history = history(store, HISTORY_METRIC, suite_name=run["suite_name"], cell_ids=cell_ids,
                               until=run["started_at"])
    data.sla = suite_sla(run.get("suite_text"))
    return data


def suite_sla(suite_text: str | None) -> dict:
    """The `sla:` section of a run's stored suite text ({} when none or unreadable)."""
    import yaml

    try:
        doc = yaml.safe_load(suite_text or "") or {}
    except yaml.YAMLError:
        return {}
    sla = doc.get("sla") if isinstance(doc, dict) else None
    return {k: float(v) for k, v in sla.items() if isinstance(v, (int, float))} if isinstance(sla, dict) else {}


# Every query binds $run_id; the views are filtered on it too, so DuckDB reads one run's rows, not the history's.
_OK_CELLS = "SELECT * FROM cells WHERE run_id = $run_id AND status = 'ok'"
_LINE = "c.backend, c.target, c.task, c.drafter, c.method, c.num_drafts, c.policy, c.temperature"

# τ = (Σ accepted + Σ steps) / Σ steps over a point's cells: the acceptance_length of their pooled steps.
TAU_SQL = f"""
    WITH per_repeat AS (
        SELECT {_LINE}, c.repeat, sum(a.drafts_accepted) AS accepted, sum(a.steps) AS steps
        FROM v_acceptance a JOIN ({_OK_CELLS}) c USING (run_id, cell_id, repeat)
        WHERE a.run_id = $run_id AND c.method <> 'none'
        GROUP BY ALL
    )
    SELECT backend, target, task, drafter, method, num_drafts, policy, temperature,
           (sum(accepted) + sum(steps))::DOUBLE / nullif(sum(steps), 0) AS tau,
           min((accepted + steps)::DOUBLE / nullif(steps, 0)) AS tau_lo,
           max((accepted + steps)::DOUBLE / nullif(steps, 0)) AS tau_hi,
           sum(steps)::BIGINT AS steps, count(*) AS repeats
    FROM per_repeat GROUP BY ALL ORDER BY ALL
"""

# α_k = Σ accepted_k / Σ verified_k, β_k = Σ accepted_k / Σ reached_k over a drafter's cells at its largest γ.
POSITIONS_SQL = f"""
    WITH c AS ({_OK_CELLS}),
    top AS (SELECT backend, target, drafter, policy, max(num_drafts) AS gamma FROM c WHERE method <> 'none'
            GROUP BY ALL)
    SELECT c.backend, c.target, c.drafter, c.policy, top.gamma, p.position,
           sum(p.accepted_k)::DOUBLE / nullif(sum(p.verified_k), 0) AS unconditional,
           sum(p.accepted_k)::DOUBLE / nullif(sum(p.reached_k), 0) AS conditional,
           sum(p.verified_k)::BIGINT AS verified, sum(p.accepted_k)::BIGINT AS accepted,
           sum(p.reached_k)::BIGINT AS reached
    FROM v_positions p JOIN c USING (run_id, cell_id, repeat)
    JOIN top ON top.backend = c.backend AND top.target = c.target AND top.drafter = c.drafter
     AND top.policy = c.policy AND c.num_drafts = top.gamma
    WHERE p.run_id = $run_id
    GROUP BY ALL ORDER BY ALL
"""

def _with_intervals(store: Store, run_id: str, rows: list[dict], cells: list[dict]) -> list[dict]:
    """Each α_k / β_k row with the model card's interval (`stats.clustered_wilson`): the row's cells' steps counted
    per conversation, rounds that replay one another once (`gate_data.replayed_rounds`), so a looping answer or a
    replayed round does not pass for independent trials. `cells`: the run's v_cells rows."""
    from harness.gate import data as gate_data
    from harness.gate.stats import clustered_wilson

    counts = gate_data.conversation_positions(store.con, run_id)
    replays = gate_data.replayed_rounds(store.con, run_id)
    members: dict[tuple, list[gate_data.ConversationPositions]] = {}
    for cell_id, key in {c["cell_id"]: (c["backend"], c["target"], c["drafter"], c["policy"], c["num_drafts"])
                         for c in cells if c["status"] == "ok" and c["cell_id"] in counts}.items():
        members.setdefault(key, []).append(gate_data.one_round(counts[cell_id], replays.get(cell_id)))
    for row in rows:
        k = int(row["position"])
        parts = members.get((row["backend"], row["target"], row["drafter"], row["policy"], row["gamma"]), [])
        accepted = _per_conversation(parts, "accepted", k)
        for prefix, trials in (("alpha", _per_conversation(parts, "verified", k)),
                               ("beta", _per_conversation(parts, "reached", k))):
            row[f"{prefix}_lo"], row[f"{prefix}_hi"] = (clustered_wilson(accepted, trials) if trials.sum() > 0
                                                        else (None, None))
    return rows


def _per_conversation(parts: list, name: str, k: int):
    """Position k's `name` counts of every conversation of the cells in `parts`; zero where a cell verified fewer
    than k drafts."""
    import numpy as np

    columns = [getattr(c, name)[:, k - 1] if getattr(c, name).shape[1] >= k else np.zeros(len(c.units)) for c in parts]
    return np.concatenate(columns) if columns else np.zeros(0)


# Bins have the same edges in every cell, so bin sums over a drafter's cells are the reliability diagram
# of its pooled cycles, per draft position (the one ECE bins each position on its own; position 0, pooled
# positions in stores written before that definition, is another statistic and is left out).
CALIBRATION_SQL = f"""
    SELECT c.backend, c.target, c.drafter, b.kind, b.position, b.bin, min(b.lower) AS lower,
           max(b.upper) AS upper, sum(b.count)::BIGINT AS count, sum(b.confidence_sum) AS confidence_sum,
           sum(b.outcome_sum) AS outcome_sum
    FROM calibration_bins b JOIN ({_OK_CELLS}) c USING (run_id, cell_id, repeat)
    WHERE b.run_id = $run_id AND b.position >= 1
    GROUP BY ALL ORDER BY ALL
"""

_PIVOT = ",\n".join(
    f"max(m.value) FILTER (WHERE m.metric = '{name}') AS {name}"
    for name in [name for name, _, _ in SUMMARY_METRICS if name != "speedup"] + ["user_speed_p50"]
)

# One row per (cell, repeat) of the run: its axes, the metrics above, and its speedup — v_speedup's pair
# in the run (the mean if several plain cells match), else a stored 'speedup' metric.
PER_CELL_SQL = f"""
    WITH s AS (SELECT cell_id, repeat, avg(speedup) AS speedup FROM v_speedup WHERE run_id = $run_id GROUP BY ALL)
    SELECT c.cell_id, c.label, c.repeat, c.status, {_LINE}, c.concurrency, c.rate,
           {_PIVOT},
           coalesce(any_value(s.speedup), max(m.value) FILTER (WHERE m.metric = 'speedup')) AS speedup
    FROM cells c
    LEFT JOIN metrics m USING (run_id, cell_id, repeat)
    LEFT JOIN s USING (cell_id, repeat)
    WHERE c.run_id = $run_id
    GROUP BY ALL
"""

SUMMARY_SQL = f"SELECT * FROM ({PER_CELL_SQL}) ORDER BY label, repeat"

# Rates have no counts to pool: each (line, load) point is the mean over its cells' seeds and repeats,
# with the smallest and largest repeat as its interval.
LOAD_METRICS = ("throughput", "user_speed_p50", "speedup", "ttft_p50", "tpot_p50")
_LOAD_AGGREGATES = ",\n".join(f"avg({m}) AS {m}, min({m}) AS {m}_lo, max({m}) AS {m}_hi" for m in LOAD_METRICS)
LOAD_SQL = f"""
    SELECT backend, target, task, drafter, method, num_drafts, policy, temperature, concurrency, rate,
           {_LOAD_AGGREGATES}, count(*) AS repeats
    FROM ({PER_CELL_SQL}) WHERE status = 'ok'
    GROUP BY backend, target, task, drafter, method, num_drafts, policy, temperature, concurrency, rate
    ORDER BY backend, target, task, method = 'none' DESC, drafter, num_drafts, policy, temperature, concurrency, rate
"""


def _dicts(store: Store, sql: str, params: dict[str, Any]) -> list[dict]:
    columns, rows = store.query(sql, params)
    return [dict(zip(columns, row)) for row in rows]
