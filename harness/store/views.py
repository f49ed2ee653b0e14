"""The store's SQL views: stable names and columns to query results by, each mirroring harness.metrics.

Why views: the raw tables are shaped for writing (one row per step, per token), and every question a
user asks — "τ of this drafter across the last ten runs", "speedup per concurrency" — starts with the
same window rule and the same joins. The views write those once, with the conventions of
`harness.metrics` (step-weighted ratios, one division; an empty population gives NULL, never NaN or an
error), so `harness query` and the Python metrics give the same number. Their names and columns are a
public interface, listed here and in `VIEWS.md`: add columns at the end, never rename or drop one
without a migration (`migrations.py`) and a line in `VIEWS.md`.

    v_runs          one row per run: run_id, kind, label, status, suite_name, suite_path, suite_hash,
                    git_sha, git_branch, git_dirty, host_fingerprint, repeats, started_at, finished_at,
                    duration_s (NULL while running), cells_ok, cells_failed, benchmarks, metadata (JSON of
                    `harness run --metadata KEY=VALUE`, schema 3; NULL: none)
    v_cells         one row per (run, cell, repeat): every column of `cells` but `log` and the cost
                    columns, then duration_s, git_branch, git_sha, host_fingerprint, run_started_at,
                    run_kind, run_label, resources, gpu_seconds, cpu_seconds, round_slot, sts_offsets
                    (the level offsets of the drafter's calibration, schema 8; NULL: STS alone)
    v_metrics       one row per metric value: run_id, started_at (the run's), git_branch, git_sha,
                    cell_id, repeat, label, backend, target, drafter, method, num_drafts, task,
                    temperature, concurrency, rate, policy, metric, value, unit, n, comparability_key,
                    status (the cell's)
    v_ok_requests   the window's succeeded requests (the metrics' `ok`): every column of `requests`,
                    rows with error IS NULL AND window_start_s <= finish_s < window_end_s of their cell
    v_ok_steps      their verify steps (the metrics' `ok_steps`): every column of `request_steps`
    v_ok_engine_steps  engine steps with window_start_s <= t_s < window_end_s: every column of `engine_steps`
    v_acceptance    one row per (run, cell, repeat), every cell: run_id, cell_id, repeat, label, status,
                    requests, steps (all verify steps), drafts_verified, drafts_accepted, acceptance_length
                    (τ = 1 + accepted / drafting steps; schema 3, before: over all steps),
                    accepted_per_step, verified_per_step (per drafting step), draft_acceptance_rate,
                    wasted_verification_fraction, then (schema 3) drafting_steps (steps that verified
                    ≥ 1 draft), draft_coverage (drafting / all steps), tokens_per_target_forward
                    (Σ(accepted + 1) / all steps), both over requests with all_steps; budget_cut_tokens
    v_positions     one row per (run, cell, repeat, position k = 1 … γ), γ = max num_drafts of the ok
                    requests: run_id, cell_id, repeat, position, verified_k (steps with num_verified ≥ k),
                    accepted_k (steps with num_accepted ≥ k), reached_k (steps with num_accepted ≥ k − 1
                    and num_verified ≥ k), unconditional (α_k = accepted_k / verified_k), conditional
                    (β_k = accepted_k / reached_k)
    v_speedup       one row per (speculative cell, plain cell) pair of the same run and round with
                    equal backend, target, task (its whole spec: name, samples, max tokens, temperature),
                    concurrency, rate and seed, both cells ok: run_id, repeat, cell_id, label, backend,
                    target, drafter, method, num_drafts, task, temperature, concurrency, rate, policy,
                    seed, plain_cell_id, throughput, plain_throughput, speedup, user_speed_mean,
                    plain_user_speed_mean, speedup_user_speed, user_speed_p50, plain_user_speed_p50,
                    speedup_user_speed_p50, then (schema 7) plain_open_throughput (the plain pass
                    opening the round, repeat r), plain_close_throughput (the closing one, repeat R + r;
                    NULL: none ok), sandwich_drift (max ÷ min − 1 of the two), sandwiched (the plain cell
                    has closing passes in this run), sandwich_position (w: the speculative pass's midpoint
                    between the plain passes', 0 … 1). Each plain_* is the round's baseline at the
                    speculative pass's time, opening^(1 − w) · closing^w; the opening pass alone without
                    a closing one (before schema 7: always)
    v_rounds        one row per (run, cell, repeat = round): run_id, cell_id, repeat, label, method, status,
                    round_slot (position in the run's round, schema 3), requests (succeeded in the window),
                    max_output_tokens, acceptance_length, problems (NULL: a valid round; else why not:
                    failed, no request, truncated — fewer requests than the cell's fullest round —, every
                    output one token long, acceptance length < 1.01 with drafts verified); a plain cell's
                    closing passes are its rows with repeat ≥ the run's rounds
    v_speedup_summary  one row per (run, speculative cell, plain cell): run_id, cell_id, plain_cell_id,
                    label, rounds_planned, rounds (paired rounds, every pass valid), speedup (median of
                    per-round ratios, schema 7; before: geometric mean), ci_low, ci_high (the sign test's
                    order-statistic interval, ≥ 95%; NULL below 6 rounds; before schema 7: a t interval),
                    log_sd, plain_drift (max ÷ min − 1 of every plain pass over rounds), status (ok |
                    unstable: drift > 25%, or plain passes > 10% apart inside half the rounds | invalid: an
                    invalid or missing round or closing pass), then (schema 7) ci_coverage (the interval's
                    exact coverage), sandwich_drift (the largest move inside a round), unsteady_rounds —
                    harness.metrics.speedup
    v_calibration   one row per reliability bin: run_id, cell_id, repeat, label, drafter, task,
                    temperature, kind, position, bin, lower, upper, count, confidence_sum, outcome_sum,
                    mean_confidence (confidence_sum / count), accuracy (outcome_sum / count),
                    gap (mean_confidence − accuracy); bins are per draft position k ≥ 1 (position 0,
                    every position pooled, exists only in stores written before the one-ECE change)
    v_ece           the one ECE (harness.metrics.confidence), per cell repeat and kind, from the bins:
                    run_id, cell_id, repeat, kind, ece (Σ over positions ≥ 1 and bins of |confidence_sum −
                    outcome_sum|, ÷ Σ count), num_observed (Σ count): equals the metric ece_<kind>
    v_costs         one row per (run, cell), repeats summed: run_id, cell_id, label, backend, repeats,
                    failed, num_gpus, num_cpus (reserved, from `resources`), gpu_seconds, cpu_seconds
                    (Σ wall time × reserved GPUs / CPUs; NULL for cells recorded before schema 2),
                    run_gpu_seconds, run_cpu_seconds (the run's totals, on every row of the run)

Each view's SQL is the formula its `harness.metrics` twin writes in its docstring; the store's tests
check that they agree value for value.
"""

from __future__ import annotations

import duckdb

from harness.metrics.speedup import (
    CONFIDENCE,
    DRIFT_BOUND,
    MIN_ACCEPTANCE_LENGTH,
    MIN_DRAFTING_STEPS_TO_JUDGE,
    SANDWICH_BOUND,
    sign_coverage,
    sign_interval_index,
)

_CELL_KEY = "run_id, cell_id, repeat"
_COST_COLUMNS = "resources, gpu_seconds, cpu_seconds"  # schema 2: after the columns v_cells had before
_ROUND_COLUMNS = "round_slot"  # schema 3: after those
_CALIBRATION_COLUMNS = "sts_offsets"  # schema 8: after those
_SIGN_INDEX = [(n, sign_interval_index(n, CONFIDENCE)) for n in range(1, 501)]  # rounds → k of the sign interval

VIEWS: dict[str, str] = {
    "v_runs": """
        SELECT r.run_id, r.kind, r.label, r.status, r.suite_name, r.suite_path, r.suite_hash,
               r.git_sha, r.git_branch, r.git_dirty, r.host_fingerprint, r.repeats, r.started_at, r.finished_at,
               epoch(r.finished_at - r.started_at) AS duration_s,
               coalesce(c.cells_ok, 0) AS cells_ok, coalesce(c.cells_failed, 0) AS cells_failed,
               coalesce(b.benchmarks, 0) AS benchmarks, r.metadata
        FROM runs r
        LEFT JOIN (SELECT run_id, count_if(status = 'ok') AS cells_ok, count_if(status = 'failed') AS cells_failed
                   FROM cells GROUP BY run_id) c USING (run_id)
        LEFT JOIN (SELECT run_id, count(*) AS benchmarks FROM benchmarks GROUP BY run_id) b USING (run_id)
    """,
    "v_cells": f"""
        SELECT c.* EXCLUDE (log, {_COST_COLUMNS}, {_ROUND_COLUMNS}, {_CALIBRATION_COLUMNS}),
               epoch(c.finished_at - c.started_at) AS duration_s,
               r.git_branch, r.git_sha, r.host_fingerprint, r.started_at AS run_started_at,
               r.kind AS run_kind, r.label AS run_label, {_COST_COLUMNS}, {_ROUND_COLUMNS}, {_CALIBRATION_COLUMNS}
        FROM cells c JOIN runs r USING (run_id)
    """,
    "v_metrics": """
        SELECT m.run_id, r.started_at, r.git_branch, r.git_sha, m.cell_id, m.repeat,
               c.label, c.backend, c.target, c.drafter, c.method, c.num_drafts, c.task, c.temperature,
               c.concurrency, c.rate, c.policy, m.metric, m.value, m.unit, m.n,
               c.comparability_key, c.status
        FROM metrics m
        JOIN cells c USING (run_id, cell_id, repeat)
        JOIN runs r USING (run_id)
    """,
    "v_ok_requests": """
        SELECT q.*
        FROM requests q JOIN cells c USING (run_id, cell_id, repeat)
        WHERE q.error IS NULL AND q.finish_s >= c.window_start_s AND q.finish_s < c.window_end_s
    """,
    "v_ok_steps": """
        SELECT s.*
        FROM request_steps s JOIN v_ok_requests q USING (run_id, cell_id, repeat, request_id)
    """,
    "v_ok_engine_steps": """
        SELECT e.*
        FROM engine_steps e JOIN cells c USING (run_id, cell_id, repeat)
        WHERE e.t_s >= c.window_start_s AND e.t_s < c.window_end_s
    """,
    "v_acceptance": f"""
        WITH per_cell AS (
            SELECT s.run_id, s.cell_id, s.repeat, count(*) AS steps,
                   count_if(s.num_verified > 0) AS drafting_steps,
                   sum(s.num_verified) AS drafts_verified, sum(s.num_accepted) AS drafts_accepted,
                   count(*) FILTER (WHERE q.all_steps IS NOT FALSE) AS all_steps_steps,
                   count_if(s.num_verified > 0 AND q.all_steps IS NOT FALSE) AS all_steps_drafting,
                   sum(s.num_accepted + 1) FILTER (WHERE q.all_steps IS NOT FALSE) AS all_steps_emitted
            FROM v_ok_steps s JOIN v_ok_requests q USING ({_CELL_KEY}, request_id)
            GROUP BY s.run_id, s.cell_id, s.repeat
        ), ok_requests AS (
            SELECT {_CELL_KEY}, count(*) AS requests FROM v_ok_requests GROUP BY {_CELL_KEY}
        ), budget AS (
            SELECT q.run_id, q.cell_id, q.repeat, count(*) AS budget_requests,
                   sum(1 + e.emitted - q.output_tokens) AS budget_cut_tokens
            FROM v_ok_requests q
            JOIN (SELECT {_CELL_KEY}, request_id, sum(num_accepted + 1) AS emitted
                  FROM v_ok_steps GROUP BY {_CELL_KEY}, request_id) e USING ({_CELL_KEY}, request_id)
            WHERE q.finish_reason = 'length' AND q.all_steps IS NOT FALSE
            GROUP BY q.run_id, q.cell_id, q.repeat
        )
        SELECT c.run_id, c.cell_id, c.repeat, c.label, c.status,
               coalesce(q.requests, 0) AS requests,
               coalesce(p.steps, 0) AS steps,
               coalesce(p.drafts_verified, 0)::BIGINT AS drafts_verified,
               coalesce(p.drafts_accepted, 0)::BIGINT AS drafts_accepted,
               1 + p.drafts_accepted::DOUBLE / nullif(p.drafting_steps, 0) AS acceptance_length,
               p.drafts_accepted::DOUBLE / nullif(p.drafting_steps, 0) AS accepted_per_step,
               p.drafts_verified::DOUBLE / nullif(p.drafting_steps, 0) AS verified_per_step,
               p.drafts_accepted::DOUBLE / nullif(p.drafts_verified, 0) AS draft_acceptance_rate,
               (p.drafts_verified - p.drafts_accepted)::DOUBLE / nullif(p.drafts_verified, 0)
                   AS wasted_verification_fraction,
               coalesce(p.drafting_steps, 0) AS drafting_steps,
               p.all_steps_drafting::DOUBLE / nullif(p.all_steps_steps, 0) AS draft_coverage,
               p.all_steps_emitted::DOUBLE / nullif(p.all_steps_steps, 0) AS tokens_per_target_forward,
               b.budget_cut_tokens::BIGINT AS budget_cut_tokens
        FROM cells c
        LEFT JOIN per_cell p USING ({_CELL_KEY})
        LEFT JOIN ok_requests q USING ({_CELL_KEY})
        LEFT JOIN budget b USING ({_CELL_KEY})
    """,
    "v_positions": f"""
        WITH gammas AS (
            SELECT {_CELL_KEY}, max(num_drafts) AS gamma FROM v_ok_requests GROUP BY {_CELL_KEY}
        ), positions AS (
            SELECT {_CELL_KEY}, unnest(range(1, gamma + 1)) AS position FROM gammas
        ), counts AS (
            SELECT p.run_id, p.cell_id, p.repeat, p.position,
                   count_if(s.num_verified >= p.position) AS verified_k,
                   count_if(s.num_accepted >= p.position) AS accepted_k,
                   count_if(s.num_accepted >= p.position - 1 AND s.num_verified >= p.position) AS reached_k
            FROM positions p LEFT JOIN v_ok_steps s USING ({_CELL_KEY})
            GROUP BY p.run_id, p.cell_id, p.repeat, p.position
        )
        SELECT run_id, cell_id, repeat, position::INTEGER AS position, verified_k, accepted_k, reached_k,
               accepted_k::DOUBLE / nullif(verified_k, 0) AS unconditional,
               accepted_k::DOUBLE / nullif(reached_k, 0) AS conditional
        FROM counts
    """,
    "v_speedup": f"""
        WITH rates AS (
            SELECT {_CELL_KEY},
                   max(value) FILTER (WHERE metric = 'throughput') AS throughput,
                   max(value) FILTER (WHERE metric = 'user_speed_mean') AS user_speed_mean,
                   max(value) FILTER (WHERE metric = 'user_speed_p50') AS user_speed_p50
            FROM metrics WHERE metric IN ('throughput', 'user_speed_mean', 'user_speed_p50')
            GROUP BY {_CELL_KEY}
        ), ok_cells AS (
            SELECT c.*, r.throughput, r.user_speed_mean, r.user_speed_p50
            FROM cells c LEFT JOIN rates r USING ({_CELL_KEY})
            WHERE c.status = 'ok'
        ), sandwiched AS (  -- plain cells with a closing pass (repeat ≥ the run's rounds) in any round
            SELECT DISTINCT c.run_id, c.cell_id FROM cells c JOIN runs r USING (run_id) WHERE c.repeat >= r.repeats
        ), pairs AS (
            SELECT s.*, p.cell_id AS plain_cell_id,
                   p.throughput AS open_t, pc.throughput AS close_t,
                   p.user_speed_mean AS open_u, pc.user_speed_mean AS close_u,
                   p.user_speed_p50 AS open_u50, pc.user_speed_p50 AS close_u50,
                   sw.cell_id IS NOT NULL AS sandwiched,
                   (epoch(s.started_at) + epoch(s.finished_at)) / 2 AS spec_mid,
                   (epoch(p.started_at) + epoch(p.finished_at)) / 2 AS open_mid,
                   (epoch(pc.started_at) + epoch(pc.finished_at)) / 2 AS close_mid
            FROM ok_cells s
            JOIN ok_cells p
              ON p.run_id = s.run_id AND p.repeat = s.repeat AND p.method = 'none'
             AND p.backend = s.backend AND p.target = s.target AND p.task = s.task
             AND (p.params -> 'task')::VARCHAR = (s.params -> 'task')::VARCHAR
             AND p.temperature IS NOT DISTINCT FROM s.temperature
             AND p.concurrency IS NOT DISTINCT FROM s.concurrency
             AND p.rate IS NOT DISTINCT FROM s.rate
             AND p.seed IS NOT DISTINCT FROM s.seed
            JOIN runs r ON r.run_id = s.run_id
            LEFT JOIN ok_cells pc ON pc.run_id = s.run_id AND pc.cell_id = p.cell_id AND pc.repeat = s.repeat + r.repeats
            LEFT JOIN sandwiched sw ON sw.run_id = s.run_id AND sw.cell_id = p.cell_id
            WHERE s.method <> 'none'
        ), positioned AS (  -- w: the speculative pass's midpoint between the plain passes' (½ when they coincide)
            SELECT *, CASE WHEN close_mid IS NULL THEN NULL WHEN close_mid = open_mid THEN 0.5
                           ELSE least(1.0, greatest(0.0, (spec_mid - open_mid) / (close_mid - open_mid))) END AS w
            FROM pairs
        ), baselines AS (  -- a round's baseline: open^(1−w) · close^w, the opening pass without a closing one
            SELECT *,
                   CASE WHEN close_t > 0 AND open_t > 0 THEN exp((1 - w) * ln(open_t) + w * ln(close_t)) ELSE open_t END AS base_t,
                   CASE WHEN close_u > 0 AND open_u > 0 THEN exp((1 - w) * ln(open_u) + w * ln(close_u)) ELSE open_u END AS base_u,
                   CASE WHEN close_u50 > 0 AND open_u50 > 0 THEN exp((1 - w) * ln(open_u50) + w * ln(close_u50))
                        ELSE open_u50 END AS base_u50
            FROM positioned
        )
        SELECT run_id, repeat, cell_id, label, backend, target, drafter, method, num_drafts,
               task, temperature, concurrency, rate, policy, seed, plain_cell_id,
               throughput, base_t AS plain_throughput, throughput / nullif(base_t, 0) AS speedup,
               user_speed_mean, base_u AS plain_user_speed_mean, user_speed_mean / nullif(base_u, 0) AS speedup_user_speed,
               user_speed_p50, base_u50 AS plain_user_speed_p50,
               user_speed_p50 / nullif(base_u50, 0) AS speedup_user_speed_p50,
               open_t AS plain_open_throughput, close_t AS plain_close_throughput,
               CASE WHEN open_t > 0 AND close_t > 0 THEN greatest(open_t, close_t) / least(open_t, close_t) - 1 END
                   AS sandwich_drift,
               sandwiched, w AS sandwich_position
        FROM baselines
    """,
    "v_rounds": f"""
        WITH q AS (
            SELECT {_CELL_KEY}, count(*) AS requests, max(output_tokens) AS max_output_tokens
            FROM v_ok_requests GROUP BY {_CELL_KEY}
        ), checked AS (
            SELECT c.run_id, c.cell_id, c.repeat, c.label, c.method, c.status, c.round_slot,
                   coalesce(q.requests, 0) AS requests, q.max_output_tokens,
                   max(coalesce(q.requests, 0)) OVER (PARTITION BY c.run_id, c.cell_id) AS most_requests,
                   a.acceptance_length, a.drafts_verified, a.drafting_steps,
                   sum(a.drafting_steps) OVER (PARTITION BY c.run_id, c.cell_id) AS cell_drafting_steps,
                   sum(a.drafts_accepted) OVER (PARTITION BY c.run_id, c.cell_id) AS cell_drafts_accepted
            FROM cells c LEFT JOIN q USING ({_CELL_KEY}) LEFT JOIN v_acceptance a USING ({_CELL_KEY})
        )
        SELECT run_id, cell_id, repeat, label, method, status, round_slot, requests, max_output_tokens,
               acceptance_length,
               nullif(concat_ws('; ',
                   CASE WHEN status <> 'ok' THEN 'failed' END,
                   CASE WHEN status = 'ok' AND requests = 0 THEN 'no succeeded request in the window' END,
                   CASE WHEN status = 'ok' AND requests > 0 AND requests < most_requests
                        THEN 'truncated: ' || requests || ' of ' || most_requests || ' requests' END,
                   CASE WHEN status = 'ok' AND max_output_tokens <= 1 THEN 'every output is one token long' END,
                   CASE WHEN status = 'ok' AND method <> 'none' AND drafts_verified > 0
                         AND acceptance_length < {MIN_ACCEPTANCE_LENGTH}
                         AND drafting_steps >= {MIN_DRAFTING_STEPS_TO_JUDGE}
                        THEN 'acceptance length ' || round(acceptance_length, 3) || ' ≈ 1 with drafts verified ('
                             || drafting_steps || ' drafting steps)'
                        WHEN status = 'ok' AND method <> 'none' AND drafts_verified > 0
                         AND cell_drafting_steps >= {MIN_DRAFTING_STEPS_TO_JUDGE}
                         AND 1 + cell_drafts_accepted / cell_drafting_steps < {MIN_ACCEPTANCE_LENGTH}
                        THEN 'acceptance length ≈ 1 over every round (' || cell_drafting_steps
                             || ' drafting steps, ' || cell_drafts_accepted || ' accepted)' END
               ), '') AS problems
        FROM checked
    """,
    "v_speedup_summary": f"""
        WITH k_table(n, k, coverage) AS (VALUES {", ".join(f"({n}, {k}, {sign_coverage(n, k)!r})".replace("None", "NULL") for n, k in _SIGN_INDEX)}
        ), pairs AS (
            SELECT v.run_id, v.cell_id, v.plain_cell_id, v.label, v.repeat, v.speedup,
                   v.plain_open_throughput AS open_t, v.plain_close_throughput AS close_t, v.sandwich_drift,
                   rs.problems IS NULL AND rp.problems IS NULL AND rc.problems IS NULL AND v.speedup > 0
                     AND (NOT v.sandwiched OR v.plain_close_throughput IS NOT NULL) AS good
            FROM v_speedup v
            JOIN runs r ON r.run_id = v.run_id
            JOIN v_rounds rs ON rs.run_id = v.run_id AND rs.cell_id = v.cell_id AND rs.repeat = v.repeat
            JOIN v_rounds rp ON rp.run_id = v.run_id AND rp.cell_id = v.plain_cell_id AND rp.repeat = v.repeat
            LEFT JOIN v_rounds rc ON rc.run_id = v.run_id AND rc.cell_id = v.plain_cell_id
                                 AND rc.repeat = v.repeat + r.repeats
        ), summary AS (
            SELECT p.run_id, p.cell_id, p.plain_cell_id, any_value(p.label) AS label,
                   any_value(r.repeats) AS rounds_planned,
                   count(*) FILTER (WHERE p.good) AS rounds,
                   count(*) FILTER (WHERE NOT p.good) AS bad_rounds,
                   median(ln(p.speedup)) FILTER (WHERE p.good) AS log_median,
                   list_sort(list(p.speedup) FILTER (WHERE p.good)) AS sorted,
                   stddev_samp(ln(p.speedup)) FILTER (WHERE p.good) AS log_sd,
                   max(greatest(p.open_t, coalesce(p.close_t, p.open_t))) FILTER (WHERE p.good AND p.open_t > 0)
                     / min(least(p.open_t, coalesce(p.close_t, p.open_t))) FILTER (WHERE p.good AND p.open_t > 0)
                     - 1 AS plain_drift,
                   max(p.sandwich_drift) FILTER (WHERE p.good) AS sandwich_drift,
                   count(*) FILTER (WHERE p.good AND p.sandwich_drift > {SANDWICH_BOUND}) AS unsteady_rounds
            FROM pairs p JOIN runs r USING (run_id)
            GROUP BY p.run_id, p.cell_id, p.plain_cell_id
        )
        SELECT s.run_id, s.cell_id, s.plain_cell_id, s.label, s.rounds_planned, s.rounds,
               exp(s.log_median) AS speedup,
               CASE WHEN k.k >= 1 THEN list_extract(s.sorted, k.k) END AS ci_low,
               CASE WHEN k.k >= 1 THEN list_extract(s.sorted, s.rounds + 1 - k.k) END AS ci_high,
               s.log_sd, CASE WHEN s.rounds >= 2 THEN s.plain_drift END AS plain_drift,
               CASE WHEN s.bad_rounds > 0 OR s.rounds < coalesce(s.rounds_planned, 0) OR s.rounds = 0 THEN 'invalid'
                    WHEN s.rounds >= 2 AND s.plain_drift > {DRIFT_BOUND} THEN 'unstable'
                    WHEN s.unsteady_rounds > 0 AND 2 * s.unsteady_rounds >= s.rounds THEN 'unstable'
                    ELSE 'ok' END AS status,
               k.coverage AS ci_coverage, s.sandwich_drift, s.unsteady_rounds
        FROM summary s LEFT JOIN k_table k ON k.n = s.rounds
    """,
    "v_calibration": """
        SELECT b.run_id, b.cell_id, b.repeat, c.label, c.drafter, c.task, c.temperature,
               b.kind, b.position, b.bin, b.lower, b.upper, b.count, b.confidence_sum, b.outcome_sum,
               b.confidence_sum / nullif(b.count, 0) AS mean_confidence,
               b.outcome_sum / nullif(b.count, 0) AS accuracy,
               (b.confidence_sum - b.outcome_sum) / nullif(b.count, 0) AS gap
        FROM calibration_bins b JOIN cells c USING (run_id, cell_id, repeat)
    """,
    "v_ece": """
        SELECT run_id, cell_id, repeat, kind,
               sum(abs(confidence_sum - outcome_sum)) / nullif(sum(count), 0) AS ece,
               sum(count)::BIGINT AS num_observed
        FROM calibration_bins WHERE position >= 1
        GROUP BY run_id, cell_id, repeat, kind
    """,
    "v_costs": """
        SELECT c.run_id, c.cell_id, c.label, c.backend,
               count(*) AS repeats, count_if(c.status = 'failed') AS failed,
               (any_value(c.resources) -> 'num_gpus')::DOUBLE AS num_gpus,
               (any_value(c.resources) -> 'num_cpus')::DOUBLE AS num_cpus,
               sum(c.gpu_seconds) AS gpu_seconds, sum(c.cpu_seconds) AS cpu_seconds,
               sum(sum(c.gpu_seconds)) OVER (PARTITION BY c.run_id) AS run_gpu_seconds,
               sum(sum(c.cpu_seconds)) OVER (PARTITION BY c.run_id) AS run_cpu_seconds
        FROM cells c
        GROUP BY c.run_id, c.cell_id, c.label, c.backend
    """,
}


def create_views(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)create every view, in dependency order (a view may use the ones above it)."""
    for name, sql in VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
