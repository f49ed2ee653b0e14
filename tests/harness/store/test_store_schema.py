"""Opening stores: migrations from empty and from an older version, refusing a newer schema, a locked file,
a missing file read-only, files that are no store."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest

from harness.store import SCHEMA_VERSION, VIEWS, Store, StoreError
from harness.store import migrations


def test_empty_database_is_migrated_with_tables_and_views(tmp_path):
    path = tmp_path / "sub" / "harness.duckdb"
    with Store.open(path) as store:
        _, rows = store.query("SELECT version, description FROM schema_migrations ORDER BY version")
        assert [r[0] for r in rows] == [v for v, _, _ in migrations.MIGRATIONS]
        _, names = store.query("SELECT table_name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views() "
                               "WHERE NOT internal")
        names = {n for (n,) in names}
    assert {"runs", "cells", "requests", "request_steps", "request_tokens", "step_confidences", "engine_steps",
            "calibration_bins", "metrics", "benchmarks", "schema_migrations"} <= names
    assert set(VIEWS) <= names
    # Reopening is a no-op, read-only works once it exists.
    with Store.open(path) as store:
        assert store.query("SELECT max(version) FROM schema_migrations")[1] == [(SCHEMA_VERSION,)]
    with Store.open(path, read_only=True) as store:
        assert store.query("SELECT count(*) FROM v_runs")[1] == [(0,)]


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "h.duckdb"
    Store.open(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_migrations VALUES (?, 'from the future', now())", [SCHEMA_VERSION + 1])
    con.close()
    for read_only in (False, True):
        with pytest.raises(StoreError) as info:
            Store.open(path, read_only=read_only)
        message = str(info.value)
        assert "\n" not in message and str(path) in message and "newer" in message and "update" in message


def test_older_schema_gets_missing_migrations_in_one_transaction(tmp_path, monkeypatch):
    path = tmp_path / "h.duckdb"
    Store.open(path).close()  # at the current version
    extra = [(SCHEMA_VERSION + 1, "a note column", ["ALTER TABLE runs ADD COLUMN note VARCHAR"]),
             (SCHEMA_VERSION + 2, "a note index table", ["CREATE TABLE notes (run_id VARCHAR, note VARCHAR)"])]
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS + extra)
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", SCHEMA_VERSION + 2)

    with pytest.raises(StoreError, match="older.*open it writable"):
        Store.open(path, read_only=True)
    with Store.open(path) as store:
        versions = [v for (v,) in store.query("SELECT version FROM schema_migrations ORDER BY version")[1]]
        assert versions[-2:] == [SCHEMA_VERSION + 1, SCHEMA_VERSION + 2]
        assert "note" in [c for c, in store.query("SELECT column_name FROM duckdb_columns() WHERE table_name = 'runs'")[1]]


def test_a_failing_migration_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "h.duckdb"
    Store.open(path).close()
    extra = [(SCHEMA_VERSION + 1, "good", ["CREATE TABLE good (x INTEGER)"]),
             (SCHEMA_VERSION + 2, "bad", ["CREATE TABLE nonsense AS SELECT * FROM no_such_table"])]
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS + extra)
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", SCHEMA_VERSION + 2)
    with pytest.raises(StoreError, match="migrating .* failed"):
        Store.open(path)
    monkeypatch.undo()
    with Store.open(path, read_only=True) as store:
        assert store.query("SELECT max(version) FROM schema_migrations")[1] == [(SCHEMA_VERSION,)]
        assert store.query("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'good'")[1] == [(0,)]


def test_read_only_open_of_a_missing_store(tmp_path):
    with pytest.raises(StoreError, match="no result store at .*run a suite first"):
        Store.open(tmp_path / "missing.duckdb", read_only=True)
    assert not (tmp_path / "missing.duckdb").exists()


def test_files_that_are_no_store(tmp_path):
    garbage = tmp_path / "garbage.duckdb"
    garbage.write_text("hello" * 1000)
    with pytest.raises(StoreError, match="not a DuckDB database"):
        Store.open(garbage)
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="not a harness store"):
        Store.open(other)


def test_locked_store_names_the_file_and_what_to_do(tmp_path):
    path = tmp_path / "h.duckdb"
    Store.open(path).close()
    holder = textwrap.dedent(f"""
        import sys, duckdb
        con = duckdb.connect({str(path)!r})
        print("ready", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        for read_only in (False, True):
            with pytest.raises(StoreError) as info:
                Store.open(path, read_only=read_only)
            message = str(info.value)
            assert "\n" not in message
            assert str(path) in message and "locked" in message and f"process {proc.pid}" in message
            assert "wait" in message
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    Store.open(path).close()  # free again


def test_memory_store_and_read_only_refusals():
    with Store.open(":memory:") as store:
        assert store.query("SELECT count(*) FROM runs")[1] == [(0,)]
    with pytest.raises(StoreError, match="in-memory"):
        Store.open(":memory:", read_only=True)
