"""`harness history METRIC --where …` (and `compare`'s arguments): a condition is parsed by DuckDB and
allowed only as a boolean expression over v_metrics columns, so no row is made up, no file is read and
no filter of the harness's own is escaped; each refusal is one line, exit 2."""

from __future__ import annotations

import re

import pytest

from fuzz_table import Row, check, make_store, run_cli

GRAMMAR = "a condition uses columns, literals"
SHAPE = "--where takes one condition over v_metrics columns"

ROWS = [
    # injection: made-up rows, a second statement, escaping the harness's own filters
    Row("union all of made-up rows", "1=1) UNION ALL SELECT 'x','x','x',now(),'x','x',99.0,1 FROM (SELECT 1", 2,
        re.compile(r"^harness: error: --where")),
    Row("union all after a comment", "1=1 UNION ALL SELECT 1 --", 2, SHAPE),
    Row("parenthesis closed early", "1=1) OR (1=1", 2, "syntax error"),
    Row("or beside the metric filter", "1=1 OR metric <> 'x'", 0, "2 cell(s)"),  # still 2 cells of throughput
    Row("second statement", "1=1; DROP TABLE runs", 2, SHAPE),
    Row("second statement after a literal", "task = 'a'; SELECT 1", 2, SHAPE),
    Row("subquery on read_text", "task IN (SELECT content FROM read_text('/etc/passwd'))", 2, "a subquery is not allowed"),
    Row("scalar subquery", "(SELECT count(*) FROM runs) > 0", 2, "a subquery is not allowed"),
    Row("exists subquery", "EXISTS (SELECT 1)", 2, "a subquery is not allowed"),
    Row("file function", "read_text('/etc/passwd') IS NOT NULL", 2, "function 'read_text' is not allowed"),
    Row("glob function", "len(glob('/etc/*')) > 0", 2, "function 'len' is not allowed"),
    Row("getenv-like function", "current_setting('home_directory') = ''", 2, "is not allowed"),
    Row("sequence write", "nextval('s') > 0", 2, "function 'nextval' is not allowed"),
    Row("window function", "row_number() OVER () > 0", 2, "not allowed"),
    Row("star", "COLUMNS(*) IS NOT NULL", 2, "not allowed"),
    Row("unknown column", "no_such_column = 1", 2, "unknown column 'no_such_column'"),
    Row("qualified column of another table", "runs.run_id = 'x'", 2, "unknown column 'runs.run_id'"),
    Row("huge unknown column", "a" * 100_000 + " = 1", 2, "unknown column"),
    Row("parameter", "task = ?", 2, "not allowed"),
    Row("empty", "", 2, "--where is empty"),
    Row("only a comment", "-- nothing", 2, "--where"),
    Row("syntax error", "task = = 'gsm8k'", 2, re.compile(r"^harness: error: --where takes one condition.*syntax")),
    Row("unbalanced parenthesis", "(task = 'gsm8k'", 2, "--where"),
    # conditions that must keep working
    Row("equality", "drafter = 'dspark'", 0, "1 cell(s)"),
    Row("and / or / not / in / between / like", "(drafter IN ('dspark', 'plain') AND NOT value BETWEEN -1 AND -0.5) "
        "OR task LIKE 'gs%'", 0, "2 cell(s)"),
    Row("is null and functions", "git_sha IS NOT NULL AND lower(drafter) = 'plain' AND length(task) > 0", 0, "1 cell(s)"),
    Row("a literal with a semicolon", "drafter <> 'a;b'", 0, "2 cell(s)"),
    Row("a trailing comment", "drafter = 'dspark' -- only dspark", 0, "1 cell(s)"),
    Row("cast and arithmetic", "CAST(num_drafts AS INTEGER) + 1 > 1", 0, "1 cell(s)"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("history") / "h.duckdb"
    make_store(path, runs=2)
    return path


@pytest.mark.parametrize("row", ROWS, ids=Row.name_of)
def test_history_table(row, store, capsys):
    # throughput: a metric every cell has (plain decoding has no acceptance length)
    code, out, err = run_cli(["history", "throughput", "--db", store, "--where", row.given], capsys)
    check(row, code, out, err)
    if code == 0:
        assert "99.0" not in out and "/root" not in out


COMPARE_ROWS = [
    Row("metric name with a quote", ["--metric", "x' OR '1'='1"], 0, "(0 rows)"),
    Row("run id with a quote", ["r1' OR '1'='1", "latest"], 2, "no run \"r1' OR '1'='1\""),
    Row("run id as a subquery", ["(SELECT run_id FROM runs LIMIT 1)", "latest"], 2, "no run"),
]


@pytest.mark.parametrize("row", COMPARE_ROWS, ids=Row.name_of)
def test_compare_table(row, store, capsys):
    args = row.given if row.given[0] != "--metric" else ["latest", "latest", *row.given]
    code, out, err = run_cli(["compare", "--db", store, *args], capsys)
    check(row, code, out, err)
