"""Bad baseline files as `harness gate --baseline FILE.json` (and `harness baseline import`) meet them:
not JSON, not an exported run, an unknown schema version, a missing field, rows of the wrong shape or
type — each exit 2 with one line naming the file and what is wrong; a good export still gates."""

from __future__ import annotations

import json
import re

import pytest

from fuzz_table import Row, check, make_store, run_cli

from harness.store import SCHEMA_VERSION, Store, export_run


def doc_edit(change):
    """A row's input as a function of the good export's document."""
    return ("json", change)


def without(*keys):
    def change(doc):
        for key in keys:
            doc.pop(key)
    return doc_edit(change)


def set_field(key, value):
    return doc_edit(lambda doc: doc.__setitem__(key, value))


def table_edit(table, change):
    return doc_edit(lambda doc: change(doc["tables"][table]))


def bad_timestamp(runs):
    runs["rows"][0][runs["columns"].index("started_at")] = "yesterday"


def bad_number(cells):
    cells["rows"][0][cells["columns"].index("concurrency")] = "many"


ROWS = [
    Row("garbage bytes", ("bytes", b"\x00\x01garbage"), 2, "cannot read exported run"),
    Row("not UTF-8", ("bytes", b'{"format": "\xff"}'), 2, "cannot read exported run"),
    Row("empty file", ("bytes", b""), 2, "cannot read exported run"),
    Row("truncated export", ("truncate", 0.5), 2, "cannot read exported run"),
    Row("deeply nested JSON", ("bytes", b"[" * 200_000 + b"]" * 200_000), 2, "cannot read exported run"),
    Row("a JSON list", ("bytes", b"[1, 2]"), 2, "is not an exported harness run"),
    Row("another format", set_field("format", "pytest-benchmark"), 2, "is not an exported harness run"),
    Row("no schema version", without("schema_version"), 2, "unknown schema version None"),
    Row("schema version a string", set_field("schema_version", "1"), 2, "unknown schema version '1'"),
    Row("schema version 0", set_field("schema_version", 0), 2, "unknown schema version 0"),
    Row("schema version true", set_field("schema_version", True), 2, "unknown schema version True"),
    Row("schema version from the future", set_field("schema_version", SCHEMA_VERSION + 1), 2,
        f"has schema version {SCHEMA_VERSION + 1}, newer than this code knows"),
    Row("no run_id", without("run_id"), 2, 'missing field "run_id"'),
    Row("run_id not a string", set_field("run_id", 7), 2, 'missing field "run_id"'),
    Row("no tables", without("tables"), 2, 'missing field "tables"'),
    Row("no runs table", doc_edit(lambda doc: doc["tables"].pop("runs")), 2, 'with a "runs" table'),
    Row("an unknown table", doc_edit(lambda doc: doc["tables"].__setitem__("secrets", {"columns": [], "rows": []})),
        2, "unknown table 'secrets'"),
    Row("a table without rows", table_edit("cells", lambda t: t.pop("rows")), 2, 'table cells needs "columns"'),
    Row("a row of the wrong length", table_edit("cells", lambda t: t["rows"][0].pop()), 2,
        "table cells row 0 is not a list of"),
    Row("a row that is not a list", table_edit("metrics", lambda t: t["rows"].__setitem__(0, "x")), 2,
        "table metrics row 0 is not a list"),
    Row("two runs", table_edit("runs", lambda t: t["rows"].append(list(t["rows"][0]))), 2,
        "the runs table must hold exactly the one run"),
    Row("run id disagreeing with its row", set_field("run_id", "r-other"), 2, "must hold exactly the one run 'r-other'"),
    Row("an unknown column", table_edit("cells", lambda t: (t["columns"].append("evil"), [r.append(1) for r in t["rows"]])),
        2, "table cells has columns this schema lacks: ['evil']"),
    Row("a timestamp that is no date", table_edit("runs", bad_timestamp), 2, "a value does not fit its column"),
    Row("a number that is text", table_edit("cells", bad_number), 2, re.compile(r"(does not fit|failed: Conversion)")),
    Row("a good export", ("good", None), 0, re.compile(r"PASS|FAIL|INVALID|pass|fail")),
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baseline")
    db = tmp / "h.duckdb"
    ids = make_store(db, runs=2)
    with Store.open(db, read_only=True) as store:
        export_run(store, ids[0], tmp / "good.json", compact=True)
    return tmp, db, ids


def write_input(row, tmp):
    kind, how = row.given
    path = tmp / "bad.json"
    good = (tmp / "good.json").read_bytes()
    if kind == "bytes":
        path.write_bytes(how)
    elif kind == "truncate":
        path.write_bytes(good[: int(len(good) * how)])
    elif kind == "json":
        doc = json.loads(good)
        how(doc)
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(good)
    return path


@pytest.mark.parametrize("row", ROWS, ids=Row.name_of)
def test_gate_baseline_table(row, setup, capsys):
    tmp, db, ids = setup
    path = write_input(row, tmp)
    code, out, err = run_cli(["gate", "--db", db, "--run", ids[1], "--baseline", path], capsys)
    if row.code == 0:  # the gate judged: its verdict (exit 0 or 1), never invalid input
        assert code in (0, 1) and "Traceback" not in err and row.want.search(out), (code, err[:500])
        return
    check(row, code, out, err)


@pytest.mark.parametrize("row", [r for r in ROWS if r.code == 2], ids=Row.name_of)
def test_baseline_import_table(row, setup, tmp_path, capsys):
    tmp, _, _ = setup
    path = write_input(row, tmp)
    db = tmp_path / "fresh.duckdb"
    code, out, err = run_cli(["baseline", "import", path, "--db", db], capsys)
    check(row, code, out, err)
    with Store.open(db, read_only=True) as store:
        assert store.query("SELECT count(*) FROM runs")[1] == [(0,)]  # all of the run or none of it
