"""The SQL views reproduce harness.metrics value for value on the same records."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from harness.metrics import (
    acceptance_length,
    accepted_per_step,
    budget_cut_tokens,
    draft_acceptance_rate,
    draft_coverage,
    position_acceptance_conditional,
    position_acceptance_unconditional,
    requests_in,
    succeeded,
    summarise,
    tokens_per_target_forward,
    verified_per_step,
    wasted_verification_fraction,
)
from harness.store import Store
from store_fixtures import make_cell, make_result, run_info

T0 = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def recorded():
    """One run, two repeats of: plain decoding, a γ=4 and a γ=3 drafter; plus a failed cell and another
    load whose plain cell is missing."""
    store = Store.open(":memory:")
    run_id = store.begin_run(run_info(repeats=2))
    cells = {}
    for repeat in (0, 1):
        plain = make_result(seed=10 + repeat, gamma=0, confidences=False)
        spec4 = make_result(seed=20 + repeat, gamma=4, plain=plain)
        spec3 = make_result(seed=30 + repeat, gamma=3, confidences=False, plain=plain)
        lone = make_result(seed=40 + repeat, gamma=4)
        mixed = drafting_steps_only_and_cut(make_result(seed=50 + repeat, gamma=3, confidences=False), plain)
        for cell, result in ((make_cell("none"), plain), (make_cell("dspark", 4), spec4),
                             (make_cell("dflash", 3), spec3), (make_cell("dspark", 4, concurrency=8), lone),
                             (make_cell("ngram", 3), mixed)):
            store.record_cell(run_id, cell, repeat, result=result, error=None, started_at=T0, finished_at=T0,
                              comparability_key="k")
            cells[(cell.cell_id, repeat)] = (cell, result)
        store.record_cell(run_id, make_cell("eagle3", 4), repeat, result=None, error="boom", started_at=T0,
                          finished_at=T0, comparability_key="k")
    yield store, run_id, cells
    store.close()


def drafting_steps_only_and_cut(result, plain):
    """The result as a vLLM-like backend would report half its requests (drafting steps only,
    `all_steps` false), and every third request's last step cut by 1 token at the budget."""
    requests = []
    for i, rr in enumerate(result.requests):
        rec = rr.record
        if i % 2:
            steps = [(v, a) for v, a in zip(rec.num_verified, rec.num_accepted) if v > 0]
            rec = dataclasses.replace(rec, num_verified=tuple(v for v, _ in steps),
                                      num_accepted=tuple(a for _, a in steps), confidence_logits=(), all_steps=False)
        elif i % 3 == 0 and rec.output_tokens > 1 and not rec.failed:
            rec = dataclasses.replace(rec, output_tokens=rec.output_tokens - 1, token_times_s=rec.token_times_s[:-1])
        requests.append(dataclasses.replace(rr, record=rec, output_ids=rr.output_ids[: rec.output_tokens]))
    records = [r.record for r in requests]
    return dataclasses.replace(result, requests=requests, metrics=summarise(records, result.steps, result.window, plain=plain.metrics))


def ok_records(result):
    return succeeded(requests_in([r.record for r in result.requests], result.window))


def test_v_acceptance_equals_the_python_metrics(recorded):
    store, run_id, cells = recorded
    columns, rows = store.query("SELECT * FROM v_acceptance WHERE run_id = ?", [run_id])
    by_key = {(r[1], r[2]): dict(zip(columns, r)) for r in rows}
    assert len(by_key) == len(cells) + 2  # the failed cell's two repeats are rows too, with no steps
    for key, (_, result) in cells.items():
        row, ok = by_key[key], ok_records(result)
        assert row["requests"] == len(ok)
        assert row["steps"] == sum(r.num_steps for r in ok)
        assert row["drafting_steps"] == sum(r.num_drafting_steps for r in ok)
        assert row["acceptance_length"] == acceptance_length(ok).value  # τ = 1 + accepted / drafting steps
        assert row["accepted_per_step"] == accepted_per_step(ok).value
        assert row["verified_per_step"] == verified_per_step(ok).value
        assert row["draft_acceptance_rate"] == draft_acceptance_rate(ok).value
        assert row["wasted_verification_fraction"] == wasted_verification_fraction(ok).value
        assert row["draft_coverage"] == draft_coverage(ok).value
        assert row["tokens_per_target_forward"] == tokens_per_target_forward(ok).value
        assert (row["budget_cut_tokens"] or 0) == budget_cut_tokens(ok).value
        assert row["acceptance_length"] == result.metrics.value("acceptance_length")
        if row["drafting_steps"]:
            assert row["acceptance_length"] == pytest.approx(row["accepted_per_step"] + 1)
    ngram = [by_key[(c.cell_id, rep)] for (c, _), (_, rep) in zip(cells.values(), cells) if c.drafter.method == "ngram"]
    assert ngram and all(r["budget_cut_tokens"] > 0 and r["steps"] > r["drafting_steps"] for r in ngram)
    plain = [by_key[k] for k, (c, _) in cells.items() if c.drafter.method == "none"]
    assert all(r["steps"] > 0 and r["drafting_steps"] == 0 and r["acceptance_length"] is None
               and r["draft_coverage"] == 0.0 and r["tokens_per_target_forward"] == 1.0 for r in plain)
    failed = [r for r in by_key.values() if r["status"] == "failed"]
    assert len(failed) == 2 and all(r["steps"] == 0 and r["acceptance_length"] is None for r in failed)


def test_v_positions_equals_both_python_forms(recorded):
    store, run_id, cells = recorded
    columns, rows = store.query("SELECT * FROM v_positions WHERE run_id = ? ORDER BY cell_id, repeat, position", [run_id])
    got: dict = {}
    for r in rows:
        row = dict(zip(columns, r))
        got.setdefault((row["cell_id"], row["repeat"]), []).append(row)
    for key, (_, result) in cells.items():
        ok = ok_records(result)
        unconditional = [m.value for m in position_acceptance_unconditional(ok)]
        conditional = [m.value for m in position_acceptance_conditional(ok)]
        rows = got.get(key, [])
        assert [r["position"] for r in rows] == list(range(1, len(unconditional) + 1))
        assert [r["unconditional"] for r in rows] == unconditional
        assert [r["conditional"] for r in rows] == conditional
        assert [r["verified_k"] for r in rows] == [m.n for m in position_acceptance_unconditional(ok)]
        assert [r["reached_k"] for r in rows] == [m.n for m in position_acceptance_conditional(ok)]
        for k, value in enumerate(unconditional, start=1):
            assert result.metrics.value(f"position_acceptance_unconditional_k{k}") == value
    assert any(len(v) == 4 for v in got.values()) and any(len(v) == 3 for v in got.values())


def test_v_speedup_pairs_each_speculative_cell_with_plain_decoding_of_its_run_and_repeat(recorded):
    store, run_id, cells = recorded
    columns, rows = store.query("SELECT * FROM v_speedup WHERE run_id = ?", [run_id])
    by_key = {(r[columns.index("cell_id")], r[columns.index("repeat")]): dict(zip(columns, r)) for r in rows}
    speculative = {k: v for k, v in cells.items() if not v[0].is_plain and v[0].concurrency == 4}
    assert set(by_key) == set(speculative)  # the c8 cell has no plain twin, the failed cell no result
    for key, (cell, result) in speculative.items():
        row = by_key[key]
        plain_cell, plain = cells[(row["plain_cell_id"], key[1])]
        assert plain_cell.is_plain
        assert row["speedup"] == result.metrics.value("speedup")  # what summarise(plain=…) computed
        assert row["speedup_user_speed"] == result.metrics.value("speedup_user_speed")
        assert row["speedup_user_speed_p50"] == result.metrics.value("user_speed_p50") / plain.metrics.value("user_speed_p50")
        assert row["label"] == cell.label() and row["method"] == cell.drafter.method


def test_v_metrics_v_cells_v_runs_and_v_calibration(recorded):
    store, run_id, cells = recorded
    columns, rows = store.query("SELECT * FROM v_metrics WHERE run_id = ? AND metric = 'throughput'", [run_id])
    assert columns[:21] == ["run_id", "started_at", "git_branch", "git_sha", "cell_id", "repeat", "label", "backend",
                            "target", "drafter", "method", "num_drafts", "task", "temperature", "concurrency", "rate",
                            "policy", "metric", "value", "unit", "n"]
    for r in rows:
        row = dict(zip(columns, r))
        assert row["value"] == cells[(row["cell_id"], row["repeat"])][1].metrics.value("throughput")
        assert row["git_branch"] == "main" and row["unit"] == "tokens/s"
    assert len(rows) == len(cells)

    columns, rows = store.query("SELECT * FROM v_cells WHERE run_id = ?", [run_id])
    assert "log" not in columns and {"git_branch", "git_sha", "run_started_at", "duration_s"} <= set(columns)
    assert len(rows) == len(cells) + 2

    (row,) = store.query("SELECT cells_ok, cells_failed, status FROM v_runs WHERE run_id = ?", [run_id])[1]
    assert row == (len(cells), 2, "running")

    columns, rows = store.query("SELECT * FROM v_calibration WHERE run_id = ?", [run_id])
    bins = [b for (cell, result) in cells.values() for b in result.calibration_bins]
    assert len(rows) == len(bins)
    for r in rows:
        row = dict(zip(columns, r))
        assert row["accuracy"] == row["outcome_sum"] / row["count"]
        assert row["mean_confidence"] == row["confidence_sum"] / row["count"]


def test_views_over_ok_rows_apply_the_window_rule(recorded):
    store, run_id, cells = recorded
    (cell_id, repeat), (cell, result) = next(iter(cells.items()))
    (n,) = store.query("SELECT count(*) FROM v_ok_requests WHERE run_id = ? AND cell_id = ? AND repeat = ?",
                       [run_id, cell_id, repeat])[1][0]
    assert n == len(ok_records(result)) < len(result.requests)
    (n,) = store.query("SELECT count(*) FROM v_ok_engine_steps WHERE run_id = ? AND cell_id = ? AND repeat = ?",
                       [run_id, cell_id, repeat])[1][0]
    assert n == sum(result.window.contains(s.t_s) for s in result.steps)
