"""The `openai` backend's options, its registry entry, and a cell against a scripted chat server."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from contracts.backend import BackendError, backend_class
from backends.openai.adapter import OpenAIBackend
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from harness.metrics.derive import measure

REPO = Path(__file__).resolve().parents[3]


def _cell(**kw) -> Cell:
    return Cell("openai", TargetSpec("embedded", "embedded"), DrafterSpec("none", "none"), 0,
                TaskSpec("gsm8k", 3, 4), PolicySpec("full"), **({"concurrency": 2} | kw))


def test_registry_and_options():
    assert backend_class("openai") is OpenAIBackend
    with pytest.raises(BackendError, match="unknown openai backend option.*valid: base_url"):
        OpenAIBackend(base_url="http://x:1", baseurl="typo")
    with pytest.raises(BackendError, match="needs backend_options.openai.base_url"):
        OpenAIBackend().check(_cell())
    with pytest.raises(BackendError, match="base_url must be"):
        OpenAIBackend(base_url="x:1").check(_cell())
    with pytest.raises(BackendError, match=r"\$NO_SUCH_KEY_VAR, which is not set"):
        OpenAIBackend(base_url="http://x:1", api_key_env="NO_SUCH_KEY_VAR").check(_cell())
    with pytest.raises(BackendError, match="does not exist"):
        OpenAIBackend(base_url="http://x:1", tokenizer="/no/such/tokenizer").check(_cell())
    OpenAIBackend(base_url="http://x:1").check(_cell())  # the embedded target's tokenizer is on disk
    assert OpenAIBackend(base_url="http://x:1").server_command(_cell()) is None


@pytest.fixture
def chat_server():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((body, self.headers.get("Authorization")))
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            chunks = [{"choices": [{"index": 0, "delta": {"content": "a b"}, "logprobs": {"content": [{}, {}]}}]},
                      {"choices": [{"index": 0, "delta": {"content": " c"}, "logprobs": {"content": [{}]},
                                    "finish_reason": "length"}]},
                      {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}]
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_chat_cell_against_a_server_without_metrics(chat_server, monkeypatch):
    if not os.environ.get("HARNESS_DATA_DIR"):
        shared = REPO.parent / "shared" / "datasets"
        if not shared.is_dir():
            pytest.skip("needs HARNESS_DATA_DIR (../shared/datasets)")
        monkeypatch.setenv("HARNESS_DATA_DIR", str(shared))
    url, seen = chat_server
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-do-not-leak")
    done = []
    result = measure(OpenAIBackend(base_url=url, model="m", api_key_env="TEST_OPENAI_KEY", chat=True), _cell(warmup=1), progress=lambda n, total: done.append((n, total)))
    assert len(result.requests) == 3 and [r.warmup for r in result.requests].count(True) == 1
    assert done[-1] == (3, 3)
    assert all(auth == "Bearer sk-do-not-leak" for _, auth in seen)
    assert all(body["model"] == "m" and body["messages"][0]["role"] == "user" for body, _ in seen)
    record = result.requests[-1].record
    assert record.output_tokens == 3 and record.prompt_tokens == 9 and len(set(record.token_times_s)) == 2
    assert result.provenance["acceptance_source"] == "none" and result.provenance["token_count"] == "logprobs"
    assert result.provenance["backend_version"] == "openai/unknown"
    assert result.metrics.value("acceptance_length") is None and result.metrics.value("throughput") > 0
    stored = json.dumps(result.provenance) + result.log + repr(result.requests)
    assert "sk-do-not-leak" not in stored
