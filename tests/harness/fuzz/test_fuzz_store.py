"""Damaged stores as every verb meets them: a truncated file, overwritten blocks, a header of noise, a
file that is no database — each is exit 2 with one line saying the store is damaged (or not a store),
never a traceback, and a writer never appends to a store whose blocks fail their checksums."""

from __future__ import annotations

import os
import shutil

import duckdb
import pytest

from fuzz_table import SUITE, Row, check, make_store, run_cli

DAMAGED = "is damaged"
NOT_A_STORE = "is not a DuckDB database"


def truncate(path, fraction):
    os.truncate(path, int(os.path.getsize(path) * fraction))


def noise(path, offset, size):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(os.urandom(size))


def corrupt_data_block(path):
    """Noise over one data block that the store still opens with (the catalog is intact): only a read
    of that block's table, or the writer's full check, can tell."""
    block = 262_144
    pristine = path.read_bytes()
    for index in range(len(pristine) // block - 1, 0, -1):
        noise(path, 12_288 + index * block + 1024, 4096)
        try:
            duckdb.connect(str(path), read_only=True).close()
            return
        except duckdb.Error:
            path.write_bytes(pristine)
    raise AssertionError("no data block to corrupt")


DAMAGE = {
    "truncated to half": lambda p: truncate(p, 0.5),
    "truncated to 5 KB": lambda p: os.truncate(p, 5000),
    "truncated by one byte": lambda p: os.truncate(p, os.path.getsize(p) - 1),
    "header overwritten": lambda p: noise(p, 4096, 4096),
    "data block overwritten": corrupt_data_block,
    "random bytes": lambda p: p.write_bytes(os.urandom(100_000)),
    "empty file": lambda p: p.write_bytes(b""),
    "zeros": lambda p: p.write_bytes(bytes(1 << 20)),
}
VERBS = {
    "query": ["query", "SELECT count(*) FROM runs"],
    "gate": ["gate"],
    "history": ["history", "acceptance_length"],
    "compare": ["compare", "latest", "latest"],
    "report": ["report", "latest", "--out", "{tmp}/report"],
    "baseline export": ["baseline", "export", "{tmp}/b.json"],
    "run": ["run", "{tmp}/s.yaml"],
    "resume": ["run", "{tmp}/s.yaml", "--resume", "r0"],
}
READERS_OPEN_IT = {"data block overwritten"}  # read-only verbs may read only intact blocks: exit 0/1/2, no traceback

ROWS = [
    Row(f"{damage} / {verb}", (damage, verb), 2,
        NOT_A_STORE if damage in ("random bytes", "empty file", "zeros") else DAMAGED)
    for damage in DAMAGE for verb in VERBS
    if not (damage in READERS_OPEN_IT and verb not in ("run", "resume"))
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "h.duckdb"
    make_store(path, runs=2)
    return path


@pytest.mark.parametrize("row", ROWS, ids=Row.name_of)
def test_store_table(row, pristine, tmp_path, data_env, capsys):
    damage, verb = row.given
    db = tmp_path / "h.duckdb"
    shutil.copy(pristine, db)
    (tmp_path / "s.yaml").write_text(SUITE)
    DAMAGE[damage](db)
    before = db.read_bytes()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in VERBS[verb]]
    code, out, err = run_cli([*argv, "--db", db], capsys)
    check(row, code, out, err)
    assert db.read_bytes() == before  # nothing appended, migrated or repaired


@pytest.mark.parametrize("verb", [v for v in VERBS if v not in ("run", "resume")])
def test_readers_of_a_store_with_a_bad_block_never_trace(verb, pristine, tmp_path, capsys):
    db = tmp_path / "h.duckdb"
    shutil.copy(pristine, db)
    corrupt_data_block(db)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in VERBS[verb]]
    code, out, err = run_cli([*argv, "--db", db], capsys)
    assert "Traceback" not in err and err.count("\n") <= 1
    if code == 2:
        assert DAMAGED in err or "cannot" in err or "error" in err


RESUME_ROWS = [
    Row("resume into a missing store", "missing.duckdb", 2, "--resume r0: there is no store at"),
    Row("resume of an unknown run", "h.duckdb", 2, "--resume r0: no such run in the store"),
]


@pytest.mark.parametrize("row", RESUME_ROWS, ids=Row.name_of)
def test_resume_table(row, pristine, tmp_path, data_env, capsys):
    if row.given == "h.duckdb":
        shutil.copy(pristine, tmp_path / "h.duckdb")
    before = sorted(p.name for p in tmp_path.iterdir())
    (tmp_path / "s.yaml").write_text(SUITE)
    code, out, err = run_cli(["run", tmp_path / "s.yaml", "--resume", "r0", "--db", tmp_path / row.given], capsys)
    check(row, code, out, err)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "s.yaml") == before  # no store created
