"""`harness history`: one metric per cell over runs, change points flagged, read-only `--where`."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest

from harness.report.history import history, history_command, series
from harness.store import Store, StoreError
from report_fixtures import T0, make_cell, make_result, record_run

ACCEPT = (0.4, 0.42, 0.38, 0.41, 0.4, 0.39, 0.75, 0.76, 0.74, 0.75)  # τ steps up at run 6


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """Ten runs of one dspark cell (τ steps up at run 6) and a plain cell; a failed cell in run 3."""
    path = tmp_path_factory.mktemp("history") / "h.duckdb"
    with Store.open(path) as store:
        for i, accept in enumerate(ACCEPT):
            cells = [(make_cell("dspark", 4), make_result(100 + i, gamma=4, accept=accept, num_requests=16), None),
                     (make_cell("plain"), make_result(200 + i, gamma=0), None)]
            if i == 3:
                cells.append((make_cell("dflash", 4), None, "boom"))
            record_run(store, cells, started_at=T0 + dt.timedelta(days=i))
    return path


def run_history(path, metric, where=None, fmt="table"):
    out = io.StringIO()
    code = history_command(path, metric, where=where, fmt=fmt, out=out)
    return code, out.getvalue()


def test_history_rows_are_ordered_by_time(store_path):
    with Store.open(store_path, read_only=True) as store:
        rows = history(store, "acceptance_length")
        spec = history(store, "acceptance_length", "method = 'dspark'")
    assert len(rows) == 10 and len(spec) == 10  # failed cells and NULL values (plain decoding has no τ) left out
    assert [r.started_at for r in rows] == sorted(r.started_at for r in rows)
    assert all(r.repeats == 1 and "dspark" in r.label for r in spec)
    (s,) = series(spec)
    assert [c.index for c in s.fit.changes] == [6]
    assert s.fit.changes[0].after > s.fit.changes[0].before


def test_history_also_reads_a_bare_connection(store_path):
    with Store.open(store_path, read_only=True) as store:
        rows = history(store.con, "throughput", "drafter = 'plain'")
    assert len(rows) == 10


def test_history_command_prints_rows_and_flags_the_change(store_path):
    code, text = run_history(store_path, "acceptance_length", "method <> 'none'")
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split() == ["cell_id", "label", "run_id", "started_at", "git_sha", "value", "level", "change"]
    flagged = [line for line in lines if "->" in line]
    assert len(flagged) == 1 and "(+" in flagged[0]
    assert "(10 rows)" in text and "1 cell(s), 1 change point(s)" in text

    code, text = run_history(store_path, "acceptance_length", "method <> 'none'", fmt="json")
    rows = json.loads(text)
    assert code == 0 and len(rows) == 10
    assert [bool(r["change"]) for r in rows] == [i == 6 for i in range(10)]
    assert rows[0]["level"] < rows[-1]["level"]

    code, text = run_history(store_path, "throughput", fmt="csv")
    assert code == 0 and text.splitlines()[0] == "cell_id,label,run_id,started_at,git_sha,value,level,change"
    assert len(text.splitlines()) == 21

    code, text = run_history(store_path, "acceptance_length", "method <> 'none'", fmt="markdown")
    lines = text.splitlines()
    assert code == 0 and lines[0].startswith("| cell_id | label |") and lines[1].startswith("|---")
    assert len([line for line in lines if line.startswith("| ")]) == 11 and sum("->" in line for line in lines) == 1


def test_unknown_metric_lists_the_metrics(store_path, capsys):
    code, text = run_history(store_path, "acceptance_lenght")
    err = capsys.readouterr().err
    assert code == 2 and text == ""
    assert err.startswith("harness: error: no metric 'acceptance_lenght'")
    assert "did you mean 'acceptance_length'?" in err and "throughput" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("where", [
    "1 = 1; DROP TABLE runs",
    "1 = 1; DELETE FROM metrics",
    "run_id IN (SELECT run_id FROM (DELETE FROM runs RETURNING run_id))",
    "1 = 1) UNION ALL SELECT 1 FROM (DROP TABLE runs",
])
def test_where_cannot_write(store_path, where, capsys):
    with Store.open(store_path, read_only=True) as store:
        before = store.query("SELECT count(*) FROM runs")[1], store.query("SELECT count(*) FROM metrics")[1]
    code, text = run_history(store_path, "acceptance_length", where)
    err = capsys.readouterr().err
    assert code == 2 and text == "" and err.startswith("harness: error: ") and err.count("\n") == 1
    with Store.open(store_path, read_only=True) as store:
        after = store.query("SELECT count(*) FROM runs")[1], store.query("SELECT count(*) FROM metrics")[1]
    assert after == before


def test_where_that_does_not_parse_is_one_line(store_path, capsys):
    code, _ = run_history(store_path, "acceptance_length", "task = = 'gsm8k'")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("harness: error: --where") and err.count("\n") == 1
    code, _ = run_history(store_path, "acceptance_length", "no_such_column = 1")
    assert code == 2 and capsys.readouterr().err.count("\n") == 1


def test_where_with_a_trailing_comment_still_runs(store_path):
    code, text = run_history(store_path, "acceptance_length", "drafter = 'dspark' -- only dspark")
    assert code == 0 and "(10 rows)" in text


def test_history_refuses_a_second_statement(store_path, tmp_path):
    with Store.open(store_path, read_only=True) as store, pytest.raises(StoreError, match="not a query or a second"):
        history(store, "throughput", "1 = 1; SELECT 1")
    assert history_command(tmp_path / "missing.duckdb", "throughput") == 2


def test_where_runs_on_a_read_only_connection(store_path, capsys):
    """A condition that would write (advance a sequence) is outside the grammar, and the connection is
    read-only besides."""
    with Store.open(store_path) as store:
        store.con.execute("CREATE SEQUENCE IF NOT EXISTS probe START 1")
    code, text = run_history(store_path, "acceptance_length", "nextval('probe') > 0")
    err = capsys.readouterr().err
    assert code == 2 and text == "" and "function 'nextval' is not allowed" in err and err.count("\n") == 1
    with Store.open(store_path) as store:
        assert store.con.execute("SELECT nextval('probe')").fetchone()[0] == 1  # never advanced
        store.con.execute("DROP SEQUENCE probe")
