"""`python -m harness.crossengine` on hand-built runs: pairs by everything but the backend, passes equal
outputs and τ, fails a differing output or a τ off by more than the tolerance, and says why."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io

from harness import crossengine
from harness.metrics import summarise
from harness.store import Store
from store_fixtures import make_cell, make_result, run_info

T0 = dt.datetime(2025, 1, 2, tzinfo=dt.timezone.utc)


def _with(result, *, output_of=None, accepted_minus=0):
    """The result with request 5's output replaced, or one fewer accepted draft on every step of every
    other request (the metrics recomputed)."""
    requests = []
    for i, rr in enumerate(result.requests):
        rec = rr.record
        if accepted_minus and i % 2 == 0 and not rec.failed:  # counts only: the outputs stay equal
            rec = dataclasses.replace(rec, num_accepted=tuple(max(0, a - accepted_minus) for a in rec.num_accepted))
        ids = rr.output_ids
        if output_of is not None and i == 5:
            ids = tuple(output_of(ids))
        requests.append(dataclasses.replace(rr, record=rec, output_ids=ids))
    records = [r.record for r in requests]
    return dataclasses.replace(result, requests=requests, metrics=summarise(records, result.steps, result.window))


def _store(tmp_path, vllm_ngram):
    path = tmp_path / "x.duckdb"
    with Store.open(path) as store:
        run_id = store.begin_run(run_info(suite_name="vllm-cpu"))
        for method, gamma in (("none", 0), ("ngram", 3), ("dflash", 3)):
            cell = make_cell(method, gamma)
            ours = make_result(seed=7 + gamma, gamma=gamma, confidences=False)
            theirs = vllm_ngram(ours) if method == "ngram" else ours
            for c, r in ((cell, ours), (dataclasses.replace(cell, backend="vllm"), theirs)):
                store.record_cell(run_id, c, 0, result=r, error=None, started_at=T0, finished_at=T0,
                                  comparability_key="k")
        store.finish_run(run_id)
    return path


def _run(path, *extra):
    out = io.StringIO()
    return crossengine.main(["--db", str(path), *extra], out=out), out.getvalue()


def test_equal_engines_pass_and_every_cell_is_printed(tmp_path):
    code, text = _run(_store(tmp_path, lambda r: r))
    assert code == 0, text
    assert "PASS" in text and "τ = 1 + accepted / drafting steps" in text
    rows = [line for line in text.splitlines() if line.startswith(("plain/", "ngram γ3/", "dflash γ3/"))]
    assert len(rows) == 3 and all(" ok: " in row for row in rows)
    assert "τ within 3%" in text and "vLLM's DFlash slot convention differs" in text


def test_a_differing_greedy_output_fails(tmp_path):
    code, text = _run(_store(tmp_path, lambda r: _with(r, output_of=lambda ids: ids[:-1] + (999,))))
    assert code == 1 and "greedy outputs differ on 1 of" in text and "FAIL" in text


def test_acceptance_beyond_the_tolerance_fails(tmp_path):
    path = _store(tmp_path, lambda r: _with(r, accepted_minus=1))
    code, text = _run(path)
    assert code == 1 and "τ differs by" in text, text
    assert _run(path, "--tolerance", "0.9")[0] == 0  # the same run within a wide tolerance


def test_missing_store_or_pairs_exit_2(tmp_path):
    assert _run(tmp_path / "none.duckdb")[0] == 2
    path = tmp_path / "one.duckdb"
    with Store.open(path) as store:
        run_id = store.begin_run(run_info())
        store.record_cell(run_id, make_cell("ngram", 3), 0, result=make_result(gamma=3), error=None, started_at=T0,
                          finished_at=T0, comparability_key="k")
        store.finish_run(run_id)
    assert _run(path)[0] == 2
