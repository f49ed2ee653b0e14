"""`run_gate`: judge a candidate run against a baseline run under a suite's gate rules.

Candidate and baseline are each a (connection, run id): they may live in different databases — in CI
the baseline is an exported JSON loaded into an in-memory DuckDB. Order of business: is the candidate
valid (else exit 2, nothing judged); which cells failed (reported, exit 1); which candidate cells have a
comparable baseline cell; then every rule on every cell, where the cell compares on the scope its metric
declares (`harness.metrics.dependencies`: acceptance and ECE on CONTENT, on any machine; speed on
HARDWARE). A metric whose scope does not match is reported "incomparable" with the reason ("hardware
differs: host fingerprint …"), neither a pass nor a failure; exit 3 only when nothing at all was compared.

How each metric is estimated, by the rule's `test`:

    paired_bootstrap  per-prompt ratio metrics from request_steps (τ = acceptance_length, accepted /
                      verified per step, draft acceptance rate, wasted verification fraction; relative
                      effect) and ece_raw / ece_calibrated from step_confidences (absolute effect, STS
                      temperatures of each run's own cell); `stats.py` has the formulas. Any other
                      metric has no per-prompt form and falls back to mann_whitney, with a note.
    mann_whitney      per-repeat values of the metrics table, repeats as the unit
    paired_rounds     speedups: Mann-Whitney with the Hodges-Lehmann shift on the logs of each run's
                      per-round paired ratios (`rounds_test`); a paired_bootstrap rule on a speedup uses
                      it too (no per-prompt form)
    threshold         means over repeats compared with the allowances, no statistics (deterministic metrics)

`speedup` (alias `throughput_speedup`) is per repeat from the store's `v_speedup` view, or computed
the same way from throughput where a connection has no such view (`data.speedup_values`). A rule whose
metric a cell has in neither run (ECE of plain decoding, speedup of the plain cell itself) does not
apply to that cell; present in only one run, it is inconclusive. A cell with an invalid round in
either run (`v_rounds`: failed, truncated, one-token outputs, τ ≈ 1) is `invalid` on every rule, and a
timing rule on a cell whose plain baseline drifted (`harness.metrics.speedup.instability`: across
rounds, or inside half of the rounds' plain sandwiches) is `unstable`: both are reported, never passed or failed. Bootstrap draws are seeded from the
cell id, so a gate run is reproducible, and all metrics of a cell see the same resampled prompts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from functools import cached_property
from typing import Callable, Sequence

import duckdb
import numpy as np

from harness.gate import data
from harness.gate.comparability import CellMatch, match_cells
from harness.gate.pairing import pair_prompts
from harness.gate.report import Comparison, ExitCode, FailedCell, GateReport
from harness.gate.rules import GateRule, Validity
from harness.gate.stats import (
    Estimate,
    EceTable,
    ece_bootstrap,
    ece_table,
    ratio_bootstrap,
    repeats_test,
    rounds_test,
    threshold_estimate,
)
from harness.gate.validity import check_validity, round_problems
from harness.gate.verdict import DIRECTIONS, INCOMPARABLE, LEVELS, VERDICTS, judge
from harness.metrics.dependencies import Scope, depends_on

Run = tuple[duckdb.DuckDBPyConnection, str]

TESTS = ("paired_bootstrap", "mann_whitney", "paired_rounds", "threshold")
# Metrics that move with the machine's speed: judged `unstable` where the plain baseline drifted.
TIMING_PREFIXES = ("throughput", "speedup", "goodput", "request_throughput", "ttft", "tpot", "itl", "e2e",
                   "latency", "user_speed")

# name → (numerator, denominator) of per-prompt step sums: ratio-of-sums metrics (harness.metrics.acceptance).
_PerPrompt = Callable[[data.PromptSteps], np.ndarray]
PROMPT_RATIOS: dict[str, tuple[_PerPrompt, _PerPrompt]] = {
    "acceptance_length": (lambda s: s.accepted + s.steps, lambda s: s.steps),
    "accepted_per_step": (lambda s: s.accepted, lambda s: s.steps),
    "verified_per_step": (lambda s: s.verified, lambda s: s.steps),
    "draft_acceptance_rate": (lambda s: s.accepted, lambda s: s.verified),
    "wasted_verification_fraction": (lambda s: s.verified - s.accepted, lambda s: s.verified),
}
ECE_METRICS = {"ece_raw": False, "ece_calibrated": True}  # name → calibrated with the STS temperatures
SPEEDUP_METRICS = ("speedup", "throughput_speedup")


def seed_for(cell_id: str) -> int:
    """The bootstrap seed of a cell: stable across runs, machines and Python hash seeds."""
    return int.from_bytes(hashlib.sha256(cell_id.encode()).digest()[:8], "little")


class _Side:
    """One run's data, read lazily and once."""

    def __init__(self, run: Run, name: str):
        self.conn, self.run_id = run
        self.name = name  # "baseline" | "candidate", for messages
        self._cycles: dict[str, data.ConfidenceCycles | None] = {}
        self._values: dict[str, dict[str, dict[int, float]]] = {}

    @cached_property
    def info(self) -> data.RunInfo:
        return data.run_info(self.conn, self.run_id)

    @cached_property
    def cells(self) -> dict[str, data.CellInfo]:
        return data.cells(self.conn, self.run_id)

    @cached_property
    def prompt_steps(self) -> dict[str, data.PromptSteps]:
        return data.prompt_steps(self.conn, self.run_id)

    def cycles(self, cell_id: str) -> data.ConfidenceCycles | None:
        if cell_id not in self._cycles:
            self._cycles[cell_id] = data.confidence_cycles(self.conn, self.run_id, cell_id)
        return self._cycles[cell_id]

    @cached_property
    def round_problems(self) -> dict[str, list[str]]:
        return round_problems(self.conn, self.run_id)

    @cached_property
    def instability(self) -> dict[str, str]:
        """cell id → why its plain baseline is unstable (`harness.metrics.speedup.instability`, the run
        summary's rule), speculative cells from their rounds' plain sandwiches (`speedup_rounds`), plain
        cells from their own throughput across repeats; cells that are stable are left out."""
        from harness.metrics.speedup import DRIFT_BOUND, RoundPair, baseline_drift, instability

        out = {}
        for cell_id, rounds in data.speedup_rounds(self.conn, self.run_id).items():
            pairs = [RoundPair(rep, ratio, before, plain_after=after) for rep, (ratio, before, after) in rounds.items()]
            out[cell_id] = instability(pairs)
        for cell_id, by_repeat in data.metric_values(self.conn, self.run_id, "throughput").items():
            if self.cells.get(cell_id) is not None and cell_id not in out:
                drift = baseline_drift(list(by_repeat.values()))
                if drift is not None and drift > DRIFT_BOUND:
                    out[cell_id] = f"plain baseline moved {100 * drift:.0f}% between rounds (> {100 * DRIFT_BOUND:g}%)"
        return {k: v for k, v in out.items() if v}

    def repeat_values(self, metric: str, cell_id: str) -> list[float]:
        if metric not in self._values:
            if metric in SPEEDUP_METRICS:
                self._values[metric] = data.speedup_values(self.conn, self.run_id)
            else:
                self._values[metric] = data.metric_values(self.conn, self.run_id, metric)
        by_repeat = self._values[metric].get(cell_id, {})
        return [by_repeat[r] for r in sorted(by_repeat)]


class _Skip(Exception):
    """The rule does not apply to this cell: neither run has the metric."""


class _Inconclusive(Exception):
    """The rule applies but cannot be evaluated; the message says why."""


def _one_sided(base_missing: bool, cand_missing: bool, what: str) -> None:
    if base_missing and cand_missing:
        raise _Skip
    if base_missing or cand_missing:
        raise _Inconclusive(f"no {what} in the {'baseline' if base_missing else 'candidate'}")


def _ratio_estimate(rule: GateRule, cell_id: str, base: _Side, cand: _Side) -> Estimate:
    b, c = base.prompt_steps.get(cell_id), cand.prompt_steps.get(cell_id)
    _one_sided(b is None, c is None, "verify steps")
    num, den = PROMPT_RATIOS[rule.metric]
    _one_sided(not den(b).sum(), not den(c).sum(), f"{rule.metric} (0 denominator)")
    pairing = pair_prompts(b.prompt_keys, c.prompt_keys, c.units)
    if pairing.num_units == 0:
        raise _Inconclusive("no prompt measured by both runs")
    est = ratio_bootstrap(
        pairing.per_unit(num(b), "base"), pairing.per_unit(den(b), "base"),
        pairing.per_unit(num(c), "cand"), pairing.per_unit(den(c), "cand"),
        resamples=rule.resamples, alpha=rule.alpha, seed=seed_for(cell_id),
    )
    return _with_unpaired(est, pairing.num_unpaired)


def _with_unpaired(est: Estimate, num_unpaired: int) -> Estimate:
    if not num_unpaired:
        return est
    note = f"{num_unpaired} prompts measured by one run only, left out"
    return dataclasses.replace(est, note=f"{est.note}; {note}" if est.note else note)


def _side_ece_table(side: _Side, cell_id: str, cycles: data.ConfidenceCycles, calibrated: bool) -> EceTable:
    logits = cycles.logits
    temps = offsets = None
    if calibrated:
        repeats = side.cells[cell_id].repeats
        by_repeat = {r.repeat: r.sts_temperatures for r in repeats}
        offsets_of = {r.repeat: r.sts_offsets for r in repeats}
        missing = sorted({int(r) for r in cycles.repeat if by_repeat.get(int(r)) is None})
        if missing:
            raise _Inconclusive(f"no STS temperatures in the {side.name} (repeats {missing})")
        gamma = max(len(by_repeat[int(r)]) for r in np.unique(cycles.repeat))
        if any(len(by_repeat[int(r)]) < logits.shape[1] for r in np.unique(cycles.repeat)):
            raise _Inconclusive(f"{side.name} STS temperatures are fewer than the confidence positions")
        if gamma > logits.shape[1]:  # positions never stored are unobserved
            logits = np.pad(logits, ((0, 0), (0, gamma - logits.shape[1])), constant_values=np.nan)
        temps = np.ones_like(logits)  # [cycles, γ]: each cycle with the calibration of its repeat
        offsets = np.zeros_like(logits)
        for rep in np.unique(cycles.repeat):
            t, b = by_repeat[int(rep)], offsets_of.get(int(rep))
            temps[cycles.repeat == rep, : len(t)] = t
            if b is not None:
                offsets[cycles.repeat == rep, : len(b)] = b
    return ece_table(logits, cycles.num_verified, cycles.num_accepted, cycles.prompt_index,
                     len(cycles.prompt_keys), temps, offsets=offsets)


def _ece_estimate(rule: GateRule, cell_id: str, base: _Side, cand: _Side) -> Estimate:
    b, c = base.cycles(cell_id), cand.cycles(cell_id)
    _one_sided(b is None, c is None, "confidences")
    calibrated = ECE_METRICS[rule.metric]
    tb, tc = _side_ece_table(base, cell_id, b, calibrated), _side_ece_table(cand, cell_id, c, calibrated)
    _one_sided(not tb.counts.sum(), not tc.counts.sum(), "observed draft positions")
    pairing = pair_prompts(b.prompt_keys, c.prompt_keys, c.units)
    if pairing.num_units == 0:
        raise _Inconclusive("no prompt measured by both runs")
    est = ece_bootstrap(
        tb.grouped(pairing.base_index, pairing.unit, pairing.num_units),
        tc.grouped(pairing.cand_index, pairing.unit, pairing.num_units),
        resamples=rule.resamples, alpha=rule.alpha, seed=seed_for(cell_id),
    )
    return _with_unpaired(est, pairing.num_unpaired)


def _repeats_estimate(rule: GateRule, cell_id: str, base: _Side, cand: _Side, test: str) -> Estimate:
    b, c = base.repeat_values(rule.metric, cell_id), cand.repeat_values(rule.metric, cell_id)
    _one_sided(not b, not c, rule.metric)
    if test == "threshold":
        return threshold_estimate(b, c, rule.alpha)
    return repeats_test(b, c, rule.alpha)


def _rounds_estimate(rule: GateRule, cell_id: str, base: _Side, cand: _Side) -> Estimate:
    b, c = base.repeat_values(rule.metric, cell_id), cand.repeat_values(rule.metric, cell_id)
    _one_sided(not b, not c, rule.metric)
    if min(b + c) <= 0:
        raise _Inconclusive(f"{rule.metric}: a round with a non-positive ratio")
    return rounds_test(b, c, rule.alpha)


def _not_judged(rule: GateRule, match: CellMatch, base: _Side, cand: _Side) -> Comparison | None:
    """`invalid` (an invalid round in either run) or `unstable` (a timing rule, the plain baseline
    drifted in either run), else None: the cell is judged."""
    for side in (cand, base):
        problems = side.round_problems.get(match.cell_id)
        if problems:
            return Comparison(match.cell_id, match.label, rule, "invalid",
                              f"{side.name}: {'; '.join(problems)}")
    if rule.test != "threshold" and rule.metric.startswith(TIMING_PREFIXES):
        for side in (cand, base):
            why = side.instability.get(match.cell_id)
            if why:
                return Comparison(match.cell_id, match.label, rule, "unstable", f"{side.name}: {why}")
    return None


def check_rule(rule: GateRule) -> None:
    """Reject a rule the gate cannot apply, before any data is read (the suite loader checks the same)."""
    for name, value, allowed in (("test", rule.test, TESTS), ("direction", rule.direction, DIRECTIONS),
                                 ("level", rule.level, LEVELS)):
        if value not in allowed:
            raise ValueError(f"gate rule {rule.metric}: {name} must be one of {allowed}, got {value!r}")
    if not 0 < rule.alpha < 1 or rule.resamples < 1:
        raise ValueError(f"gate rule {rule.metric}: need 0 < alpha < 1 and resamples >= 1")


def estimate(rule: GateRule, cell_id: str, base: _Side, cand: _Side) -> Estimate:
    """The rule's estimate for one cell; raises _Skip / _Inconclusive."""
    if rule.test == "paired_rounds" or (rule.test == "paired_bootstrap" and rule.metric in SPEEDUP_METRICS):
        if rule.metric not in SPEEDUP_METRICS:
            raise _Inconclusive(f"paired_rounds compares per-round ratios; {rule.metric} is not one")
        return _rounds_estimate(rule, cell_id, base, cand)
    if rule.test == "paired_bootstrap":
        if rule.metric in PROMPT_RATIOS:
            return _ratio_estimate(rule, cell_id, base, cand)
        if rule.metric in ECE_METRICS:
            return _ece_estimate(rule, cell_id, base, cand)
        est = _repeats_estimate(rule, cell_id, base, cand, "mann_whitney")
        note = f"no per-prompt form of {rule.metric}: Mann-Whitney over repeats instead of the bootstrap"
        return dataclasses.replace(est, note=f"{est.note}; {note}")
    return _repeats_estimate(rule, cell_id, base, cand, rule.test)


def compare_cell(rule: GateRule, match: CellMatch, base: _Side, cand: _Side, scope: Scope) -> Comparison | None:
    """One rule on one content-comparable cell; None when the rule does not apply to the cell. Outside
    the metric's scope (other hardware for a speed metric) the comparison is `incomparable`, with why."""
    try:
        est = estimate(rule, match.cell_id, base, cand)
    except _Skip:
        return None
    except _Inconclusive as exc:
        if not match.comparable_on(scope):
            return Comparison(match.cell_id, match.label, rule, INCOMPARABLE, match.why_not(scope))
        return _not_judged(rule, match, base, cand) or Comparison(match.cell_id, match.label, rule, "inconclusive",
                                                                  str(exc))
    if not match.comparable_on(scope):
        return Comparison(match.cell_id, match.label, rule, INCOMPARABLE, match.why_not(scope))
    flagged = _not_judged(rule, match, base, cand)
    if flagged is not None:
        return dataclasses.replace(flagged, estimate=est)
    verdict, reason = judge(rule, est)
    return Comparison(match.cell_id, match.label, rule, verdict, reason, est)


def _failed_cells(cells: dict[str, data.CellInfo]) -> tuple[FailedCell, ...]:
    return tuple(
        FailedCell(c.cell_id, c.label, tuple(r.repeat for r in c.failed_repeats), c.failed_repeats[0].error or "")
        for c in cells.values() if c.failed_repeats
    )


def run_gate(
    candidate: Run, baseline: Run, rules: Sequence[GateRule], validity: Validity = Validity()
) -> GateReport:
    """Judge `candidate` against `baseline`; exit codes and their precedence in `report.py`.

    Raises ValueError for a malformed rule and LookupError for a run id that is not in its connection.
    """
    for rule in rules:
        check_rule(rule)
    cand, base = _Side(candidate, "candidate"), _Side(baseline, "baseline")
    valid = check_validity(cand.conn, cand.run_id, validity)
    failed = _failed_cells(cand.cells)
    common = dict(candidate_run=cand.run_id, baseline_run=base.run_id, validity=valid, failed_cells=failed)
    if not valid.valid:
        return GateReport(exit_code=ExitCode.INVALID, **common)

    notes: list[str] = []
    if base.info.status != "finished":
        notes.append(f"baseline run {base.run_id} is {base.info.status!r}, not 'finished': not used")
        matches = [CellMatch(c.cell_id, c.label, False, ("the baseline run did not finish",))
                   for c in cand.cells.values() if c.ok_repeats]
    else:
        matches = match_cells(cand.info, cand.cells, base.info, base.cells)
    comparable = [m for m in matches if m.comparable]

    comparisons: list[Comparison] = []
    for rule in rules:
        scope = depends_on(rule.metric)
        found = [c for m in comparable if (c := compare_cell(rule, m, base, cand, scope)) is not None]
        if comparable and not found:
            notes.append(f"rule {rule.metric}: no comparable cell has this metric in either run")
        comparisons += found
    comparisons.sort(key=lambda c: (c.label, c.metric))
    judged = [c for c in comparisons if c.verdict != INCOMPARABLE]

    if failed or any(c.blocking for c in comparisons):
        code = ExitCode.REGRESSION
    elif not comparable or (comparisons and not judged):  # nothing at all could be compared
        code = ExitCode.NO_BASELINE
    else:
        code = ExitCode.OK
    return GateReport(
        exit_code=code, comparisons=tuple(comparisons), unmatched=tuple(m for m in matches if not m.comparable),
        notes=tuple(notes), counts={v: sum(c.verdict == v for c in comparisons) for v in VERDICTS}, **common,
    )
