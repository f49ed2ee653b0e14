"""A model card measured by the harness itself: one run in the store → MODEL_CARD.md, every figure with its interval.

Why from a harness run rather than from a build's own evaluation loop: the card then uses the one
acceptance definition, the one ECE and the paired speedup that every suite, view and gate uses
(`harness.metrics`, `harness.gate.stats`), so a reader can reproduce any line of it with `harness query`,
and a rebuilt card is comparable to the committed one line by line ("within their intervals").

Intervals (95%):

    τ = 1 + Σ accepted / Σ drafting steps          percentile bootstrap over conversations (a multi-turn
                                                   conversation is one unit), 2,000 draws, seed 0
    α_k = accepted_k / verified_k                  Wilson score interval on the effective count: steps pooled over
                                                   rounds, shrunk by the design effect of conversations
                                                   (`stats.clustered_wilson`; a looping answer accepts on every
                                                   step, so steps are not independent trials)
    ECE (raw | calibrated)                         the gate's ECE (`stats.ece_table`), bootstrap over
                                                   conversations; `n` = confidences observed; calibrated: with
                                                   the drafter's STS temperatures and, where its build fitted
                                                   them, the level offsets beside them (`fit_sts_level`)
    ECE gain = raw − calibrated                    paired: both ECEs on the same bootstrap draw of conversations,
                                                   so the calibration claim is judged on its own interval
    mean gap = mean(a_j − y_j) (raw | calibrated)  signed calibration in the large over the ECE's positions, same
                                                   bootstrap: tells a level shift (|gap| ≈ ECE) from scatter
    ECE floor                                      E[ECE] of a perfectly calibrated predictor with these very
                                                   confidences: outcomes redrawn so P(y_j = 1) = a_j exactly
                                                   (sequential acceptance with P(accept j | j−1) = a_j / a_{j−1}),
                                                   mean over 200 draws. An ECE at its floor is sampling noise.
    ECE pooled                                     one ECE over every cell of a drafter at one temperature (all
                                                   tasks' cycles together, each with its cell's calibration),
                                                   bootstrap over all their conversations: what a goal "on ≥ N
                                                   confidences" is judged on, never a mean of per-task ECEs
    speedup                                        `v_speedup_summary` (paired rounds, its own estimator)

The relations the paper reports are printed as they came out, holds or not, with the rule used to judge
them (non-overlapping intervals, or "overlap" where they do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from harness.gate import data as gate_data
from harness.gate.stats import (NUM_BINS, EceTable, bootstrap_interval, clustered_wilson, cumulative_survival, ece_table,
                                 ratio_statistic)

TASK_ORDER = ("gsm8k", "humaneval", "mt_bench")
DRAFT_ORDER = ("dspark", "dspark-rnn", "dflash", "eagle3", "draft-model", "ngram", "none")
RESAMPLES = 2000
FLOOR_DRAWS = 200
ECE_GOAL = 0.02  # calibrated ECE at T = 1 (issue 16's goal), judged on ≥ ECE_GOAL_MIN_N confidences
ECE_GOAL_MIN_N = 10_000


@dataclass(frozen=True)
class Interval:
    value: float | None
    low: float | None = None
    high: float | None = None

    def text(self, digits: int = 2) -> str:
        if self.value is None or self.value != self.value:
            return "–"
        if self.low is None or self.high is None:
            return f"{self.value:.{digits}f}"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def above(self, other: Interval) -> bool | None:
        """True: this interval lies wholly above `other`; False: wholly below; None: they overlap."""
        if None in (self.low, self.high, other.low, other.high):
            return None
        if self.low > other.high:  # type: ignore[operator]
            return True
        if self.high < other.low:  # type: ignore[operator]
            return False
        return None


ZERO = Interval(0.0, 0.0, 0.0)  # what a paired difference is judged against
# An ECE gain is judged against ±half the card's last printed digit (3 places): a gain that does not show
# there is none (STS at its bound moves ECE by ~1e-4 on a tight interval, which read "holds" against 0).
NEGLIGIBLE_ECE_GAIN = Interval(0.0, -0.0005, 0.0005)


def _interval(stat, num_units: int, transform=lambda x: x) -> Interval:
    value, low, high = bootstrap_interval(stat, num_units, resamples=RESAMPLES)
    if value != value:
        return Interval(None)
    if low is None or high is None:
        return Interval(transform(value))
    return Interval(transform(value), transform(low), transform(high))


def _by_unit(values: np.ndarray, units: tuple[str, ...]) -> np.ndarray:
    names = sorted(set(units))
    index = np.array([names.index(u) for u in units])
    out = np.zeros(len(names))
    np.add.at(out, index, values)
    return out


def tau_interval(steps: gate_data.PromptSteps) -> tuple[Interval, int, int]:
    """τ with its bootstrap interval, the conversations and drafting steps behind it."""
    accepted, drafting = _by_unit(steps.accepted, steps.units), _by_unit(steps.steps, steps.units)
    if drafting.sum() == 0:
        return Interval(None), len(accepted), 0
    return _interval(ratio_statistic(accepted, drafting), len(accepted), lambda x: 1.0 + x), len(accepted), int(drafting.sum())


def _unit_index(cycles: gate_data.ConfidenceCycles) -> tuple[np.ndarray, int]:
    names = sorted(set(cycles.units))
    of_prompt = np.array([names.index(u) for u in cycles.units])
    return of_prompt[cycles.prompt_index], len(names)


def _calibration(cell: gate_data.CellInfo, cycles: gate_data.ConfidenceCycles) -> Calibration | None:
    """Each cycle's STS temperatures and level offsets (0 where its repeat has none), both [cycles, γ]; None
    where a repeat has no temperatures for every position."""
    by_repeat = {r.repeat: (r.sts_temperatures, r.sts_offsets) for r in cell.repeats}
    gamma = cycles.logits.shape[1]
    temps, offsets = [], []
    for r in cycles.repeat.tolist():
        t, b = by_repeat.get(int(r), (None, None))
        if t is None or len(t) < gamma:
            return None
        temps.append(t[:gamma])
        offsets.append(b[:gamma] if b is not None else (0.0,) * gamma)
    return Calibration(np.array(temps, dtype=np.float64).reshape(-1, gamma),
                       np.array(offsets, dtype=np.float64).reshape(-1, gamma))


class Calibration(NamedTuple):
    """A drafter's fitted calibration per cycle: STS temperatures and the level offsets beside them."""

    temperatures: np.ndarray  # [cycles, γ]
    offsets: np.ndarray  # [cycles, γ] (0: STS alone)


class EceMeasure(NamedTuple):
    """One ECE of a cell's confidences, raw or calibrated: with its interval, its floor, and the per-unit
    table it came from (the paired gain reuses it)."""

    ece: Interval
    floor: float
    confidences: int
    table: EceTable
    mean_gap: Interval  # mean of a − y, signed (`EceTable.mean_gap`), same bootstrap units


def ece_with_floor(cycles: gate_data.ConfidenceCycles, calibration: Calibration | None) -> EceMeasure:
    """ECE with its bootstrap interval, its floor for these confidences, the confidences observed, and their mean
    gap a − y with its interval; `calibration` None: the raw confidences."""
    unit, num_units = _unit_index(cycles)
    temps, offsets = calibration if calibration is not None else (None, None)
    table = ece_table(cycles.logits, cycles.num_verified, cycles.num_accepted, unit, num_units, temps, offsets=offsets)
    n = int(table.counts.sum())
    if n == 0:
        return EceMeasure(Interval(None), float("nan"), 0, table, Interval(None))
    return EceMeasure(_interval(table.ece, num_units), ece_floor(cycles, temps, unit, num_units, offsets=offsets), n,
                      table, _interval(table.mean_gap, num_units))


def ece_gain(raw: EceTable, calibrated: EceTable) -> Interval:
    """Raw − calibrated ECE with a paired bootstrap interval: the two ECEs share every draw, so the interval is
    that of the difference, not two marginal intervals whose overlap says little. Judged with
    `.above(NEGLIGIBLE_ECE_GAIN)`."""
    if raw.counts.sum() == 0:
        return Interval(None)
    return _interval(lambda w: raw.ece(w) - calibrated.ece(w), raw.counts.shape[0])


def ece_floor(cycles: gate_data.ConfidenceCycles, temperatures: np.ndarray | None, unit: np.ndarray,
              num_units: int, draws: int = FLOOR_DRAWS, seed: int = 0, *, offsets: np.ndarray | None = None) -> float:
    """Mean ECE when outcomes are drawn from the confidences themselves (module docstring)."""
    survival = cumulative_survival(cycles.logits, temperatures, offsets)  # [cycles, γ]
    survival = np.where(np.isfinite(survival), survival, 0.0)
    previous = np.concatenate([np.ones((survival.shape[0], 1)), survival[:, :-1]], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        conditional = np.where(previous > 0, survival / previous, 0.0)
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        accept = rng.random(conditional.shape) < conditional
        run = np.cumprod(accept, axis=1).sum(axis=1)  # accepted prefix length
        simulated = np.minimum(run, cycles.num_verified)
        table: EceTable = ece_table(cycles.logits, cycles.num_verified, simulated, unit, num_units, temperatures,
                                    offsets=offsets)
        values.append(float(table.ece(np.ones((1, num_units)))[0]))
    return float(np.mean(values))


def _distinct_cycles(conn, run_id: str, cell_id: str, replays: dict[str, gate_data.Replay]
                     ) -> gate_data.ConfidenceCycles | None:
    """A cell's confidence cycles, one round of them when its rounds replay one another: the ECE is the same
    either way, its confidence count and its floor are not."""
    cycles = gate_data.confidence_cycles(conn, run_id, cell_id)
    replay = replays.get(cell_id)
    return cycles if cycles is None or replay is None else cycles.of_round(replay.first)


def _positions(counts: gate_data.ConversationPositions | None) -> list[tuple[int, Interval]]:
    """α_k per position k with a verified draft: `v_positions`' ratio, its interval over conversations."""
    out: list[tuple[int, Interval]] = []
    if counts is None:
        return out
    for k in range(counts.verified.shape[1]):
        verified, accepted = counts.verified[:, k], counts.accepted[:, k]
        if verified.sum() > 0:
            low, high = clustered_wilson(accepted, verified)
            out.append((k + 1, Interval(float(accepted.sum() / verified.sum()), low, high)))
    return out


def _speedups(conn, run_id: str) -> dict[str, dict[str, Any]]:
    rows = conn.execute(
        """SELECT cell_id, plain_cell_id, speedup, ci_low, ci_high, rounds, status FROM v_speedup_summary
           WHERE run_id = $run_id""", {"run_id": run_id}).fetchall()
    return {r[0]: {"plain": r[1], "speedup": Interval(r[2], r[3], r[4]), "rounds": r[5], "status": r[6]} for r in rows}


def _throughput(conn, run_id: str) -> dict[str, list[float]]:
    """Per cell, its throughput in each round (repeat), in round order."""
    rows = conn.execute(
        """SELECT cell_id, "repeat", value FROM v_metrics WHERE run_id = $run_id AND metric = 'throughput'
           AND value IS NOT NULL ORDER BY cell_id, "repeat" """, {"run_id": run_id}).fetchall()
    out: dict[str, dict[int, float]] = {}
    for cell_id, repeat, value in rows:
        out.setdefault(cell_id, {})[int(repeat)] = float(value)
    return {k: [v[r] for r in sorted(v)] for k, v in out.items()}


def _against(spec: dict[int, float] | list[float], plain: list[float]) -> Interval:
    """Per-round ratio to another engine's plain cell: geometric mean, range over rounds (no pairing model)."""
    ratios = [s / p for s, p in zip(spec, plain) if p]
    if not ratios:
        return Interval(None)
    geo = float(np.exp(np.mean(np.log(ratios))))
    return Interval(geo, min(ratios), max(ratios)) if len(ratios) > 1 else Interval(geo)


@dataclass(frozen=True)
class CardRow:
    """One measured cell of the card."""

    cell_id: str
    backend: str
    task: str
    drafter: str
    method: str
    gamma: int
    policy: str
    temperature: float
    concurrency: int
    conversations: int
    drafting_steps: int
    tau: Interval
    positions: tuple[tuple[int, Interval], ...]
    ece_raw: Interval
    ece_calibrated: Interval
    ece_floor_raw: float | None
    ece_floor_calibrated: float | None
    ece_gain: Interval  # raw − calibrated, paired over the same draws
    mean_gap_raw: Interval  # mean a − y over the ECE's positions (> 0: overconfident)
    mean_gap_calibrated: Interval
    confidences: int
    tokens_per_s: float | None
    speedup: Interval
    speedup_status: str | None
    speedup_vs_other_plain: Interval  # against the other engine's plain cell of the same point, when run


def _measured(measure: EceMeasure | None) -> tuple[Interval, float | None, Interval]:
    """(ECE, floor, mean gap) of a card row; empty for confidences not measured (no head, or no STS)."""
    if measure is None:
        return Interval(None), None, Interval(None)
    return measure.ece, measure.floor, measure.mean_gap


def card_rows(conn, run_id: str) -> list[CardRow]:
    cells = gate_data.cells(conn, run_id)
    replays = gate_data.replayed_rounds(conn, run_id)
    steps = {cell_id: gate_data.one_round(s, replays.get(cell_id)) for cell_id, s in gate_data.prompt_steps(conn, run_id).items()}
    positions = {cell_id: gate_data.one_round(p, replays.get(cell_id))
                 for cell_id, p in gate_data.conversation_positions(conn, run_id).items()}
    speedups = _speedups(conn, run_id)
    throughput = _throughput(conn, run_id)
    plain_of: dict[tuple, str] = {}
    for cell in cells.values():
        a = cell.axes
        if cell.is_plain and cell.ok_repeats:
            plain_of[(a["backend"], a["task"], a["temperature"], a["concurrency"])] = cell.cell_id
    rows = []
    for cell in cells.values():
        if not cell.ok_repeats:
            continue
        a = cell.axes
        if cell.cell_id in steps:
            tau, conversations, drafting = tau_interval(steps[cell.cell_id])
        else:
            tau, conversations, drafting = Interval(None), 0, 0
        raw: EceMeasure | None = None
        cal: EceMeasure | None = None
        gain = Interval(None)
        cycles = _distinct_cycles(conn, run_id, cell.cell_id, replays)
        if cycles is not None:
            raw = ece_with_floor(cycles, None)
            calibration = _calibration(cell, cycles)
            if calibration is not None:
                cal = ece_with_floor(cycles, calibration)
                gain = ece_gain(raw.table, cal.table)
        ece_raw, floor_raw, gap_raw = _measured(raw)
        ece_cal, floor_cal, gap_cal = _measured(cal)
        tput = throughput.get(cell.cell_id, [])
        other = [key for key in plain_of if key[0] != a["backend"] and key[1:] == (a["task"], a["temperature"], a["concurrency"])]
        vs_other = _against(tput, throughput.get(plain_of[other[0]], [])) if other and not cell.is_plain else Interval(None)
        sp = speedups.get(cell.cell_id, {})
        rows.append(CardRow(
            cell_id=cell.cell_id, backend=a["backend"], task=a["task"], drafter=a["drafter"], method=a["method"],
            gamma=int(a["num_drafts"] or 0), policy=a["policy"], temperature=float(a["temperature"] or 0.0),
            concurrency=int(a["concurrency"] or 0), conversations=conversations, drafting_steps=drafting, tau=tau,
            positions=tuple(_positions(positions.get(cell.cell_id))), ece_raw=ece_raw, ece_calibrated=ece_cal,
            ece_floor_raw=floor_raw, ece_floor_calibrated=floor_cal, ece_gain=gain, mean_gap_raw=gap_raw,
            mean_gap_calibrated=gap_cal, confidences=raw.confidences if raw is not None else 0,
            tokens_per_s=float(np.mean(tput)) if tput else None, speedup=sp.get("speedup", Interval(None)),
            speedup_status=sp.get("status"), speedup_vs_other_plain=vs_other,
        ))
    order = {d: i for i, d in enumerate(DRAFT_ORDER)}
    rows.sort(key=lambda r: (TASK_ORDER.index(r.task) if r.task in TASK_ORDER else 9, r.temperature, r.backend,
                             r.concurrency, order.get(r.drafter, 50), r.drafter, r.gamma, r.policy))
    return rows


_VERDICT = {True: "holds", False: "does not hold", None: "overlap"}  # `Interval.above`, as a relation reads it


def relations(rows: list[CardRow], pooled: PooledCalibration | None = None) -> list[tuple[str, str, str]]:
    """(claim, verdict, evidence): verdict is holds | does not hold | overlap (intervals do not separate).
    With `pooled` (`pooled_calibration`), also the calibrated-ECE goal, judged on that one pooled ECE."""
    out: list[tuple[str, str, str]] = []
    tau = {(r.backend, r.task, r.temperature, r.concurrency, r.drafter): r for r in rows if r.policy == "full"}
    for backend, task, temp, conc, drafter in sorted(tau):
        if drafter != "dspark":
            continue
        trio = [tau.get((backend, task, temp, conc, d)) for d in ("dspark", "dflash", "eagle3")]
        if None in trio:
            continue
        # The chain is the paper's claim; its links are printed too, since one link can separate while the chain
        # overlaps (DSpark above DFlash, with Eagle3-style between them).
        links = {name: _VERDICT[trio[i].tau.above(trio[j].tau)]  # type: ignore[union-attr]
                 for name, i, j in (("DSpark > DFlash", 0, 1), ("DFlash > Eagle3-style", 1, 2), ("DSpark > Eagle3-style", 0, 2))}
        chain = [links["DSpark > DFlash"], links["DFlash > Eagle3-style"]]
        verdict = ("holds" if all(v == "holds" for v in chain) else
                   "does not hold" if "does not hold" in chain else "overlap")
        out.append((f"{task} T={temp:g} c{conc}: τ DSpark > DFlash > Eagle3-style", verdict,
                    " > ".join(t.tau.text() for t in trio)  # type: ignore[union-attr]
                    + "; " + ", ".join(f"{name} {v}" for name, v in links.items())))
    for r in rows:
        if r.drafter == "dspark" and r.ece_raw.value is not None and r.ece_calibrated.value is not None:
            verdict = _VERDICT[r.ece_gain.above(NEGLIGIBLE_ECE_GAIN)]
            out.append((f"{r.task} T={r.temperature:g} c{r.concurrency}: DSpark ECE calibrated < raw", verdict,
                        f"{r.ece_raw.text(3)} → {r.ece_calibrated.text(3)}, paired gain {r.ece_gain.text(3)}, "
                        f"n {r.confidences:,}"))
    if pooled is not None:
        ece, n = pooled.calibrated.ece, pooled.calibrated.confidences
        below = Interval(ECE_GOAL, ECE_GOAL, ECE_GOAL).above(ece)  # judged on the interval, as every relation is
        verdict = ("too few confidences" if n < ECE_GOAL_MIN_N else
                   _VERDICT[below])
        out.append((f"T={pooled.temperature:g}: DSpark calibrated ECE ≤ {ECE_GOAL:.0%} on ≥ {ECE_GOAL_MIN_N:,} confidences",
                    verdict, f"{pooled.calibrated.ece.text(3)} (floor {_num(pooled.calibrated.floor)}) on {n:,}, "
                             f"one ECE over {', '.join(pooled.tasks)} pooled"))
    return out


@dataclass(frozen=True)
class PooledCalibration:
    """One ECE over every confidence of a drafter's cells at one decoding temperature, all tasks together: what
    a goal stated "on ≥ N confidences" is judged on. Not a mean of the per-task ECEs: each of those carries the
    floor of its own, smaller count, and their mean would judge the sampling noise of the split."""

    temperature: float
    tasks: tuple[str, ...]
    cells: int
    raw: EceMeasure
    calibrated: EceMeasure
    gain: Interval


def pooled_calibration(conn, run_id: str, temperature: float = 1.0, drafter: str = "dspark") -> PooledCalibration | None:
    """The cells' cycles concatenated (each cell's conversations its own bootstrap units, each cycle with its
    own cell's calibration) and measured as one cell; None without calibrated confidences."""
    parts: list[tuple[str, gate_data.ConfidenceCycles, Calibration]] = []
    tasks: list[str] = []
    replays = gate_data.replayed_rounds(conn, run_id)
    for cell in gate_data.cells(conn, run_id).values():
        a = cell.axes
        if not cell.ok_repeats or a["drafter"] != drafter or float(a["temperature"] or 0.0) != temperature:
            continue
        cycles = _distinct_cycles(conn, run_id, cell.cell_id, replays)
        calibration = None if cycles is None else _calibration(cell, cycles)
        if cycles is None or calibration is None:
            continue
        parts.append((cell.cell_id, cycles, calibration))
        tasks.append(a["task"])
    if not parts:
        return None
    cycles, calibration = _concatenated(parts)
    raw, cal = ece_with_floor(cycles, None), ece_with_floor(cycles, calibration)
    return PooledCalibration(temperature, tuple(sorted(set(tasks), key=_task_rank)), len(parts), raw, cal,
                             ece_gain(raw.table, cal.table))


def _task_rank(task: str) -> tuple[int, str]:
    return (TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER), task)


def _concatenated(parts: list[tuple[str, gate_data.ConfidenceCycles, Calibration]]
                  ) -> tuple[gate_data.ConfidenceCycles, Calibration]:
    """Several cells' cycles as one: prompts and conversations named per cell, positions padded to the widest γ
    (NaN logits, never observed; temperature 1, offset 0)."""
    gamma = max(c.logits.shape[1] for _, c, _ in parts)
    keys: list[str] = []
    units: list[str] = []
    index, repeat, logits, verified, accepted, temps, offsets = [], [], [], [], [], [], []
    for cell_id, c, (t, b) in parts:
        width = gamma - c.logits.shape[1]
        index.append(c.prompt_index + len(keys))
        keys += [f"{cell_id}/{k}" for k in c.prompt_keys]
        units += [f"{cell_id}/{u}" for u in c.units]
        repeat.append(c.repeat)
        logits.append(np.pad(c.logits, ((0, 0), (0, width)), constant_values=np.nan))
        temps.append(np.pad(t, ((0, 0), (0, width)), constant_values=1.0))
        offsets.append(np.pad(b, ((0, 0), (0, width)), constant_values=0.0))
        verified.append(c.num_verified)
        accepted.append(c.num_accepted)
    cycles = gate_data.ConfidenceCycles(tuple(keys), tuple(units), np.concatenate(index), np.concatenate(repeat),
                                        np.concatenate(logits), np.concatenate(verified), np.concatenate(accepted))
    return cycles, Calibration(np.concatenate(temps), np.concatenate(offsets))


def card_sections(rows: list[CardRow], pooled: PooledCalibration | None = None) -> list[str]:
    lines = [
        "## Acceptance (95% intervals)",
        "",
        "τ = 1 + accepted ÷ drafting steps (harness.metrics.acceptance); interval: bootstrap over conversations.",
        "α_k: share of verified drafts at position k accepted (Wilson interval on the count that conversations are "
        "worth: `stats.clustered_wilson`).",
        "Counts (drafting steps here, confidences below) are of distinct steps: each round of a T > 0 cell draws its own "
        "seeds and adds samples; the rounds of a greedy cell replay one another step for step and count once "
        "(`gate_data.replayed_rounds`).",
        "",
        "| task | T | backend | c | drafter | γ | policy | conversations | drafting steps | τ | α₁ | α₂ | α₃ | α_γ |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.drafter == "none":
            continue
        pos = dict(r.positions)
        cols = [pos.get(k, Interval(None)).text() for k in (1, 2, 3)] + [pos.get(r.gamma, Interval(None)).text()]
        lines.append(f"| {r.task} | {r.temperature:g} | {r.backend} | {r.concurrency} | {r.drafter} | {r.gamma} | {r.policy} "
                     f"| {r.conversations} | {r.drafting_steps:,} | {r.tau.text()} | " + " | ".join(cols) + " |")
    lines += [
        "",
        "## Calibration (95% intervals)",
        "",
        f"ECE over every draft position (each with its own {NUM_BINS} bins; the gate's `ece_raw` / `ece_calibrated`), raw and",
        "after the drafter's calibration (STS temperatures, and the level offsets fitted beside them where its build has",
        "them). Floor: the ECE a perfectly calibrated predictor would show on these confidences (sampling noise).",
        "Gain: raw − calibrated with a paired interval (both on the same bootstrap draws); it judges the calibration.",
        "ECE is biased upwards by that noise, and resampling adds the bias again, so an ECE's bootstrap interval can",
        "lie wholly above its point: read it as conservative (the ≤ 2% goal is judged on it); in the paired gain the",
        "bias cancels.",
        "Mean gap: the mean of a − y over the same positions, signed (> 0: the confidences promise more acceptance than",
        "the verifier gives); |mean gap| ≤ ECE, and where the two are close the miscalibration is a level shift, not",
        "scatter. A temperature moves each σ(c / T) away from ½ (T < 1) or towards it (T > 1): it lowers the confidences",
        "on one side of ½ only by raising those on the other, so STS alone removes a level shift only where they sit on",
        "one side; a level offset per position (σ(c / T + b), b fitted so the held-out set's mean matches) removes it.",
        "",
        "| task | T | backend | c | drafter | confidences | ECE raw | floor | mean gap raw | ECE calibrated | floor "
        "| mean gap calibrated | gain (paired) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r.confidences:
            continue
        lines.append(f"| {r.task} | {r.temperature:g} | {r.backend} | {r.concurrency} | {r.drafter} | {r.confidences:,} "
                     f"| {r.ece_raw.text(3)} | {_num(r.ece_floor_raw)} | {r.mean_gap_raw.text(3)} | {r.ece_calibrated.text(3)} "
                     f"| {_num(r.ece_floor_calibrated)} | {r.mean_gap_calibrated.text(3)} | {r.ece_gain.text(3)} |")
    if pooled is not None:
        lines.append(f"| {' + '.join(pooled.tasks)} (pooled) | {pooled.temperature:g} | | | dspark | "
                     f"{pooled.raw.confidences:,} | {pooled.raw.ece.text(3)} | {_num(pooled.raw.floor)} "
                     f"| {pooled.raw.mean_gap.text(3)} | {pooled.calibrated.ece.text(3)} | {_num(pooled.calibrated.floor)} "
                     f"| {pooled.calibrated.mean_gap.text(3)} | {pooled.gain.text(3)} |")
        lines += ["", f"Pooled: one ECE over the {pooled.cells} cells' confidences together (each cell's own "
                  "calibration, conversations resampled across them), not a mean of their ECEs."]
    lines += [
        "",
        "## Speed",
        "",
        "tokens/s: mean over rounds. Speedup: over plain decoding on the same engine, paired per round",
        "(`v_speedup_summary`, its interval and status). Against the other engine's plain decoding of the same",
        "point: geometric mean of per-round ratios [range over rounds].",
        "",
        "| task | T | backend | c | drafter | γ | policy | tokens/s | speedup (same engine) | status | vs other engine's plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.task} | {r.temperature:g} | {r.backend} | {r.concurrency} | {r.drafter} | {r.gamma} | {r.policy} "
                     f"| {_num(r.tokens_per_s, 1)} | {r.speedup.text()} | {r.speedup_status or '–'} "
                     f"| {r.speedup_vs_other_plain.text()} |")
    lines += ["", "## The paper's relations, as measured here", "",
              "Judged on the 95% intervals: *holds* when they separate in the claimed order, *overlap* when they do not",
              "separate (no claim either way), *does not hold* when they separate the other way.", ""]
    for claim, verdict, evidence in relations(rows, pooled):
        lines.append(f"- **{verdict}**: {claim} ({evidence})")
    return lines


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or x != x else f"{x:.{digits}f}"


def card_json(rows: list[CardRow], pooled: PooledCalibration | None = None) -> str:
    """The card's figures as JSON (what a rebuild is compared against): `cells`, one object per cell, and
    `pooled_calibration`, the ECE over every task's confidences together (null when the run has none). Two named
    parts rather than one list: a reader of cells never meets an object of another shape."""
    def plain(value):
        if isinstance(value, Interval):
            return {"value": value.value, "low": value.low, "high": value.high}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value
    cells = [{k: plain(v) for k, v in r.__dict__.items()} for r in rows]
    calibration = None if pooled is None else {
        "temperature": pooled.temperature, "tasks": list(pooled.tasks), "cells": pooled.cells,
        "confidences": pooled.raw.confidences, "ece_raw": plain(pooled.raw.ece), "ece_floor_raw": pooled.raw.floor,
        "ece_calibrated": plain(pooled.calibrated.ece), "ece_floor_calibrated": pooled.calibrated.floor,
        "ece_gain": plain(pooled.gain), "mean_gap_raw": plain(pooled.raw.mean_gap),
        "mean_gap_calibrated": plain(pooled.calibrated.mean_gap)}
    return json.dumps({"cells": cells, "pooled_calibration": calibration}, indent=1)
