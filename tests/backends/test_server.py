"""Our OpenAI server over the in-house engine, run through `backends.process`, measured by the `openai`
backend: same greedy outputs and the same acceptance as the in-house backend on the same prompts, whether
acceptance comes from the per-request spec extension or from Prometheus deltas; process groups stop whole."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import urllib.error
import urllib.request
from dataclasses import replace
from itertools import groupby
from pathlib import Path

import pytest

from backends.openai.client import ApiRequest, Endpoint, stream_request
from backends.openai.metrics import spec_counts_from_text
from backends.process import ServerError, ServerProcess
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from contracts.records import SpecCounts
from harness.metrics.derive import measure
from harness.metrics.server_counts import spec_count_metrics

REPO = Path(__file__).resolve().parents[2]
DSPARK = "models/embedded/drafts/dspark"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module")
def data_dir():
    if not os.environ.get("HARNESS_DATA_DIR"):
        shared = REPO.parent / "shared" / "datasets"
        if not shared.is_dir():
            pytest.skip("needs HARNESS_DATA_DIR (../shared/datasets)")
        os.environ["HARNESS_DATA_DIR"] = str(shared)


@pytest.fixture(scope="module")
def server(data_dir):
    """Our server on a free port, dspark γ=3, launched through ServerProcess; its whole process group must be
    gone once closed."""
    port = _free_port()
    argv = [sys.executable, "-m", "backends.inhouse.server", "--drafter-method", "dspark", "--drafter-checkpoint",
            DSPARK, "--num-drafts", "3", "--port", str(port), "--num-slots", "4", "--num-threads", "1",
            "--device", "cpu", "--served-model-name", "embedded"]
    process = ServerProcess(argv, f"http://127.0.0.1:{port}/health", cwd=REPO, startup_timeout_s=180).start()
    process.url = f"http://127.0.0.1:{port}"
    yield process
    process.close()
    assert _group_gone(process.pgid), "the server's process group outlived close()"


@pytest.fixture(scope="module")
def inhouse(data_dir):
    from backends.inhouse.adapter import InhouseBackend

    backend = InhouseBackend(device="cpu", num_slots=4, num_threads=1)
    yield backend
    backend.close()


def _cell(task: str = "gsm8k", n: int = 3, max_new: int = 16, warmup: int = 1) -> Cell:
    return Cell("openai", TargetSpec("embedded", "embedded"), DrafterSpec("dspark", "dspark", DSPARK), 3,
                TaskSpec(task, n, max_new), PolicySpec("full"), concurrency=2, warmup=warmup)


def _by_key(result):
    return {r.prompt_key: r for r in result.requests}


def _emission_counts(record) -> list[int]:
    return [len(list(g)) for _, g in groupby(record.token_times_s)]


def _measured(result):
    return [r.record for r in result.requests if not r.warmup]


def test_openai_cell_equals_inhouse_with_agreeing_acceptance_sources(server, inhouse):
    from backends.openai.adapter import OpenAIBackend

    cell = _cell()
    remote = measure(OpenAIBackend(base_url=server.url + "/v1"), cell)
    local = measure(inhouse, replace(cell, backend="inhouse"))

    assert remote.provenance["acceptance_source"] == "per_request"
    assert remote.provenance["token_count"] == "token_ids" and remote.provenance["backend_version"].startswith("openai/dspark-inhouse")
    got, want = _by_key(remote), _by_key(local)
    assert got.keys() == want.keys() and len(got) == 3
    for key, w in want.items():
        g = got[key]
        assert g.output_ids == w.output_ids and g.prompt_ids == w.prompt_ids, key  # greedy: identical outputs
        assert g.warmup == w.warmup and not g.record.failed
        assert (g.record.num_verified, g.record.num_accepted) == (w.record.num_verified, w.record.num_accepted), key
        # calibration data too (float noise only: the server batched the requests differently)
        assert [len(c) for c in g.record.confidence_logits] == list(g.record.num_verified), key
        for got_step, want_step in zip(g.record.confidence_logits, w.record.confidence_logits):
            assert got_step == pytest.approx(want_step, abs=1e-5), key
        assert _emission_counts(g.record) == _emission_counts(w.record), key  # one chunk per engine step
        assert g.record.finish_reason == w.record.finish_reason

    # the three sources of acceptance agree: per-request records, Prometheus deltas, the in-house engine
    prometheus = SpecCounts.from_dict(json.loads(remote.provenance["prometheus_spec_decode"]))
    assert prometheus == SpecCounts.from_records(_measured(remote)) == SpecCounts.from_records(_measured(local))
    assert prometheus.drafts > 0 and prometheus.accepted > 0
    for name in ("acceptance_length", "accepted_per_step", "draft_acceptance_rate", "position_acceptance_conditional_k2",
                 "ece_raw"):
        assert remote.metrics.value(name) == pytest.approx(local.metrics.value(name), abs=1e-5), name
    assert spec_count_metrics(prometheus, 3)["acceptance_length"].value == pytest.approx(local.metrics.value("acceptance_length"))
    assert remote.metrics.value("throughput") > 0 and remote.metrics.value("ttft_p50") > 0


def test_sampled_outputs_equal_inhouse_with_the_same_seeds(server, inhouse):
    """Each request carries the in-house adapter's seed, so T = 1 sampling reproduces too."""
    from backends.openai.adapter import OpenAIBackend

    cell = replace(_cell(n=2, max_new=8, warmup=0), task=TaskSpec("gsm8k", 2, 8, temperature=1.0), seed=5)
    got = _by_key(measure(OpenAIBackend(base_url=server.url), cell))
    want = _by_key(measure(inhouse, replace(cell, backend="inhouse")))
    assert {k: r.output_ids for k, r in got.items()} == {k: r.output_ids for k, r in want.items()}

    # a later round is a new draw, the same on both backends: its seeds travel with the requests
    later = cell.in_round(1)
    got_later = _by_key(measure(OpenAIBackend(base_url=server.url), later))
    want_later = _by_key(measure(inhouse, replace(later, backend="inhouse")))
    assert {k: r.output_ids for k, r in got_later.items()} == {k: r.output_ids for k, r in want_later.items()}
    assert [r.output_ids for r in want_later.values()] != [r.output_ids for r in want.values()]
    # greedy requests ignore the seed: round 1 replays round 0
    greedy = replace(cell, task=TaskSpec("gsm8k", 2, 8), backend="inhouse")
    assert ({k: r.output_ids for k, r in _by_key(measure(inhouse, greedy)).items()}
            == {k: r.output_ids for k, r in _by_key(measure(inhouse, greedy.in_round(1))).items()})


def test_prometheus_source_when_responses_carry_no_steps(server, monkeypatch):
    from backends.openai import adapter

    monkeypatch.setattr(adapter, "per_request_steps", lambda usage, num_drafts: None)  # a server without the extension
    result = measure(adapter.OpenAIBackend(base_url=server.url), _cell(n=2, warmup=0))
    assert result.provenance["acceptance_source"] == "prometheus"
    assert all(r.record.num_steps == 0 for r in result.requests)
    counts = SpecCounts.from_dict(json.loads(result.provenance["prometheus_spec_decode"]))
    assert result.metrics.value("acceptance_length") == pytest.approx(spec_count_metrics(counts, 3)["acceptance_length"].value)
    assert 1.0 < result.metrics.value("acceptance_length") <= 4.0


def test_chat_multi_turn_follows_the_models_own_answers(server, inhouse):
    from backends.openai.adapter import OpenAIBackend

    cell = _cell("mt_bench", n=2, max_new=8, warmup=0)
    remote = measure(OpenAIBackend(base_url=server.url, chat=True), cell)
    local = measure(inhouse, replace(cell, backend="inhouse"))
    got, want = _by_key(remote), _by_key(local)
    assert got.keys() == want.keys() and {k.rsplit(":", 1)[1] for k in got} == {"0", "1"}
    for key, w in want.items():
        assert got[key].output_ids == w.output_ids and got[key].prompt_ids == w.prompt_ids, key


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_api_surface(server):
    with urllib.request.urlopen(server.url + "/v1/models") as response:
        assert json.loads(response.read())["data"][0]["id"] == "embedded"
    prompt = [3, 17, 42, 99, 7]
    status, full = _post(server.url + "/v1/completions", {"model": "embedded", "prompt": prompt, "max_tokens": 6,
                                                          "temperature": 0})
    assert status == 200 and full["usage"]["completion_tokens"] == len(full["choices"][0]["token_ids"])
    streamed = stream_request(Endpoint(server.url, "embedded"), ApiRequest("s", prompt, 6))
    assert streamed.token_ids == full["choices"][0]["token_ids"] and streamed.text == full["choices"][0]["text"]
    assert _post(server.url + "/v1/completions", {"prompt": prompt, "n": 2})[0] == 400
    assert _post(server.url + "/v1/completions", {"model": "other", "prompt": prompt})[0] == 404
    assert _post(server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 10**6})[0] == 400
    assert _post(server.url + "/v1/nothing", {})[0] == 404
    with urllib.request.urlopen(server.url + "/metrics") as response:
        text = response.read().decode()
    assert spec_counts_from_text(text).steps > 0 and "vllm:request_success_total" in text


def test_audit_through_the_server_scores_its_tokens_with_a_local_target(server):
    """`harness audit` on an OpenAI-compatible backend: the greedy check, and the sampled χ² check with the
    server's tokens scored by the target loaded here (the server exposes no full distributions)."""
    from backends.openai.adapter import OpenAIBackend
    from harness.audit import LocalScorer, audit_cell

    scorer = LocalScorer()
    try:
        findings = audit_cell(OpenAIBackend(base_url=server.url + "/v1"), _cell(n=6, max_new=24, warmup=0), {}, None,
                              scorer)
    finally:
        scorer.close()
    assert [(f.check, f.passed) for f in findings] == [("greedy", True), ("sampled", True)], findings
    assert "tokens, Anderson-Darling: statistic" in findings[1].detail


def test_a_streaming_client_that_leaves_is_aborted(server):
    """The client reads one chunk of a long generation and hangs up: the engine drops the request (its slot
    is free, /metrics counts finished_reason="abort") rather than generating to max_tokens."""
    import time

    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"model": "embedded", "prompt": [3, 17, 42], "max_tokens": 1500, "temperature": 0,
                       "ignore_eos": True, "stream": True}).encode()
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        received = b""
        while b"data: " not in received:  # the headers, then the first chunk
            received += conn.recv(4096)
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(server.url + "/metrics") as response:
            text = response.read().decode()
        aborted = [line for line in text.splitlines() if 'finished_reason="abort"' in line]
        running = next(line for line in text.splitlines() if line.startswith("vllm:num_requests_running"))
        if aborted and running.endswith(" 0.0"):
            break
        assert time.monotonic() < deadline, f"no abort after 60 s: {aborted} {running}"
        time.sleep(0.2)
    assert aborted[0].endswith(" 1.0")


# ------------------------------------------------------------------ the process helper on its own

CHILDISH = textwrap.dedent("""
    import http.server, signal, subprocess, sys, threading
    signal.signal(signal.SIGTERM, signal.SIG_IGN)          # only SIGKILL stops us
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    print("child", child.pid, flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_stubborn_group_is_killed_whole():
    port = _free_port()
    process = ServerProcess([sys.executable, "-c", CHILDISH, str(port)], f"http://127.0.0.1:{port}/",
                            startup_timeout_s=30, stop_timeout_s=1.0)
    with process:
        assert process.running and "child" in process.log_tail()
    assert _group_gone(process.pgid)


def test_failed_start_raises_with_the_log_tail_and_leaves_nothing():
    argv = [sys.executable, "-c", "import sys; print('loading…'); print('fatal: no such model', file=sys.stderr); sys.exit(3)"]
    process = ServerProcess(argv, f"http://127.0.0.1:{_free_port()}/health", startup_timeout_s=30)
    with pytest.raises(ServerError, match="exited with code 3") as info:
        process.start()
    assert "fatal: no such model" in str(info.value) and "loading" in info.value.log_tail
    assert _group_gone(process.pgid)


def test_health_timeout_stops_the_server():
    process = ServerProcess([sys.executable, "-c", "import time; print('up'); time.sleep(600)"],
                            f"http://127.0.0.1:{_free_port()}/health", startup_timeout_s=1.0)
    with pytest.raises(ServerError, match="did not answer 200"):
        process.start()
    assert _group_gone(process.pgid)
    with pytest.raises(TypeError):
        ServerProcess("python -m x", "http://127.0.0.1:1/health")
