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
    assert table.splitlines()[0].split() == ["cell", "metric", "a", "b", "change"]
    assert "+10.0%" in table


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
