"""Interleaved rounds: the plan's order, the paired speedup summary and the gates a suite can fire."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from harness.metrics.speedup import RoundPair, paired_speedup, summary_lines
from harness.runner import RunError, families, load_cells, plan, round_slots

REPO = Path(__file__).resolve().parents[2]


def cell(drafter: str = "none", gamma: int = 0, concurrency: int = 1, backend: str = "inhouse", task: str = "gsm8k") -> Cell:
    method = "none" if drafter == "none" else "dspark"
    return Cell(backend, TargetSpec("t", "embedded"), DrafterSpec(drafter, method), gamma,
                TaskSpec(task, 4, 16), PolicySpec("full"), concurrency=concurrency)


def test_each_round_measures_every_cell_of_a_family_back_to_back_in_a_rotating_order():
    plain, a, b = cell(), cell("a", 3), cell("b", 3)
    other = [cell(concurrency=4), cell("a", 3, concurrency=4)]
    work = plan([plain, a, other[0], b, other[1]], 3)
    rounds = [[c.drafter.name + str(c.concurrency) for c, r in work if r == k] for k in range(3)]
    assert rounds == [["none1", "a1", "b1", "none4", "a4"],
                      ["a1", "b1", "none1", "a4", "none4"],
                      ["b1", "none1", "a1", "none4", "a4"]]
    # every cell once per round, and the plain cell is first, middle and last once each
    assert sorted((c.cell_id, r) for c, r in work) == sorted((c.cell_id, r) for c in [plain, a, b, *other] for r in range(3))
    slots = round_slots(work)
    assert [slots[(plain.cell_id, r)] for r in range(3)] == [0, 2, 1]


def test_server_configs_are_the_units_and_all_their_load_points_run_while_the_server_is_up():
    cells = [cell(backend="vllm", concurrency=c) for c in (1, 4)] + \
            [cell("a", 3, backend="vllm", concurrency=c) for c in (1, 4)]
    key = {c.cell_id: f"server-{c.drafter.name}" for c in cells}
    groups = families(cells, key)
    assert len(groups) == 1 and [[c.concurrency for c in unit] for unit in groups[0]] == [[1, 4], [1, 4]]
    work = plan(cells, 2, key)
    order = [(c.drafter.name, c.concurrency, r) for c, r in work]
    assert order == [("none", 1, 0), ("none", 4, 0), ("a", 1, 0), ("a", 4, 0),
                     ("a", 1, 1), ("a", 4, 1), ("none", 1, 1), ("none", 4, 1)]


def test_paired_speedup_is_the_geometric_mean_of_round_ratios_with_a_t_interval():
    from scipy import stats

    spec, plain = [300.0, 150.0, 290.0, 160.0], [100.0, 52.0, 95.0, 55.0]
    rounds = [RoundPair(i, s, p) for i, (s, p) in enumerate(zip(spec, plain))]
    summary = paired_speedup(rounds, planned=4, drift_bound=1.0)
    logs = np.log(np.array(spec) / np.array(plain))
    assert summary.value == pytest.approx(math.exp(logs.mean()))
    low, high = stats.t.interval(0.95, 3, loc=logs.mean(), scale=stats.sem(logs))
    assert summary.ci == pytest.approx((math.exp(low), math.exp(high)))
    assert summary.status == "ok" and summary.baseline_drift == pytest.approx(100 / 52 - 1)
    # the plain baseline moved 92% between rounds: the ratios are shown, flagged, never judged
    drifted = paired_speedup(rounds, planned=4)
    assert drifted.status == "unstable" and "92%" in drifted.reason and drifted.value == summary.value
    assert "UNSTABLE" in summary_lines([("cell", drifted)])[1]


def test_an_invalid_or_missing_round_makes_the_cell_invalid_not_a_median():
    good = [RoundPair(i, 200.0, 100.0) for i in range(3)]
    bad = good[:2] + [RoundPair(2, 200.0, 100.0, ("every output is one token long",))]
    summary = paired_speedup(bad, planned=3)
    assert summary.status == "invalid" and "round 2: every output is one token long" in summary.reason
    missing = paired_speedup(good[:2], planned=3)
    assert missing.status == "invalid" and "round 2 not measured" in missing.reason
    assert paired_speedup(good, planned=3).status == "ok"


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
    (1, "{direction: higher, test: paired_rounds, relative: 0.3, min_samples: 2}", 2),
    (4, "{direction: higher, test: mann_whitney, relative: 0.3, min_samples: 3, alpha: 0.01}", 5),
])
def test_a_gate_that_cannot_fire_with_the_suites_rounds_is_refused_at_load(tmp_path, repeats, gate, needs):
    path = write_suite(tmp_path, repeats, gate)
    with pytest.raises(RunError) as err:
        load_cells(path, check_files=False)
    message = str(err.value)
    assert "\n" not in message and "gate speedup" in message and f"needs repeats >= {needs}" in message


def test_gates_that_can_fire_load(tmp_path):
    load_cells(write_suite(tmp_path, 2, "{direction: higher, test: paired_rounds, relative: 0.3, min_samples: 2}"),
               check_files=False)
    for name in ("ci.yaml", "cpu.yaml", "h100.yaml"):
        load_cells(REPO / "suites" / name, check_files=False)


def test_the_cli_refuses_such_a_suite_with_exit_2(tmp_path, capsys):
    from harness.cli import main

    path = write_suite(tmp_path, 3, "{direction: higher, test: mann_whitney, relative: 0.3, min_samples: 3}")
    assert main(["run", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gate speedup (mann_whitney" in err[0] and "needs repeats >= 4" in err[0]
