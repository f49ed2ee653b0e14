"""`harness query` as an attacker and a careless user would call it: every statement that reaches
beyond the store (files, network, extensions, settings) or writes is refused in one line with exit 2,
and nothing outside the store changes; plain reads still work."""

from __future__ import annotations

import re

import pytest

from fuzz_table import Row, check, make_store, run_cli

OUTSIDE = "refused: the query reaches a file, the network or an extension beyond the store"
SETTING = "refused: the query changes a setting"
WRITE = "the query tried to write"
EMPTY = "the query has no statement"

ROWS = [
    # files written outside the store
    Row("copy to a file", "COPY (SELECT 1) TO '{tmp}/out.csv'", 2, OUTSIDE),
    Row("copy over another store", "COPY (SELECT 1) TO '{tmp}/other.duckdb'", 2, OUTSIDE),
    Row("copy into the package tree", "COPY (SELECT 'import os') TO '{tmp}/pkg/evil.py' (FORMAT csv)", 2, OUTSIDE),
    Row("copy to stdout device", "COPY (SELECT 1) TO '/dev/stdout'", 2, OUTSIDE),
    Row("export database", "EXPORT DATABASE '{tmp}/exported'", 2, OUTSIDE),
    # files read outside the store
    Row("read_csv of /etc/passwd", "SELECT * FROM read_csv('/etc/passwd')", 2, OUTSIDE),
    Row("read_text of a file", "SELECT content FROM read_text('/etc/passwd')", 2, OUTSIDE),
    Row("read_blob of a file", "SELECT content FROM read_blob('/etc/hostname')", 2, OUTSIDE),
    Row("read_json of a file", "SELECT * FROM read_json('{tmp}/secret.json')", 2, OUTSIDE),
    Row("read_parquet glob", "SELECT * FROM read_parquet('{tmp}/*.parquet')", 2, OUTSIDE),
    Row("glob of a directory", "SELECT * FROM glob('/etc/*')", 2, OUTSIDE),
    Row("sniff_csv of a file", "SELECT * FROM sniff_csv('/etc/passwd')", 2, OUTSIDE),
    Row("read_text in a subquery", "SELECT (SELECT content FROM read_text('/etc/passwd')) AS x", 2, OUTSIDE),
    Row("copy from a file", "COPY runs FROM '/etc/passwd'", 2, re.compile(f"{OUTSIDE}|{WRITE}")),
    # other databases, extensions, network
    Row("attach another store", "ATTACH '{tmp}/other.duckdb' AS other", 2, OUTSIDE),
    Row("install from a url", "INSTALL httpfs FROM 'http://127.0.0.1:9/'", 2, OUTSIDE),
    Row("install", "INSTALL httpfs", 2, OUTSIDE),
    Row("load an extension", "LOAD httpfs", 2, "refused: the query loads an extension"),
    Row("load a file", "LOAD '{tmp}/evil.duckdb_extension'", 2, "refused: the query loads an extension"),
    Row("secret manager", "CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')", 2, OUTSIDE),
    # settings stay locked
    Row("turn external access back on", "SET enable_external_access = true", 2, SETTING),
    Row("unlock the configuration", "SET lock_configuration = false", 2, SETTING),
    Row("reset the lock", "RESET lock_configuration", 2, SETTING),
    Row("allow a directory", "SET allowed_directories = ['/']", 2, SETTING),
    Row("autoload extensions", "SET autoload_known_extensions = true", 2, SETTING),
    Row("pragma setting", "PRAGMA threads = 1", 2, SETTING),
    # writes to the store itself
    Row("insert", "INSERT INTO runs (run_id) VALUES ('x')", 2, WRITE),
    Row("drop", "DROP TABLE runs", 2, WRITE),
    Row("write after a read", "SELECT 1; DELETE FROM metrics", 2, WRITE),
    # nothing to run
    Row("empty", "", 2, "empty query"),
    Row("whitespace", "   \n\t ", 2, "empty query"),
    Row("comment only", "-- nothing here", 2, EMPTY),
    Row("block comment only", "/* nothing */", 2, EMPTY),
    Row("semicolons only", ";;", 2, EMPTY),
    Row("syntax error", "SELEC 1", 2, "query failed: Parser Error"),
    Row("unknown table", "SELECT * FROM no_such_table", 2, "query failed: Catalog Error"),
    # reads that must keep working
    Row("a view", "SELECT count(*) AS n FROM v_runs", 0, "(1 row)"),
    Row("json functions", "SELECT json_extract('{{\"a\": 1}}', '$.a') AS a", 0, "(1 row)"),
    Row("statement after a comment", "-- the runs\nSELECT count(*) AS n FROM runs", 0, "(1 row)"),
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("query")
    make_store(tmp / "h.duckdb", runs=1)
    make_store(tmp / "other.duckdb", runs=1)
    (tmp / "pkg").mkdir()
    (tmp / "secret.json").write_text('{"key": "sk-secret"}')
    return tmp


@pytest.mark.parametrize("row", ROWS, ids=Row.name_of)
def test_query_table(row, stores, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in stores.rglob("*")}
    sql = row.given.replace("{tmp}", str(stores)).replace("{{", "{").replace("}}", "}")
    code, out, err = run_cli(["query", "--db", stores / "h.duckdb", sql], capsys)
    check(row, code, out, err)
    after = {p.name: p.stat().st_mtime_ns for p in stores.rglob("*")}
    assert after == before  # no file created, changed or removed, the store included


def test_a_second_reader_in_the_same_process_is_sandboxed_too(stores):
    """DuckDB shares one database (and its locked settings) between connections to one file."""
    from harness.store import Store, StoreError

    with Store.open(stores / "h.duckdb", read_only=True) as first, \
            Store.open(stores / "h.duckdb", read_only=True) as second:
        for store in (first, second):
            assert store.query("SELECT count(*) FROM runs")[1] == [(1,)]
            with pytest.raises(StoreError, match="refused: the query reaches a file"):
                store.query("SELECT * FROM read_text('/etc/passwd')")
