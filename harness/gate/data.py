"""What the gate reads from a store: one DuckDB connection and a run id in, plain Python and numpy out.

Only this module knows SQL, so the gate runs against any connection holding the store's tables — the
project store, or an exported baseline loaded into an in-memory database — and candidate and baseline
may come from different connections. Per-cell rows are keyed `(run_id, cell_id, repeat)`.

The window rule (harness.metrics.window) is applied here, once: a request counts iff it finished in its
cell's window, `finish_s >= window_start_s AND finish_s < window_end_s`; succeeded requests
(`error IS NULL`) feed every metric, failed ones only the failure counts. Only cell repeats with
`status = 'ok'` contribute data; failed repeats are reported, never measured.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeVar

import duckdb
import numpy as np

# Requests of the window that succeeded, of ok cell repeats: the population of every metric.
_OK_REQUESTS = """
    SELECT r.cell_id, r."repeat", r.request_id, r.prompt_key, r.sample_index
    FROM requests r
    JOIN cells c ON c.run_id = r.run_id AND c.cell_id = r.cell_id AND c."repeat" = r."repeat"
    WHERE r.run_id = $run_id AND c.status = 'ok' AND r.error IS NULL
      AND r.finish_s >= c.window_start_s AND r.finish_s < c.window_end_s
"""


def _json(value: Any) -> Any:
    """JSON columns come back as text (DuckDB's JSON type) or already parsed; None stays None."""
    if value is None or not isinstance(value, str):
        return value
    return json.loads(value)


# ----------------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    status: str  # running | finished | interrupted | failed
    kind: str | None
    label: str | None
    suite_name: str | None
    git_sha: str | None
    host_fingerprint: str | None
    host: dict
    packages: dict[str, str]  # package name → version


def _packages(value: Any) -> dict[str, str]:
    """`{name: version}` from the stored JSON, which may also be a list of "name==version" strings."""
    value = _json(value)
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    out: dict[str, str] = {}
    for item in value or ():
        name, _, version = str(item).partition("==")
        out[name] = version
    return out


def run_info(conn: duckdb.DuckDBPyConnection, run_id: str) -> RunInfo:
    row = conn.execute(
        "SELECT run_id, status, kind, label, suite_name, git_sha, host_fingerprint, host, packages "
        "FROM runs WHERE run_id = $run_id",
        {"run_id": run_id},
    ).fetchone()
    if row is None:
        raise LookupError(f"no run {run_id!r} in this store")
    return RunInfo(
        run_id=row[0], status=row[1], kind=row[2], label=row[3], suite_name=row[4], git_sha=row[5],
        host_fingerprint=row[6], host=_json(row[7]) or {}, packages=_packages(row[8]),
    )


# ---------------------------------------------------------------------------------------------- cells

AXES = ("backend", "target", "drafter", "method", "num_drafts", "task", "temperature", "concurrency", "rate",
        "policy", "seed")


@dataclass(frozen=True)
class CellRepeat:
    repeat: int
    status: str  # ok | failed
    error: str | None
    window_start_s: float | None
    window_end_s: float | None
    sts_temperatures: tuple[float, ...] | None  # [γ] STS T_j of the drafter; None without a confidence head
    sts_offsets: tuple[float, ...] | None = None  # [γ] level offsets b_j fitted with them; None: STS alone

    @property
    def window_s(self) -> float | None:
        if self.window_start_s is None or self.window_end_s is None:
            return None
        return self.window_end_s - self.window_start_s


@dataclass(frozen=True)
class CellInfo:
    """One cell of a run, its repeats gathered. Identity, key, provenance and params are taken from its
    first ok repeat (the first repeat if none is ok): repeats of one cell share them by construction."""

    cell_id: str
    label: str
    axes: dict[str, Any]
    comparability_key: str | None
    provenance: dict[str, Any]
    params: dict[str, Any]
    repeats: tuple[CellRepeat, ...]  # by repeat number

    @property
    def ok_repeats(self) -> tuple[CellRepeat, ...]:
        return tuple(r for r in self.repeats if r.status == "ok")

    @property
    def failed_repeats(self) -> tuple[CellRepeat, ...]:
        return tuple(r for r in self.repeats if r.status != "ok")

    @property
    def is_plain(self) -> bool:
        return self.axes.get("method") == "none"


def cells(conn: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, CellInfo]:
    """Cells of a run by cell id, in the order of their labels."""
    columns = ("cell_id", "repeat", "label", *AXES, "params", "comparability_key", "provenance", "status",
               "error", "window_start_s", "window_end_s", "sts_temperatures", "sts_offsets")
    quoted = ", ".join(f'"{c}"' for c in columns)
    rows = conn.execute(
        f'SELECT {quoted} FROM cells WHERE run_id = $run_id ORDER BY label, cell_id, "repeat"', {"run_id": run_id}
    ).fetchall()
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        rec = dict(zip(columns, row))
        grouped.setdefault(rec["cell_id"], []).append(rec)
    out: dict[str, CellInfo] = {}
    for cell_id, recs in grouped.items():
        first = next((r for r in recs if r["status"] == "ok"), recs[0])
        temps = [_json(r["sts_temperatures"]) for r in recs]
        levels = [_json(r["sts_offsets"]) for r in recs]
        out[cell_id] = CellInfo(
            cell_id=cell_id,
            label=first["label"] or cell_id,
            axes={a: first[a] for a in AXES},
            comparability_key=first["comparability_key"],
            provenance=_json(first["provenance"]) or {},
            params=_json(first["params"]) or {},
            repeats=tuple(
                CellRepeat(
                    repeat=int(r["repeat"]), status=r["status"], error=r["error"],
                    window_start_s=r["window_start_s"], window_end_s=r["window_end_s"],
                    sts_temperatures=None if t is None else tuple(float(x) for x in t),
                    sts_offsets=None if b is None else tuple(float(x) for x in b),
                )
                for r, t, b in zip(recs, temps, levels)
            ),
        )
    return out


@dataclass(frozen=True)
class RequestCounts:
    succeeded: int  # error IS NULL, finished in the window
    failed: int  # error set, failed in the window (the failure time places it, as for the failed-request rate)


def request_counts(conn: duckdb.DuckDBPyConnection, run_id: str) -> dict[tuple[str, int], RequestCounts]:
    """Per (cell_id, repeat) of every cell row, requests in that repeat's window; zeros where none."""
    rows = conn.execute(
        """
        SELECT c.cell_id, c."repeat",
               count(r.request_id) FILTER (WHERE r.error IS NULL),
               count(r.request_id) FILTER (WHERE r.error IS NOT NULL)
        FROM cells c
        LEFT JOIN requests r ON r.run_id = c.run_id AND r.cell_id = c.cell_id AND r."repeat" = c."repeat"
             AND r.finish_s >= c.window_start_s AND r.finish_s < c.window_end_s
        WHERE c.run_id = $run_id
        GROUP BY c.cell_id, c."repeat"
        """,
        {"run_id": run_id},
    ).fetchall()
    return {(cell_id, int(rep)): RequestCounts(int(ok), int(failed)) for cell_id, rep, ok, failed in rows}


# ----------------------------------------------------------------------------------------- per prompt


@dataclass(frozen=True)
class PromptSteps:
    """Verify-step sums per prompt of one cell, pooled over its ok repeats (sums, so τ stays a ratio of sums).

    `units[i]` is the conversation prompt i belongs to (its sample index): turns of one conversation share
    a context and are resampled together by the bootstrap.
    """

    prompt_keys: tuple[str, ...]  # sorted
    units: tuple[str, ...]  # [prompts]
    steps: np.ndarray  # [prompts] float64: drafting steps (verified ≥ 1 draft; harness.metrics.acceptance)
    verified: np.ndarray  # [prompts] float64: Σ num_verified
    accepted: np.ndarray  # [prompts] float64: Σ num_accepted


def _unit(prompt_key: str, sample_index: Any) -> str:
    return prompt_key if sample_index is None else str(int(sample_index))


def prompt_steps(conn: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, PromptSteps]:
    """Per cell id, the step sums of each prompt over the window's succeeded requests."""
    rows = conn.execute(
        f"""
        WITH ok AS ({_OK_REQUESTS})
        SELECT ok.cell_id, ok.prompt_key, min(ok.sample_index), count_if(s.num_verified > 0),
               sum(s.num_verified)::DOUBLE, sum(s.num_accepted)::DOUBLE
        FROM request_steps s
        JOIN ok ON s.cell_id = ok.cell_id AND s."repeat" = ok."repeat" AND s.request_id = ok.request_id
        WHERE s.run_id = $run_id
        GROUP BY ok.cell_id, ok.prompt_key
        ORDER BY ok.cell_id, ok.prompt_key
        """,
        {"run_id": run_id},
    ).fetchall()
    grouped: dict[str, list[tuple]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row[1:])
    return {
        cell_id: PromptSteps(
            prompt_keys=tuple(r[0] for r in recs),
            units=tuple(_unit(r[0], r[1]) for r in recs),
            steps=np.array([r[2] for r in recs], dtype=np.float64),
            verified=np.array([r[3] for r in recs], dtype=np.float64),
            accepted=np.array([r[4] for r in recs], dtype=np.float64),
        )
        for cell_id, recs in grouped.items()
    }


@dataclass(frozen=True)
class Replay:
    """A cell whose ok rounds all took the very same verify steps on every prompt: `rounds` copies of round `first`."""

    rounds: int
    first: int


def replayed_rounds(conn: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Replay]:
    """Per cell id whose ok rounds replay one another, the count of copies and the first round.

    Rounds send the same prompts so that their timings pair, and greedy decoding ignores the round's sampling
    seeds (`Cell.request_seed`): an engine that is deterministic then decodes the same conversations again, step
    for step (so did every round of a sampled cell in runs before rounds drew their own seeds). Sums over rounds
    stay the same ratios (τ, α_k, ECE), but counts over them do not: n identical rounds are n copies of one
    sample, not n samples, and a count, a binomial interval or an ECE floor that took them for independent would
    be √n too sure. Compared on each prompt's sequence of (verified, accepted) per step, over the window's
    succeeded requests."""
    rows = conn.execute(
        f"""
        WITH ok AS ({_OK_REQUESTS}),
        walks AS (
            SELECT ok.cell_id, ok."repeat", ok.prompt_key,
                   md5(string_agg(s.num_verified || ':' || s.num_accepted, ',' ORDER BY s.step)) AS walk
            FROM request_steps s
            JOIN ok ON s.cell_id = ok.cell_id AND s."repeat" = ok."repeat" AND s.request_id = ok.request_id
            WHERE s.run_id = $run_id
            GROUP BY ok.cell_id, ok."repeat", ok.request_id, ok.prompt_key
        ),
        rounds AS (
            SELECT cell_id, "repeat", string_agg(prompt_key || '=' || walk, ';' ORDER BY prompt_key, walk) AS all_walks
            FROM walks GROUP BY cell_id, "repeat"
        )
        SELECT cell_id, count(*), min("repeat"), count(DISTINCT all_walks) FROM rounds GROUP BY cell_id
        """,
        {"run_id": run_id},
    ).fetchall()
    return {cell_id: Replay(int(n), int(first)) for cell_id, n, first, distinct in rows if n > 1 and distinct == 1}


@dataclass(frozen=True)
class ConversationPositions:
    """Per-position acceptance counts of one cell by conversation, pooled over its ok repeats in the window: the
    counts of `v_positions` (verified_k: steps with num_verified ≥ k; accepted_k: num_accepted ≥ k; reached_k:
    num_accepted ≥ k − 1 and num_verified ≥ k) kept apart per conversation, because a conversation's steps are not
    independent trials (an answer that loops accepts every draft of every step), which an interval over the
    pooled counts would take them for."""

    units: tuple[str, ...]  # sorted conversations
    verified: np.ndarray  # [conversations, γ] float64
    accepted: np.ndarray  # [conversations, γ] float64
    reached: np.ndarray  # [conversations, γ] float64


def conversation_positions(conn: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, ConversationPositions]:
    """Per cell id with drafting steps, its per-position counts by conversation (γ: the longest verified)."""
    rows = conn.execute(
        f"""
        WITH ok AS ({_OK_REQUESTS})
        SELECT ok.cell_id, ok.prompt_key, ok.sample_index, s.num_verified, s.num_accepted, count(*)
        FROM request_steps s
        JOIN ok ON s.cell_id = ok.cell_id AND s."repeat" = ok."repeat" AND s.request_id = ok.request_id
        WHERE s.run_id = $run_id AND s.num_verified > 0
        GROUP BY ALL
        """,
        {"run_id": run_id},
    ).fetchall()
    grouped: dict[str, list[tuple]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row[1:])
    out = {}
    for cell_id, recs in grouped.items():
        units = tuple(sorted({_unit(r[0], r[1]) for r in recs}))
        index = {u: i for i, u in enumerate(units)}
        gamma = max(int(r[2]) for r in recs)
        k = np.arange(1, gamma + 1)
        verified, accepted, reached = (np.zeros((len(units), gamma)) for _ in range(3))
        for key, sample, num_verified, num_accepted, count in recs:
            i = index[_unit(key, sample)]
            verified[i] += count * (num_verified >= k)
            accepted[i] += count * (num_accepted >= k)
            reached[i] += count * ((num_accepted >= k - 1) & (num_verified >= k))
        out[cell_id] = ConversationPositions(units, verified, accepted, reached)
    return out


_Counts = TypeVar("_Counts", PromptSteps, ConversationPositions)


def one_round(counts: _Counts, replay: Replay | None) -> _Counts:
    """A cell's sums over its rounds as one round's when the rounds replay one another (`replayed_rounds`): the same
    ratios, and counts of distinct steps, so that a count or a binomial interval does not take copies for samples."""
    if replay is None:
        return counts
    scaled = {f.name: getattr(counts, f.name) / replay.rounds for f in dataclasses.fields(counts)
              if isinstance(getattr(counts, f.name), np.ndarray)}
    return dataclasses.replace(counts, **scaled)


@dataclass(frozen=True)
class ConfidenceCycles:
    """Verify steps that carry confidence logits, of one cell's ok repeats in the window.

    Layout of `dspark_core.calibration` (one row per cycle), plus the prompt and repeat of each cycle:
    logits of positions never stored are NaN (never observed by the ECE).
    """

    prompt_keys: tuple[str, ...]  # sorted distinct prompts
    units: tuple[str, ...]  # [prompts] conversation of each prompt
    prompt_index: np.ndarray  # [cycles] int64 into prompt_keys
    repeat: np.ndarray  # [cycles] int64
    logits: np.ndarray  # [cycles, γ] float64, γ = the largest stored position
    num_verified: np.ndarray  # [cycles] int64
    num_accepted: np.ndarray  # [cycles] int64

    def of_round(self, repeat: int) -> ConfidenceCycles:
        """Round `repeat`'s cycles alone, its prompts renumbered (`replayed_rounds`: one round of copies)."""
        keep = self.repeat == repeat
        used = np.unique(self.prompt_index[keep])
        renumber = np.full(len(self.prompt_keys), -1)
        renumber[used] = np.arange(len(used))
        return ConfidenceCycles(
            prompt_keys=tuple(self.prompt_keys[i] for i in used), units=tuple(self.units[i] for i in used),
            prompt_index=renumber[self.prompt_index[keep]], repeat=self.repeat[keep], logits=self.logits[keep],
            num_verified=self.num_verified[keep], num_accepted=self.num_accepted[keep])


def confidence_cycles(conn: duckdb.DuckDBPyConnection, run_id: str, cell_id: str) -> ConfidenceCycles | None:
    """None when the cell stored no confidences (drafters without a confidence head, plain decoding)."""
    res = conn.execute(
        f"""
        WITH ok AS ({_OK_REQUESTS} AND r.cell_id = $cell_id)
        SELECT dense_rank() OVER (ORDER BY s."repeat", s.request_id, s.step) - 1 AS cycle,
               s."repeat"::BIGINT AS rep, ok.prompt_key, ok.sample_index,
               s.num_verified::BIGINT AS v, s.num_accepted::BIGINT AS a,
               sc.position::BIGINT AS position, sc.logit::DOUBLE AS logit
        FROM step_confidences sc
        JOIN request_steps s ON s.run_id = sc.run_id AND s.cell_id = sc.cell_id AND s."repeat" = sc."repeat"
             AND s.request_id = sc.request_id AND s.step = sc.step
        JOIN ok ON s.cell_id = ok.cell_id AND s."repeat" = ok."repeat" AND s.request_id = ok.request_id
        WHERE sc.run_id = $run_id AND sc.cell_id = $cell_id AND sc.position >= 1
        ORDER BY cycle, position
        """,
        {"run_id": run_id, "cell_id": cell_id},
    ).fetchall()
    if not res:
        return None
    cycle = np.array([r[0] for r in res], dtype=np.int64)
    position = np.array([r[6] for r in res], dtype=np.int64)
    num_cycles, gamma = int(cycle.max()) + 1, int(position.max())
    logits = np.full((num_cycles, gamma), np.nan)
    logits[cycle, position - 1] = np.array([np.nan if r[7] is None else r[7] for r in res], dtype=np.float64)
    _, first = np.unique(cycle, return_index=True)  # first row of each cycle, cycles in order
    keys = [res[i][2] for i in first]
    prompt_keys = tuple(sorted(set(keys)))
    unit_of = {res[i][2]: _unit(res[i][2], res[i][3]) for i in first}
    index = {k: i for i, k in enumerate(prompt_keys)}
    return ConfidenceCycles(
        prompt_keys=prompt_keys,
        units=tuple(unit_of[k] for k in prompt_keys),
        prompt_index=np.array([index[k] for k in keys], dtype=np.int64),
        repeat=np.array([res[i][1] for i in first], dtype=np.int64),
        logits=logits,
        num_verified=np.array([res[i][4] for i in first], dtype=np.int64),
        num_accepted=np.array([res[i][5] for i in first], dtype=np.int64),
    )


# ---------------------------------------------------------------------------------------- per repeat


def metric_values(conn: duckdb.DuckDBPyConnection, run_id: str, metric: str) -> dict[str, dict[int, float]]:
    """cell id → repeat → value of one metric of the metrics table, ok repeats only, NULLs left out."""
    rows = conn.execute(
        """
        SELECT m.cell_id, m."repeat", m.value
        FROM metrics m
        JOIN cells c ON c.run_id = m.run_id AND c.cell_id = m.cell_id AND c."repeat" = m."repeat"
        WHERE m.run_id = $run_id AND m.metric = $metric AND c.status = 'ok' AND m.value IS NOT NULL
        ORDER BY m.cell_id, m."repeat"
        """,
        {"run_id": run_id, "metric": metric},
    ).fetchall()
    out: dict[str, dict[int, float]] = {}
    for cell_id, rep, value in rows:
        out.setdefault(cell_id, {})[int(rep)] = float(value)
    return out


def has_relation(conn: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether a table or view of that name exists in the connection's main schema."""
    (count,) = conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = $name", {"name": name}
    ).fetchone()
    return bool(count)


# Plain decoding of the same target under the same load, in the same run and round: what speedup divides by.
_SAME_MEASUREMENT = ("backend", "target", "task", "temperature", "concurrency", "rate", "seed")


def speedup_values(conn: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict[int, float]]:
    """cell id → repeat (round) → speedup (`speedup_rounds` without the plain passes)."""
    return {cell_id: {rep: ratio for rep, (ratio, _, _) in rounds.items()}
            for cell_id, rounds in speedup_rounds(conn, run_id).items()}


def speedup_rounds(conn: duckdb.DuckDBPyConnection,
                   run_id: str) -> dict[str, dict[int, tuple[float, float, float | None]]]:
    """cell id → round → (throughput ÷ its sandwich's plain baseline, the opening plain pass, the closing
    one or None), for speculative cells (plain ones are 1 by definition and left out).

    Read from the store's `v_speedup` view where the connection has it; otherwise computed from the
    metrics table the same way (harness.store.views, harness.metrics.speedup): the `throughput` of the
    cell over the plain throughput interpolated to its time, opening^(1 − w) · closing^w — the opening
    pass alone where the round has no closing one — of the plain cell (method 'none') of the same run with the same backend, target, task
    (its whole spec: `params.task`), temperature, concurrency, rate and seed; the opening pass is the
    same repeat, the closing pass repeat + the run's rounds.
    """
    if has_relation(conn, "v_speedup"):
        sql = """
            SELECT v.cell_id, v."repeat", v.speedup, v.plain_open_throughput, v.plain_close_throughput
            FROM v_speedup v
            JOIN cells c ON c.run_id = v.run_id AND c.cell_id = v.cell_id AND c."repeat" = v."repeat"
            WHERE v.run_id = $run_id AND c.status = 'ok' AND c.method <> 'none' AND v.speedup IS NOT NULL
        """
    else:
        same = " AND ".join(f"p.{a} IS NOT DISTINCT FROM s.{a}" for a in _SAME_MEASUREMENT)
        sql = f"""
            WITH t AS (
                SELECT c.*, m.value AS throughput FROM cells c
                JOIN metrics m ON m.run_id = c.run_id AND m.cell_id = c.cell_id AND m."repeat" = c."repeat"
                WHERE c.run_id = $run_id AND c.status = 'ok' AND m.metric = 'throughput'
            ), rounds AS (SELECT repeats FROM runs WHERE run_id = $run_id
            ), mids AS (
                SELECT s.cell_id, s."repeat", s.throughput AS spec_t, p.throughput AS open_t, pc.throughput AS close_t,
                       (epoch(s.started_at) + epoch(s.finished_at)) / 2 AS s_mid,
                       (epoch(p.started_at) + epoch(p.finished_at)) / 2 AS o_mid,
                       (epoch(pc.started_at) + epoch(pc.finished_at)) / 2 AS c_mid
                FROM t s JOIN t p ON p."repeat" = s."repeat" AND p.method = 'none' AND {same}
                     AND (p.params -> 'task')::VARCHAR IS NOT DISTINCT FROM (s.params -> 'task')::VARCHAR
                CROSS JOIN rounds
                LEFT JOIN t pc ON pc.cell_id = p.cell_id AND pc."repeat" = s."repeat" + rounds.repeats
                WHERE s.method <> 'none' AND p.throughput > 0 AND s.throughput IS NOT NULL
            ), weighted AS (
                SELECT *, CASE WHEN c_mid = o_mid THEN 0.5
                               ELSE least(1.0, greatest(0.0, (s_mid - o_mid) / (c_mid - o_mid))) END AS w
                FROM mids
            )
            SELECT cell_id, "repeat",
                   spec_t / CASE WHEN close_t > 0 THEN exp((1 - w) * ln(open_t) + w * ln(close_t)) ELSE open_t END,
                   open_t, CASE WHEN close_t > 0 THEN close_t END
            FROM weighted
        """
    out: dict[str, dict[int, tuple[float, float, float | None]]] = {}
    for cell_id, rep, value, plain, after in conn.execute(sql, {"run_id": run_id}).fetchall():
        out.setdefault(cell_id, {})[int(rep)] = (float(value), float(plain), None if after is None else float(after))
    return out


def metric_names(conn: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """Distinct metric names of a run's metrics table, sorted."""
    rows = conn.execute(
        "SELECT DISTINCT metric FROM metrics WHERE run_id = $run_id ORDER BY metric", {"run_id": run_id}
    ).fetchall()
    return [r[0] for r in rows]
