"""Per-round validity (`v_rounds`) and the paired speedup summary (`v_speedup_summary`) on a real store:
the SQL agrees with harness.metrics.speedup — the plain sandwich, its interpolated baseline, the median
and its sign interval, both drift checks — and a bad round makes its cell invalid in the summary and the
gate."""

from __future__ import annotations

import datetime as dt

import pytest

from harness.gate import GateRule, Validity, run_gate
from harness.metrics.speedup import MIN_DRAFTING_STEPS_TO_JUDGE
from harness.runner import paired_speedups
from harness.store import Store
from store_fixtures import make_cell, make_result, run_info

T0 = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)
PLAIN, SPEC, OTHER = make_cell("none"), make_cell("dspark", 4), make_cell("dflash", 3)


def recorded(rounds: int = 3, sandwich: bool = True, throughput=None) -> tuple[Store, str]:
    """A run in the runner's order — per round the plain pass, the two speculative cells rotating, the
    closing plain pass (repeat rounds + r) when `sandwich` — each cell 10 s long; `throughput(cell, repeat)`
    replaces the recorded throughput."""
    store = Store.open(":memory:")
    run_id = store.begin_run(run_info(repeats=rounds))
    clock = 0
    for r in range(rounds):
        plain = make_result(seed=10 + r, gamma=0, confidences=False, num_steps=6)
        spec = [(SPEC, make_result(seed=20 + r, gamma=4, plain=plain, num_steps=6)),
                (OTHER, make_result(seed=30 + r, gamma=3, plain=plain, num_steps=6))]
        order = [(PLAIN, plain, r)] + [(c, res, r) for c, res in (spec if r % 2 == 0 else spec[::-1])]
        if sandwich:
            order.append((PLAIN, make_result(seed=40 + r, gamma=0, confidences=False, num_steps=6), rounds + r))
        for slot, (cell, result, repeat) in enumerate(order):
            start = T0 + dt.timedelta(seconds=10 * clock)
            store.record_cell(run_id, cell, repeat, result=result, error=None, started_at=start,
                              finished_at=start + dt.timedelta(seconds=9), comparability_key="k", round_slot=slot)
            clock += 1
    if throughput is not None:
        _, rows = store.query("SELECT cell_id, repeat FROM cells WHERE run_id = ?", [run_id])
        for cell_id, repeat in rows:
            store.con.execute("UPDATE metrics SET value = ? WHERE run_id = ? AND cell_id = ? AND repeat = ? "
                              "AND metric = 'throughput'", [throughput(cell_id, repeat), run_id, cell_id, repeat])
    store.finish_run(run_id)
    return store, run_id


def summary_rows(store, run_id):
    columns, rows = store.query("SELECT * FROM v_speedup_summary WHERE run_id = ? ORDER BY label", [run_id])
    return {row[columns.index("cell_id")]: dict(zip(columns, row)) for row in rows}


def assert_view_equals_python(store, run_id, rounds):
    rows = summary_rows(store, run_id)
    python = dict(paired_speedups(store, run_id))
    assert set(rows) == {SPEC.cell_id, OTHER.cell_id}
    for cell in (SPEC, OTHER):
        row, summary = rows[cell.cell_id], python[cell.label()]
        assert row["rounds"] == len(summary.ratios) == rounds
        assert row["speedup"] == pytest.approx(summary.value)
        assert (row["ci_low"], row["ci_high"]) == (pytest.approx(summary.ci) if summary.ci else (None, None))
        assert row["ci_coverage"] == (pytest.approx(summary.ci_coverage) if summary.ci else None)
        assert row["plain_drift"] == pytest.approx(summary.baseline_drift)
        assert row["sandwich_drift"] == (pytest.approx(summary.sandwich_drift) if summary.sandwich_drift is not None else None)
        assert row["unsteady_rounds"] == len(summary.unsteady_rounds)
        assert row["status"] == summary.status
    return rows, python


@pytest.mark.parametrize("rounds, sandwich", [(3, True), (7, True), (7, False)])
def test_the_summary_view_equals_the_python_summary(rounds, sandwich):
    store, run_id = recorded(rounds, sandwich)
    rows, python = assert_view_equals_python(store, run_id, rounds)
    assert (rows[SPEC.cell_id]["ci_low"] is not None) == (rounds >= 6)
    _, slots = store.query("SELECT repeat, round_slot FROM v_rounds WHERE cell_id = ? ORDER BY repeat", [PLAIN.cell_id])
    assert slots == [(r, 0) for r in range(rounds)] + ([(rounds + r, 3) for r in range(rounds)] if sandwich else [])
    _, problems = store.query("SELECT count(*) FROM v_rounds WHERE problems IS NOT NULL")
    assert problems == [(0,)]


def test_each_round_divides_by_the_plain_speed_interpolated_to_the_speculative_pass():
    """Plain passes at 100 and 150 tokens/s, 30 s apart (midpoints); a speculative pass 10 s after the
    opening one divides by 100^(2/3) · 150^(1/3), one 20 s after by 100^(1/3) · 150^(2/3)."""
    speeds = {PLAIN.cell_id: 100.0, SPEC.cell_id: 240.0, OTHER.cell_id: 300.0}

    def throughput(cell_id, repeat):
        return 150.0 if repeat >= 2 else speeds[cell_id]

    store, run_id = recorded(2, throughput=throughput)
    _, rows = store.query("SELECT cell_id, repeat, sandwich_position, plain_throughput, speedup, sandwich_drift "
                          "FROM v_speedup WHERE run_id = ? ORDER BY repeat, sandwich_position", [run_id])
    first, second = 100 ** (2 / 3) * 150 ** (1 / 3), 100 ** (1 / 3) * 150 ** (2 / 3)
    assert [(r[1], r[2]) for r in rows] == [(0, pytest.approx(1 / 3)), (0, pytest.approx(2 / 3)),
                                            (1, pytest.approx(1 / 3)), (1, pytest.approx(2 / 3))]
    assert [r[3] for r in rows] == pytest.approx([first, second, first, second])
    assert rows[0][4] == pytest.approx(speeds[rows[0][0]] / first)
    assert all(r[5] == pytest.approx(0.5) for r in rows)
    rows, python = assert_view_equals_python(store, run_id, 2)
    assert rows[SPEC.cell_id]["status"] == "unstable"  # 50% inside every round


def test_a_missing_or_failed_closing_pass_makes_its_round_invalid():
    store, run_id = recorded(3)
    store.con.execute("DELETE FROM cells WHERE cell_id = ? AND repeat = 4", [PLAIN.cell_id])  # round 1's
    rows = summary_rows(store, run_id)
    assert all(rows[c.cell_id]["status"] == "invalid" and rows[c.cell_id]["rounds"] == 2 for c in (SPEC, OTHER))
    summary = dict(paired_speedups(store, run_id))[SPEC.label()]
    assert summary.status == "invalid" and "round 1: no closing plain pass" in summary.reason
    store, run_id = recorded(3)
    store.con.execute("UPDATE requests SET output_tokens = 1 WHERE cell_id = ? AND repeat = 5", [PLAIN.cell_id])
    assert summary_rows(store, run_id)[SPEC.cell_id]["status"] == "invalid"
    summary = dict(paired_speedups(store, run_id))[SPEC.label()]
    assert "round 2: closing plain pass: every output is one token long" in summary.reason


def test_plain_passes_apart_inside_half_the_rounds_are_unstable_in_sql_and_python():
    def throughput(cell_id, repeat):
        base = {PLAIN.cell_id: 100.0, SPEC.cell_id: 200.0, OTHER.cell_id: 250.0}[cell_id]
        return base * (1.15 if repeat in (6, 8) else 1.0)  # the closing passes of rounds 0 and 2 of 6

    store, run_id = recorded(6, throughput=throughput)
    rows, _ = assert_view_equals_python(store, run_id, 6)
    assert rows[SPEC.cell_id]["status"] == "ok" and rows[SPEC.cell_id]["unsteady_rounds"] == 2
    store, run_id = recorded(6, throughput=lambda c, r: throughput(c, r) * (1.15 if r in (7, 9, 11) else 1.0))
    rows, python = assert_view_equals_python(store, run_id, 6)
    assert rows[SPEC.cell_id]["status"] == "unstable" and "inside 5 of 6 rounds" in python[SPEC.label()].reason


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


def test_nothing_accepted_is_judged_only_over_enough_drafting_steps():
    """A round that drafted a few steps and accepted none is no evidence of a broken drafter (a cost-aware
    policy explores a few steps where drafting does not pay); the same over every round, once their steps
    together are enough, is."""
    store, run_id = recorded()
    keep = MIN_DRAFTING_STEPS_TO_JUDGE - 1  # round 1 keeps this many drafting steps, none accepted
    store.con.execute("""
        UPDATE request_steps SET num_verified = 0, num_accepted = 0 WHERE cell_id = $cell AND repeat = 1
          AND (request_id, step) NOT IN (SELECT request_id, step FROM request_steps
                                         WHERE cell_id = $cell AND repeat = 1 AND num_verified > 0
                                         ORDER BY request_id, step LIMIT $keep)""", {"cell": SPEC.cell_id, "keep": keep})
    store.con.execute("UPDATE request_steps SET num_accepted = 0 WHERE cell_id = ? AND repeat = 1", [SPEC.cell_id])
    _, rows = store.query("SELECT drafting_steps, acceptance_length FROM v_acceptance WHERE cell_id = ? AND repeat = 1",
                          [SPEC.cell_id])
    assert 0 < rows[0][0] < MIN_DRAFTING_STEPS_TO_JUDGE and rows[0][1] == 1.0  # (steps in the window only)
    _, rows = store.query("SELECT problems FROM v_rounds WHERE cell_id = ?", [SPEC.cell_id])
    assert all(r[0] is None for r in rows)
    assert summary_rows(store, run_id)[SPEC.cell_id]["status"] != "invalid"
    # Nothing accepted in any round: the rounds' steps together judge every round.
    store.con.execute("UPDATE request_steps SET num_accepted = 0 WHERE cell_id = ?", [SPEC.cell_id])
    _, rows = store.query("SELECT problems FROM v_rounds WHERE cell_id = ? ORDER BY repeat", [SPEC.cell_id])
    assert [r[0] is not None for r in rows] == [True, True, True]
    assert "≈ 1 with drafts verified" in rows[0][0] and "≈ 1 over every round" in rows[1][0]
    assert summary_rows(store, run_id)[SPEC.cell_id]["status"] == "invalid"


def test_a_missing_round_is_invalid_and_a_drifting_baseline_unstable():
    store, run_id = recorded()
    store.con.execute("DELETE FROM cells WHERE cell_id = ? AND repeat = 2", [OTHER.cell_id])
    store.con.execute("UPDATE metrics SET value = value * 3 WHERE metric = 'throughput' AND repeat = 1")
    rows = summary_rows(store, run_id)
    assert rows[OTHER.cell_id]["status"] == "invalid" and rows[OTHER.cell_id]["rounds"] == 2
    assert rows[SPEC.cell_id]["status"] == "unstable" and rows[SPEC.cell_id]["plain_drift"] > 1.5
    python = dict(paired_speedups(store, run_id))
    assert python[SPEC.label()].status == "unstable" and "round 2 not measured" in python[OTHER.label()].reason
