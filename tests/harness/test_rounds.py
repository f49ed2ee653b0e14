"""Interleaved rounds: the plan's order, the paired speedup summary and the gates a suite can fire."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from harness.metrics.speedup import RoundPair, paired_speedup, sandwich_position, summary_lines
from harness.runner import RunError, families, load_cells, plan, round_slots

REPO = Path(__file__).resolve().parents[2]


def cell(drafter: str = "none", gamma: int = 0, concurrency: int = 1, backend: str = "inhouse", task: str = "gsm8k") -> Cell:
    method = "none" if drafter == "none" else "dspark"
    return Cell(backend, TargetSpec("t", "embedded"), DrafterSpec(drafter, method), gamma,
                TaskSpec(task, 4, 16), PolicySpec("full"), concurrency=concurrency)


def test_each_round_sandwiches_the_rotating_speculative_cells_between_two_plain_passes():
    plain, a, b = cell(), cell("a", 3), cell("b", 3)
    other = [cell(concurrency=4), cell("a", 3, concurrency=4)]
    work = plan([plain, a, other[0], b, other[1]], 3)
    order = [(c.drafter.name + str(c.concurrency), r) for c, r in work]
    assert order == [("none1", 0), ("a1", 0), ("b1", 0), ("none1", 3), ("none4", 0), ("a4", 0), ("none4", 3),
                     ("none1", 1), ("b1", 1), ("a1", 1), ("none1", 4), ("none4", 1), ("a4", 1), ("none4", 4),
                     ("none1", 2), ("a1", 2), ("b1", 2), ("none1", 5), ("none4", 2), ("a4", 2), ("none4", 5)]
    # every speculative cell once per round, every plain cell twice: repeat r opens round r, R + r closes it
    assert sorted((c.cell_id, r) for c, r in work) == sorted(
        [(c.cell_id, r) for c in (a, b, other[1]) for r in range(3)] +
        [(c.cell_id, r) for c in (plain, other[0]) for r in range(6)])
    slots = round_slots(work, 3)
    assert [slots[(plain.cell_id, r)] for r in range(3)] == [0, 0, 0]
    assert [slots[(plain.cell_id, 3 + r)] for r in range(3)] == [3, 3, 3]  # the closing pass, in its own round
    assert [slots[(b.cell_id, r)] for r in range(3)] == [2, 1, 2]


def test_every_cell_of_a_round_samples_from_that_rounds_seeds_its_closing_plain_pass_too():
    plain, a = cell(), cell("a", 3)
    work = plan([plain, a], 3)
    assert [(c.drafter.name, r, c.sampling_round) for c, r in work] == [
        ("none", 0, 0), ("a", 0, 0), ("none", 3, 0), ("none", 1, 1), ("a", 1, 1), ("none", 4, 1),
        ("none", 2, 2), ("a", 2, 2), ("none", 5, 2)]
    # one cell whatever its round: the same id, row and axes, the requests drawn anew
    assert {c.cell_id for c, _ in work if c.is_plain} == {plain.cell_id}
    first, second = (c for c, r in work if c.drafter.name == "a" and r < 2)
    assert first.params() == second.params() and first.axes() == second.axes()
    assert first.request_seed(0, 0) != second.request_seed(0, 0)


def test_round_zero_keeps_the_seeds_of_runs_before_rounds_drew_their_own_and_rounds_never_share_one():
    seeded = replace(cell(), seed=7)
    assert seeded.request_seed(3, 1) == 7 * 1_000_003 + 3 * 1_009 + 1  # what the store's history was drawn with
    seeds = {seeded.in_round(r).request_seed(s, t) for r in range(4) for s in range(200) for t in range(2)}
    assert len(seeds) == 4 * 200 * 2 and all(0 <= x < 2**63 for x in seeds)


def test_a_family_without_a_plain_cell_rotates_as_before():
    a, b, c = cell("a", 3), cell("b", 3), cell("c", 3)
    work = plan([a, b, c], 2)
    assert [(x.drafter.name, r) for x, r in work] == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1)]


def test_server_configs_are_the_units_and_all_their_load_points_run_while_the_server_is_up():
    cells = [cell(backend="vllm", concurrency=c) for c in (1, 4)] + \
            [cell("a", 3, backend="vllm", concurrency=c) for c in (1, 4)] + \
            [cell("b", 3, backend="vllm", concurrency=c) for c in (1, 4)]
    key = {c.cell_id: f"server-{c.drafter.name}" for c in cells}
    groups = families(cells, key)
    assert len(groups) == 1 and [[c.concurrency for c in unit] for unit in groups[0]] == [[1, 4], [1, 4], [1, 4]]
    work = plan(cells, 2, key)
    order = [(c.drafter.name, c.concurrency, r) for c, r in work]
    assert order == [("none", 1, 0), ("none", 4, 0), ("a", 1, 0), ("a", 4, 0), ("b", 1, 0), ("b", 4, 0),
                     ("none", 1, 2), ("none", 4, 2),
                     ("none", 1, 1), ("none", 4, 1), ("b", 1, 1), ("b", 4, 1), ("a", 1, 1), ("a", 4, 1),
                     ("none", 1, 3), ("none", 4, 3)]


def sign_interval_reference(values, confidence=0.95):
    """The order-statistic interval for the median from scipy's binomial: the narrowest [x_(k), x_(n+1−k)]
    whose coverage 1 − 2·P(B ≤ k − 1) reaches `confidence`."""
    from scipy import stats

    n, ordered = len(values), sorted(values)
    ks = [k for k in range(1, n // 2 + 1) if 1 - 2 * stats.binom.cdf(k - 1, n, 0.5) >= confidence]
    return (ordered[max(ks) - 1], ordered[n - max(ks)]) if ks else None


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 10, 17, 40])
def test_paired_speedup_is_the_median_ratio_over_the_sandwich_with_a_sign_interval(n):
    rng = np.random.default_rng(n)
    plain = 100 * np.exp(rng.normal(0, 0.03, n))
    after = plain * np.exp(rng.normal(0, 0.02, n))
    spec = 2 * np.sqrt(plain * after) * np.exp(rng.normal(0, 0.05, n))
    rounds = [RoundPair(i, s, p, plain_after=q) for i, (s, p, q) in enumerate(zip(spec, plain, after))]
    summary = paired_speedup(rounds, planned=n)
    ratios = spec / np.sqrt(plain * after)
    assert summary.ratios == pytest.approx(tuple(ratios))
    assert summary.value == pytest.approx(math.exp(np.median(np.log(ratios))))
    reference = sign_interval_reference(list(ratios))
    assert summary.ci == (pytest.approx(reference) if reference else None)
    if reference:
        assert summary.ci_coverage >= 0.95
    assert summary.status == "ok", summary.reason
    assert summary.baseline_drift == pytest.approx(max(*plain, *after) / min(*plain, *after) - 1 if n > 1 else None)
    assert summary.sandwich_drift == pytest.approx(float(np.max(np.maximum(plain, after) / np.minimum(plain, after) - 1)))


def test_the_sign_interval_covers_the_true_median_at_its_stated_rate():
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(2000):
        ratios = np.exp(rng.standard_cauchy(9) * 0.1)  # heavy tails: a t interval would not hold
        summary = paired_speedup([RoundPair(i, r, 1.0) for i, r in enumerate(ratios)], planned=9, drift_bound=10)
        hits += summary.ci[0] <= 1.0 <= summary.ci[1]
    assert summary.ci_coverage == pytest.approx(1 - 2 * 10 / 512)  # k = 2 at 9 rounds: 0.961
    assert abs(hits / 2000 - summary.ci_coverage) < 0.015


def simulated_rounds(speedups, rounds, load, sandwich, noise=0.02, seed=0):
    """Throughput per (cell, repeat) of a family run in `plan`'s order (sandwich) or the old rotation (plain
    once per round), each pass one time unit long on a machine whose speed at time t is load(t)."""
    rng = np.random.default_rng(seed)
    plain = cell()
    spec = [cell(f"d{i}", 3) for i in range(len(speedups))]
    true = {plain.cell_id: 1.0, **{c.cell_id: s for c, s in zip(spec, speedups)}}
    if sandwich:
        work = plan([plain, *spec], rounds)
    else:  # before the sandwich: the plain cell rotates with the others, once per round
        units = [plain, *spec]
        work = [(c, r) for r in range(rounds) for c in units[r % len(units):] + units[:r % len(units)]]
    measured, mid = {}, {}
    for t, (c, r) in enumerate(work):
        speed = np.mean([load(t + x) for x in np.linspace(0, 1, 21)])
        measured[(c.cell_id, r)] = 50 * true[c.cell_id] * speed * math.exp(rng.normal(0, noise))
        mid[(c.cell_id, r)] = t + 0.5
    out = {}
    for c, s in zip(spec, speedups):
        closing = [(plain.cell_id, rounds + r) for r in range(rounds)]
        out[s] = [RoundPair(r, measured[(c.cell_id, r)], measured[(plain.cell_id, r)],
                            plain_after=measured.get(closing[r]),
                            position=sandwich_position(mid[(c.cell_id, r)], mid[(plain.cell_id, r)], mid[closing[r]])
                            if closing[r] in mid else 0.5)
                  for r in range(rounds)]
    return out


def old_estimate(pairs) -> float:
    """The estimator before the sandwich: the geometric mean of per-round ratios over one plain pass."""
    return math.exp(np.mean([math.log(p.spec / p.plain) for p in pairs]))


@pytest.mark.parametrize("step_at", [3.5, 9.2, 20.5])
def test_a_step_change_in_load_leaves_the_median_over_the_sandwich_in_place(step_at):
    """Two CPU hogs start mid-run: the machine runs at 40% from then on. The round the step falls in has
    a broken pairing; the median over sandwiched rounds holds within 5% of every true speedup, while the
    old geometric mean over a single plain pass per round errs by more than 7% (4× as much) for some cell."""
    speedups = (1.5, 2.0, 2.5, 3.0)
    load = lambda t: 1.0 if t < step_at else 0.4  # noqa: E731
    new = simulated_rounds(speedups, 6, load, sandwich=True)
    old = simulated_rounds(speedups, 6, load, sandwich=False)
    for true, pairs in new.items():
        summary = paired_speedup(pairs, planned=6, drift_bound=10)
        assert summary.value == pytest.approx(true, rel=0.05), (true, summary.ratios)
    new_error = max(abs(paired_speedup(p, planned=6, drift_bound=10).value / s - 1) for s, p in new.items())
    old_error = max(abs(old_estimate(pairs) / true - 1) for true, pairs in old.items())
    assert old_error > 0.07 and old_error > 4 * new_error
    quiet = simulated_rounds(speedups, 6, lambda t: 1.0, sandwich=True)
    for true, pairs in quiet.items():  # and quietly both agree with the truth
        assert paired_speedup(pairs, planned=6).value == pytest.approx(true, rel=0.05)


def test_a_steady_drift_cancels_inside_the_sandwich_wherever_the_rotation_put_a_cell():
    """The machine slows 2% per pass: the baseline interpolated to each speculative pass's time takes the
    drift out of every round's ratio (spread < 1%), while a single plain pass per round leaves ratios
    that spread by the drift over the cells between them."""
    speedups = (1.5, 2.0, 2.5, 3.0)
    load = lambda t: 0.98 ** t  # noqa: E731
    new = simulated_rounds(speedups, 6, load, sandwich=True, noise=0.0)
    old = simulated_rounds(speedups, 6, load, sandwich=False, noise=0.0)
    for true, pairs in new.items():
        summary = paired_speedup(pairs, planned=6, drift_bound=10)
        assert max(summary.ratios) / min(summary.ratios) - 1 < 0.01 and summary.value == pytest.approx(true, rel=0.005)
    old_spread = max(max(r) / min(r) - 1 for r in ([p.spec / p.plain for p in pairs] for pairs in old.values()))
    assert old_spread > 0.05


def test_the_plain_baseline_drifting_inside_half_the_rounds_is_unstable():
    steady = [RoundPair(i, 200.0, 100.0, plain_after=103.0) for i in range(6)]
    assert paired_speedup(steady, planned=6).status == "ok"
    one = steady[:5] + [RoundPair(5, 200.0, 100.0, plain_after=150.0)]
    summary = paired_speedup(one, planned=6, drift_bound=10)
    assert summary.status == "ok" and summary.unsteady_rounds == (5,)  # outvoted by the median
    assert summary.value == pytest.approx(200 / math.sqrt(100 * 103))
    half = [RoundPair(i, 200.0, 100.0, plain_after=150.0 if i % 2 else 103.0) for i in range(6)]
    summary = paired_speedup(half, planned=6, drift_bound=10)
    assert summary.status == "unstable" and "inside 3 of 6 rounds" in summary.reason
    assert "UNSTABLE" in summary_lines([("cell", summary)])[1]
    # the across-round check stays: the baseline moved 92% between rounds
    drifted = [RoundPair(i, 200.0 * f, 100.0 * f, plain_after=100.0 * f) for i, f in enumerate([1, 0.52, 0.95, 0.55])]
    summary = paired_speedup(drifted, planned=4)
    assert summary.status == "unstable" and "92% between rounds" in summary.reason and summary.value == pytest.approx(2.0)


def test_an_invalid_or_missing_round_makes_the_cell_invalid_not_a_median():
    good = [RoundPair(i, 200.0, 100.0) for i in range(3)]
    bad = good[:2] + [RoundPair(2, 200.0, 100.0, ("every output is one token long",))]
    summary = paired_speedup(bad, planned=3)
    assert summary.status == "invalid" and "round 2: every output is one token long" in summary.reason
    missing = paired_speedup(good[:2], planned=3)
    assert missing.status == "invalid" and "round 2 not measured" in missing.reason
    assert paired_speedup(good, planned=3).status == "ok"
    # a sandwiched run whose closing plain pass of one round is missing: that round is invalid
    sandwiched = [RoundPair(i, 200.0, 100.0, plain_after=101.0) for i in range(2)] + [RoundPair(2, 200.0, 100.0)]
    summary = paired_speedup(sandwiched, planned=3)
    assert summary.status == "invalid" and "round 2: no closing plain pass" in summary.reason


def test_fewer_than_six_rounds_show_no_interval_but_their_range():
    summary = paired_speedup([RoundPair(i, 200.0 + i, 100.0) for i in range(4)], planned=4)
    assert summary.ci is None and summary.ci_coverage is None
    assert "no 95% interval below 6 rounds; range 2.00–2.03" in summary.shown()


def write_suite(tmp_path: Path, repeats: int, gate: str) -> Path:
    text = (REPO / "suites" / "ci.yaml").read_text(encoding="utf-8")
    text = text.replace("repeats: 4,", f"repeats: {repeats},")  # ci.yaml runs 4 rounds
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("  throughput:"))
    text = text.replace("  speedup: {direction: higher, test: paired_rounds, relative: 0.3, min_samples: 3, level: warn}",
                        f"  speedup: {gate}")
    (tmp_path / "common.yaml").write_text((REPO / "suites" / "common.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("repeats, gate, needs", [
    (3, "{direction: higher, test: mann_whitney, relative: 0.3, min_samples: 3}", 4),
    (3, "{direction: higher, test: paired_rounds, relative: 0.3, min_samples: 2}", 4),
    (4, "{direction: higher, test: mann_whitney, relative: 0.3, min_samples: 3, alpha: 0.01}", 5),
])
def test_a_gate_that_cannot_fire_with_the_suites_rounds_is_refused_at_load(tmp_path, repeats, gate, needs):
    path = write_suite(tmp_path, repeats, gate)
    with pytest.raises(RunError) as err:
        load_cells(path, check_files=False)
    message = str(err.value)
    assert "\n" not in message and "gate speedup" in message and f"needs repeats >= {needs}" in message


def test_gates_that_can_fire_load(tmp_path):
    load_cells(write_suite(tmp_path, 4, "{direction: higher, test: paired_rounds, relative: 0.3, min_samples: 2}"),
               check_files=False)
    for name in ("ci.yaml", "cpu.yaml", "h100.yaml"):
        load_cells(REPO / "suites" / name, check_files=False)


def test_the_cli_refuses_such_a_suite_with_exit_2(tmp_path, capsys):
    from harness.cli import main

    path = write_suite(tmp_path, 3, "{direction: higher, test: mann_whitney, relative: 0.3, min_samples: 3}")
    assert main(["run", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gate speedup (mann_whitney" in err[0] and "needs repeats >= 4" in err[0]
