"""`harness compare RUN_A RUN_B`: what changed from A to B, metric by metric, most important first.

The gate decides; compare only shows, but with the gate's own statistics so a number comes with its
noise: per (cell, metric) the estimate `harness.gate.evaluate.estimate` gives for a paired-bootstrap
rule — a bootstrap over the prompts both runs measured for ratio metrics (τ, acceptance rates) and
ECE, Mann-Whitney with a Hodges-Lehmann interval over repeats for the rest (throughput, latency,
speed-up) — and the direction that is better for the metric. Where the test cannot reach p < 0.05 at
all (Mann-Whitney needs 4 repeats a side), the row says "too few" and shows no interval rather than one
that looks decisive. Rows are sorted by importance:
significant changes for the worse first, then for the better, then the rest by the size of the change;
`--all` lists every row, the default the important ones. Cells or metrics present in only one run keep
a row, with the other side empty, so nothing disappears silently from the view.

Latencies (unit `s`, `s/token`) are shown in ms, as the run's table and the HTML report show them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import duckdb

from harness.gate import data
from harness.gate.format import change, num

# Which way is better, by metric name prefix; a metric matching none has no direction (counts, sizes).
HIGHER = ("acceptance_length", "accepted_per_step", "draft_acceptance_rate", "position_acceptance", "throughput",
          "request_throughput", "speedup", "throughput_speedup", "user_speed", "goodput", "steps_per_s",
          "tokens_per_target_forward", "draft_coverage")
LOWER = ("ttft", "tpot", "itl", "e2e", "latency", "ece", "brier", "wasted_verification", "failed_request",
         "requests_failed", "step_time")
ALPHA = 0.05
RESAMPLES = 1000
DEFAULT_SHOWN = 25  # rows without --all: every significant one, then the largest changes, up to this many
MS_UNITS = {"s": "ms", "s/token": "ms/token"}


def direction_of(metric: str) -> str | None:
    """'higher', 'lower' or None (no better way) for a metric name."""
    if metric.startswith(HIGHER):
        return "higher"
    if metric.startswith(LOWER):
        return "lower"
    return None


@dataclass(frozen=True)
class CompareRow:
    cell_id: str
    label: str
    metric: str
    a: float | None  # mean over run A's ok repeats
    b: float | None
    change: float | None  # b / a − 1; None when a side is missing or a is 0
    unit: str = ""
    direction: str | None = None  # higher | lower | None
    scale: str = "relative"  # of effect and ci: relative (b/a − 1) or absolute (b − a, the metric's unit)
    effect: float | None = None  # the estimate's effect (Hodges-Lehmann or ratio of sums)
    ci: tuple[float, float] | None = None
    p_value: float | None = None
    method: str = ""  # paired_bootstrap | mann_whitney | "" (one side missing)
    n: int = 0
    decidable: bool = True  # False: at this n the test cannot reach p < α (e.g. 2 vs 2 repeats)

    @property
    def significant(self) -> bool:
        return (self.ci is not None and self.p_value is not None and self.p_value < ALPHA
                and (self.ci[0] > 0 or self.ci[1] < 0))

    @property
    def verdict(self) -> str:
        """worse | better | changed (significant, no direction) | noise | "" (not comparable)."""
        if self.a is None or self.b is None:
            return ""
        if not self.decidable:
            return "too few"
        if not self.significant:
            return "noise"
        if self.direction is None:
            return "changed"
        up = (self.effect or 0) > 0
        return "better" if up == (self.direction == "higher") else "worse"

    def as_tuple(self) -> tuple:
        return (self.label, self.metric, self.a, self.b, self.change)


COLUMNS = ("cell", "metric", "better", "a", "b", "change", "95% interval", "verdict", "test")


def _means(conn: duckdb.DuckDBPyConnection, run_id: str, metrics: Sequence[str] | None
           ) -> dict[tuple[str, str], tuple[float, str]]:
    rows = conn.execute(
        """
        SELECT m.cell_id, m.metric, avg(m.value), any_value(m.unit)
        FROM metrics m
        JOIN cells c ON c.run_id = m.run_id AND c.cell_id = m.cell_id AND c."repeat" = m."repeat"
        WHERE m.run_id = $run_id AND c.status = 'ok' AND m.value IS NOT NULL
        GROUP BY m.cell_id, m.metric
        """,
        {"run_id": run_id},
    ).fetchall()
    wanted = None if metrics is None else set(metrics)
    return {(cell, metric): (float(v), unit or "") for cell, metric, v, unit in rows
            if wanted is None or metric in wanted}


def compare_runs(
    conn: duckdb.DuckDBPyConnection, run_a: str, run_b: str, metrics: Sequence[str] | None = None,
    intervals: bool = True,
) -> list[CompareRow]:
    """Rows sorted by importance (`importance`); `metrics` restricts, None: all. With `intervals`, each
    row present in both runs carries the gate's estimate (effect, interval, p)."""
    from harness.gate.evaluate import _Inconclusive, _Side, _Skip, estimate
    from harness.gate.rules import GateRule

    labels = {c.cell_id: c.label for c in data.cells(conn, run_b).values()}
    labels.update({c.cell_id: c.label for c in data.cells(conn, run_a).values()})
    a, b = _means(conn, run_a, metrics), _means(conn, run_b, metrics)
    base, cand = _Side((conn, run_a), "baseline"), _Side((conn, run_b), "candidate")
    rows = []
    for cell_id, metric in a.keys() | b.keys():
        (va, unit_a), (vb, unit_b) = a.get((cell_id, metric), (None, "")), b.get((cell_id, metric), (None, ""))
        rel = vb / va - 1 if va and vb is not None else None
        row = CompareRow(cell_id, labels.get(cell_id, cell_id), metric, va, vb, rel, unit_a or unit_b,
                         direction_of(metric))
        if intervals and va is not None and vb is not None:
            rule = GateRule(metric=metric, direction=row.direction or "higher", test="paired_bootstrap",
                            alpha=ALPHA, resamples=RESAMPLES)
            try:
                est = estimate(rule, cell_id, base, cand)
            except (_Skip, _Inconclusive, ValueError):
                est = None
            if est is not None:
                decidable = est.min_p is None or est.min_p < ALPHA
                finite = decidable and est.ci is not None and all(math.isfinite(x) for x in est.ci)
                row = dataclasses.replace(row, scale=est.scale, effect=est.effect, ci=est.ci if finite else None,
                                          p_value=est.p_value, method=est.method, n=est.n, decidable=decidable)
        rows.append(row)
    rows.sort(key=importance)
    return rows


_RANK = {"worse": 0, "better": 1, "changed": 2, "noise": 3, "too few": 4, "": 5}


def importance(row: CompareRow) -> tuple:
    """Significant regressions first, then improvements, other significant changes, noise; within each
    the largest relative change first, then by cell and metric."""
    size = abs(row.change) if row.change is not None and math.isfinite(row.change) else -1.0
    return (_RANK[row.verdict], row.direction is None, -size, row.label, row.metric)


def important(rows: Sequence[CompareRow], limit: int = DEFAULT_SHOWN) -> list[CompareRow]:
    """Every significant row, then the largest others, up to `limit` rows in all (rows sorted already)."""
    significant = [r for r in rows if r.verdict in ("worse", "better", "changed")]
    rest = [r for r in rows if r.verdict not in ("worse", "better", "changed") and r.direction is not None]
    return significant + rest[:max(0, limit - len(significant))]


def _value(x: float | None, unit: str) -> str:
    unit = "" if unit == "fraction" else unit
    if x is None:
        return ""
    if unit in MS_UNITS:
        return f"{num(x * 1e3)} {MS_UNITS[unit]}"
    return f"{num(x)} {unit}".rstrip()


def _effect_text(x: float, row: CompareRow) -> str:
    if row.scale == "relative":
        return change(x, "relative")
    unit = MS_UNITS.get(row.unit, "" if row.unit == "fraction" else row.unit)
    value = x * 1e3 if row.unit in MS_UNITS else x
    return f"{change(value, 'absolute')} {unit}".rstrip()


def display_row(row: CompareRow) -> list[str]:
    """The strings of one row under COLUMNS."""
    arrow = {"higher": "↑ higher", "lower": "↓ lower"}.get(row.direction or "", "—")
    if row.effect is not None:
        shown = _effect_text(row.effect, row)
    else:
        shown = change(row.change, "relative") if row.change is not None else ""
    interval = f"[{_effect_text(row.ci[0], row)}, {_effect_text(row.ci[1], row)}]" if row.ci else (
        "" if row.decidable else "none: too few repeats")
    test = {"paired_bootstrap": f"bootstrap, {row.n} prompts", "mann_whitney": f"Mann-Whitney, {row.n} repeats"}
    return [row.label, row.metric, arrow, _value(row.a, row.unit), _value(row.b, row.unit), shown, interval,
            row.verdict, test.get(row.method, row.method)]


def compare_table(rows: Sequence[CompareRow]) -> str:
    """Aligned plain-text table of compare rows; "(0 rows)" when there are none."""
    if not rows:
        return "(0 rows)\n"
    body = [display_row(r) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [COLUMNS, *body]]
    return "\n".join(lines) + "\n"
