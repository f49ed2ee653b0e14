"""A secret echoed by an endpoint is stored nowhere: an OpenAI-compatible server that puts the request's
Authorization header (and the key) into its 500 bodies and its /version, measured through `harness run`;
the key is in no cell error, log, request error, provenance or export. The echoing server is a test
double for the remote; the adapter, runner, store and export are the real ones."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import pytest

from backends.process import ServerProcess
from harness.progress import PlainDisplay
from contracts.redaction import MASK

REPO = Path(__file__).resolve().parents[3]
KEY = "sk-leak-3f9a0c1e77d24b6b"


@pytest.fixture
def echoing_server():
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/version":
                self._answer(200, {"version": f"echo (authorization={self.headers.get('Authorization')})"})
            else:
                self._answer(404, {"error": "no"})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer(500, {"error": {"message": f"upstream refused api_key={KEY}",
                                         "request_headers": {"Authorization": self.headers.get("Authorization")}}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_echoed_key_reaches_no_row_and_no_export(echoing_server, tmp_path, monkeypatch):
    from harness.runner import run_suite
    from harness.store import Store
    from harness.store.exchange import export_run
    from harness.store.parquet import export_parquet

    if not os.environ.get("HARNESS_DATA_DIR"):
        shared = REPO.parent / "shared" / "datasets"
        if not shared.is_dir():
            pytest.skip("needs HARNESS_DATA_DIR (../shared/datasets)")
        monkeypatch.setenv("HARNESS_DATA_DIR", str(shared))
    monkeypatch.setenv("LEAK_TEST_KEY", KEY)
    suite = tmp_path / "leak.yaml"
    suite.write_text(f"""version: 1
name: leak
include: [{REPO / 'suites' / 'common.yaml'}]
defaults: {{backend: openai, seed: 0, warmup: 0, repeats: 2, policy: full}}
gates: {{speedup: {{test: threshold}}}}  # 2 rounds: common.yaml's rank test needs 4
tasks:
  gsm8k: {{n_samples: 2, max_new_tokens: 4}}
matrix:
  backend: [openai]
  target: [embedded]
  drafter: [none]
  num_drafts: [3]
  task: [gsm8k]
  concurrency: [1]
backend_options:
  openai: {{base_url: "{echoing_server}", model: m, api_key_env: LEAK_TEST_KEY, metrics: false}}
""")
    db = tmp_path / "h.duckdb"
    outcome = run_suite(suite, db_path=db, display=PlainDisplay(io.StringIO()))
    assert [o.status for o in outcome.outcomes] == ["failed", "failed"]
    store = Store.open(db, read_only=True)
    try:
        _, cells = store.query("select error, log, provenance from cells")
        _, requests = store.query("select error from requests")
        exported = export_run(store, outcome.run_id, tmp_path / "run.json").read_text()
    finally:
        store.close()
    assert len(cells) == 2  # two rounds, both failed
    for error, log, provenance in cells:
        assert "every request failed" in error and MASK in error and KEY not in error, error
        assert KEY not in (log or "") and KEY not in json.dumps(provenance, default=str)
    assert all(KEY not in e for (e,) in requests if e)  # a failed cell keeps no requests; the adapter's are below
    assert KEY not in exported and MASK in exported
    assert KEY not in outcome.outcomes[0].error

    # a run recorded before recording redacted: the exports mask it all the same
    store = Store.open(db)
    try:
        store.con.execute("UPDATE cells SET error = ?, log = ?", [f"HTTP 500: {KEY}", f"Authorization: Bearer {KEY}"])
        exported = export_run(store, outcome.run_id, tmp_path / "old.json").read_text()
        files = export_parquet(store, [outcome.run_id], tmp_path / "pool")
    finally:
        store.close()
    assert KEY not in exported and f"HTTP 500: {MASK}" in exported
    cells_file = next(f for f in files if f.parent.name == "cells")
    rows = duckdb.sql(f"SELECT error, log FROM read_parquet('{cells_file}')").fetchall()
    assert rows == [(f"HTTP 500: {MASK}", f"Authorization: {MASK}")] * 2
    assert all(KEY.encode() not in f.read_bytes() for f in files)


def test_the_adapters_request_errors_are_redacted(echoing_server, monkeypatch):
    from backends.openai.adapter import OpenAIBackend
    from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

    if not os.environ.get("HARNESS_DATA_DIR"):
        pytest.skip("needs HARNESS_DATA_DIR")
    monkeypatch.setenv("OTHER_KEY_VAR", KEY)
    cell = Cell("openai", TargetSpec("embedded", "embedded"), DrafterSpec("none", "none"), 0, TaskSpec("gsm8k", 2, 4),
                PolicySpec("full"), concurrency=1)
    result = OpenAIBackend(base_url=echoing_server, model="m", api_key_env="OTHER_KEY_VAR", metrics=False).run_cell(cell)
    errors = [r.record.error for r in result.requests]
    assert len(errors) == 2 and all(e and KEY not in e and "HTTP 500" in e and MASK in e for e in errors), errors
    assert KEY not in result.provenance["backend_version"] and MASK in result.provenance["backend_version"]


def test_a_server_log_that_prints_the_key_is_captured_redacted(monkeypatch):
    monkeypatch.setenv("SERVER_API_KEY", KEY)  # a secret by its name, registered nowhere
    script = ("import sys, os, time, http.server\n"
              "print('got Authorization: Bearer', os.environ['SERVER_API_KEY'], flush=True)\n"
              "print('key is', os.environ['SERVER_API_KEY'], flush=True)\n"
              "sys.exit(3)\n")
    process = ServerProcess([sys.executable, "-c", script], "http://127.0.0.1:9/health", startup_timeout_s=30)
    from backends.process import ServerError

    with pytest.raises(ServerError) as info:
        process.start()
    assert KEY not in str(info.value) and KEY not in process.log_tail()
    assert "Authorization: [REDACTED]" in process.log_tail() and f"key is {MASK}" in process.log_tail()
