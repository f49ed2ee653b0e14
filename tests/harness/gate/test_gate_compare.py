"""compare_runs side by side, and the data layer's window rule and comparability diffs."""

from __future__ import annotations

import pytest

from gate_tables import DSPARK, PLAIN, SynthCell, SynthRun, add_run, copy_run, new_store
from harness.gate import compare_runs, compare_table
from harness.gate import data
from harness.gate.comparability import explain_difference


@pytest.fixture
def store():
    conn = new_store()
    add_run(conn, SynthRun("a"))
    copy_run(conn, "a", "b")
    conn.execute("UPDATE metrics SET value = value * 1.1 WHERE run_id = 'b' AND metric = 'throughput'")
    return conn


def test_compare_rows(store):
    rows = compare_runs(store, "a", "b", metrics=["throughput"])
    assert [r.label for r in rows] == sorted([DSPARK.label, PLAIN.label])
    assert all(r.metric == "throughput" for r in rows)
    assert all(r.change == pytest.approx(0.1) for r in rows)
    table = compare_table(rows)
    assert table.splitlines()[0].split()[:6] == ["cell", "metric", "better", "a", "b", "change"]
    assert "+10.0%" in table and "↑ higher" in table


def test_compare_judges_direction_with_the_gates_interval():
    """Halved throughput over 4 repeats each is a significant change for the worse (Mann-Whitney, its
    Hodges-Lehmann interval excludes 0) and sorts first; τ, equal in both runs, is noise (bootstrap over
    prompts); window_s has no better direction."""
    from harness.gate.compare import important

    conn = new_store()
    add_run(conn, SynthRun("a", repeats=4))
    copy_run(conn, "a", "b")
    conn.execute("UPDATE metrics SET value = value * 0.5 WHERE run_id = 'b' AND metric = 'throughput'")
    rows = compare_runs(conn, "a", "b")
    by = {(r.label, r.metric): r for r in rows}
    thr, tau = by[(DSPARK.label, "throughput")], by[(DSPARK.label, "acceptance_length")]
    assert thr.direction == "higher" and thr.method == "mann_whitney" and thr.n == 4
    assert thr.ci is not None and thr.ci[1] < 0 and thr.verdict == "worse"
    assert tau.method == "paired_bootstrap" and tau.verdict == "noise" and tau.effect == pytest.approx(0)
    assert by[(DSPARK.label, "window_s")].direction is None
    assert rows[0].verdict == "worse" and {r.verdict for r in rows[:2]} == {"worse"}
    assert important(rows, limit=2) == rows[:2]
    text = compare_table(rows[:1])
    assert "−50.0%" in text and "worse" in text and "Mann-Whitney, 4 repeats" in text


def test_compare_keeps_one_sided_rows(store):
    store.execute("DELETE FROM metrics WHERE run_id = 'b' AND metric = 'window_s'")
    rows = [r for r in compare_runs(store, "a", "b") if r.metric == "window_s"]
    assert rows and all(r.b is None and r.change is None and r.a == 100 for r in rows)


def test_window_rule_and_conversations(store):
    steps = data.prompt_steps(store, "a")[DSPARK.cell_id]
    assert len(steps.prompt_keys) == 50  # the warm-up request finished before the window
    assert steps.steps.sum() == 50 * 20
    counts = data.request_counts(store, "a")[(DSPARK.cell_id, 0)]
    assert (counts.succeeded, counts.failed) == (50, 0)
    cycles = data.confidence_cycles(store, "a", DSPARK.cell_id)
    assert cycles.logits.shape == (50 * 20, 7)
    assert data.confidence_cycles(store, "a", PLAIN.cell_id) is None


def test_params_difference_is_named():
    conn = new_store()
    base = SynthCell()
    add_run(conn, SynthRun("a", cells=[base]))
    run = data.run_info(conn, "a")
    cell = data.cells(conn, "a")[base.cell_id]
    changed = data.CellInfo(**{**cell.__dict__, "params": {**cell.params, "task": {"name": "gsm8k",
                                                                                    "max_new_tokens": 512}}})
    assert explain_difference(run, changed, run, cell) == ["param task.max_new_tokens: 256 → 512"]
