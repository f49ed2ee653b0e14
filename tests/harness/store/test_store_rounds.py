"""Per-round validity (`v_rounds`) and the paired speedup summary (`v_speedup_summary`) on a real store:
the SQL agrees with harness.metrics.speedup, and a bad round makes its cell invalid in the summary and
the gate."""

from __future__ import annotations

import datetime as dt

import pytest

from harness.gate import GateRule, Validity, run_gate
from harness.runner import paired_speedups
from harness.store import Store
from store_fixtures import make_cell, make_result, run_info

T0 = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)
PLAIN, SPEC, OTHER = make_cell("none"), make_cell("dspark", 4), make_cell("dflash", 3)


def recorded(rounds: int = 3) -> tuple[Store, str]:
    store = Store.open(":memory:")
    run_id = store.begin_run(run_info(repeats=rounds))
    for r in range(rounds):
        plain = make_result(seed=10 + r, gamma=0, confidences=False, num_steps=6)
        for slot, (cell, result) in enumerate(((PLAIN, plain), (SPEC, make_result(seed=20 + r, gamma=4, plain=plain, num_steps=6)),
                                               (OTHER, make_result(seed=30 + r, gamma=3, plain=plain, num_steps=6)))):
            store.record_cell(run_id, cell, r, result=result, error=None, started_at=T0, finished_at=T0,
                              comparability_key="k", round_slot=(slot + r) % 3)
    store.finish_run(run_id)
    return store, run_id


def summary_rows(store, run_id):
    columns, rows = store.query("SELECT * FROM v_speedup_summary WHERE run_id = ? ORDER BY label", [run_id])
    return {row[columns.index("cell_id")]: dict(zip(columns, row)) for row in rows}


def test_the_summary_view_equals_the_python_summary():
    store, run_id = recorded()
    rows = summary_rows(store, run_id)
    python = dict(paired_speedups(store, run_id))
    assert set(rows) == {SPEC.cell_id, OTHER.cell_id}
    for cell in (SPEC, OTHER):
        row, summary = rows[cell.cell_id], python[cell.label()]
        assert row["rounds"] == len(summary.ratios) == 3
        assert row["speedup"] == pytest.approx(summary.value)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx(summary.ci)
        assert row["plain_drift"] == pytest.approx(summary.baseline_drift)
        assert row["status"] == summary.status
    _, slots = store.query("SELECT repeat, round_slot FROM v_rounds WHERE cell_id = ? ORDER BY repeat", [PLAIN.cell_id])
    assert slots == [(0, 0), (1, 1), (2, 2)]
    _, problems = store.query("SELECT count(*) FROM v_rounds WHERE problems IS NOT NULL")
    assert problems == [(0,)]


@pytest.mark.parametrize("doctor, why", [
    ("UPDATE requests SET output_tokens = 1 WHERE cell_id = '{cell}' AND repeat = 1", "every output is one token long"),
    ("UPDATE request_steps SET num_accepted = 0 WHERE cell_id = '{cell}' AND repeat = 1", "≈ 1 with drafts verified"),
    ("DELETE FROM requests WHERE cell_id = '{cell}' AND repeat = 1 AND request_id IN ('q005', 'q006')", "truncated"),
])
def test_a_bad_round_makes_the_cell_invalid_in_the_summary_and_the_gate(doctor, why):
    store, run_id = recorded()
    base_store, base_id = recorded()
    store.con.execute(doctor.format(cell=SPEC.cell_id))
    _, rows = store.query("SELECT repeat, problems FROM v_rounds WHERE cell_id = ? AND problems IS NOT NULL", [SPEC.cell_id])
    assert len(rows) == 1 and rows[0][0] == 1 and why in rows[0][1]
    assert summary_rows(store, run_id)[SPEC.cell_id]["status"] == "invalid"
    assert summary_rows(store, run_id)[OTHER.cell_id]["status"] != "invalid"
    summary = dict(paired_speedups(store, run_id))[SPEC.label()]
    assert summary.status == "invalid" and "round 1" in summary.reason and why in summary.reason
    rules = [GateRule("speedup", "higher", test="paired_rounds", min_samples=2),
             GateRule("acceptance_length", "higher", min_samples=2)]
    report = run_gate((store.con, run_id), (base_store.con, base_id), rules, Validity(max_failed_fraction=0.2))
    flagged = [c for c in report.comparisons if c.cell_id == SPEC.cell_id]
    assert flagged and all(c.verdict == "invalid" and "round 1" in c.reason for c in flagged)
    assert all(c.verdict != "invalid" for c in report.comparisons if c.cell_id != SPEC.cell_id)


def test_a_missing_round_is_invalid_and_a_drifting_baseline_unstable():
    store, run_id = recorded()
    store.con.execute("DELETE FROM cells WHERE cell_id = ? AND repeat = 2", [OTHER.cell_id])
    store.con.execute("UPDATE metrics SET value = value * 3 WHERE metric = 'throughput' AND repeat = 1")
    rows = summary_rows(store, run_id)
    assert rows[OTHER.cell_id]["status"] == "invalid" and rows[OTHER.cell_id]["rounds"] == 2
    assert rows[SPEC.cell_id]["status"] == "unstable" and rows[SPEC.cell_id]["plain_drift"] > 1.5
    python = dict(paired_speedups(store, run_id))
    assert python[SPEC.label()].status == "unstable" and "round 2 not measured" in python[OTHER.label()].reason
