"""The streaming client against a scripted server: token counting rules, failures, load shapes, secrets."""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from backends.openai.client import ApiRequest, Endpoint, Load, arrival_offsets, run_openai_load, stream_request


class Script:
    """What the fake server answers: `reply(path, body) -> (status, list of SSE data payloads or a body)`."""

    def __init__(self):
        self.seen: list[tuple[str, dict, dict]] = []  # (path, body, headers)
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.reply = lambda path, body: (200, [])
        self.delay_s = 0.0


@pytest.fixture
def fake():
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with script.lock:
                script.seen.append((self.path, body, dict(self.headers)))
                script.in_flight += 1
                script.max_in_flight = max(script.max_in_flight, script.in_flight)
            finished = False

            def finish() -> None:  # before the last bytes go out: a client may send its next request at once
                nonlocal finished
                if not finished:
                    finished = True
                    with script.lock:
                        script.in_flight -= 1

            try:
                time.sleep(script.delay_s)
                status, events = script.reply(self.path, body)
                if status != 200:
                    data = json.dumps({"error": {"message": "boom"}}).encode()
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    finish()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                for i, event in enumerate(events):
                    payload = event if isinstance(event, str) else json.dumps(event)
                    if i == len(events) - 1:
                        finish()
                    self.wfile.write(f"data: {payload}\n\n".encode())
                    self.wfile.flush()
            finally:
                finish()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield script
    server.shutdown()
    server.server_close()


def _completion(*choices, usage=None):
    return {"choices": [dict(index=0, finish_reason=None) | c for c in choices]} | ({"usage": usage} if usage else {})


def test_token_ids_count_and_usage_extension(fake):
    fake.reply = lambda path, body: (200, [
        _completion({"text": "ab", "token_ids": [5, 6], "prompt_token_ids": [1, 2, 3]}),
        _completion({"text": "c", "token_ids": [7, 8, 9]}),
        _completion({"text": "", "token_ids": [], "finish_reason": "stop"}),
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "spec_num_drafts": 3,
                                  "spec_verify_ct": 1, "spec_verified_per_step": [3], "spec_accepted_per_step": [2]}},
        "[DONE]",
    ])
    r = stream_request(Endpoint(fake.url + "/v1", "m"), ApiRequest("r", "hello", 8, seed=4))
    assert r.error is None and r.token_source == "token_ids"
    assert [n for _, n in r.emissions] == [2, 3] and r.token_ids == [5, 6, 7, 8, 9] and r.text == "abc"
    assert r.prompt_ids == [1, 2, 3] and r.finish_reason == "stop"
    record = r.record(num_drafts=3)
    assert record.output_tokens == 5 and record.num_verified == (3,) and record.num_accepted == (2,)
    assert record.token_times_s[0] == record.first_token_s and record.finish_s == record.token_times_s[-1]
    path, body, _ = fake.seen[0]
    assert path == "/v1/completions" and body["prompt"] == "hello" and body["stream"] is True
    assert body["seed"] == 4 and body["logprobs"] == 0 and body["stream_options"] == {"include_usage": True}


def test_logprobs_count_chat_and_completions(fake):
    chat = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},  # role only: no token
        {"choices": [{"index": 0, "delta": {"content": "hi there"}, "logprobs": {"content": [{}, {}, {}]}}]},
        {"choices": [{"index": 0, "delta": {"content": "!"}, "logprobs": {"content": [{}]}, "finish_reason": "length"}]},
        "[DONE]",
    ]
    fake.reply = lambda path, body: (200, chat)
    r = stream_request(Endpoint(fake.url, chat=True), ApiRequest("c", [{"role": "user", "content": "x"}], 4))
    assert r.error is None and [n for _, n in r.emissions] == [3, 1] and r.token_source == "logprobs"
    assert r.text == "hi there!" and r.token_ids == [] and r.record().finish_reason == "length"
    path, body, _ = fake.seen[-1]
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "x"}]
    assert body["logprobs"] is True and "model" not in body

    fake.reply = lambda path, body: (200, [_completion({"text": "xy", "logprobs": {"tokens": ["x", "y"]},
                                                        "finish_reason": "length"}), "[DONE]"])
    r = stream_request(Endpoint(fake.url), ApiRequest("p", [1, 2], 2))
    assert [n for _, n in r.emissions] == [2] and r.prompt_ids == [1, 2] and r.record().prompt_tokens == 2


def test_usage_deltas_and_text_fallback_reconciled(fake):
    fake.reply = lambda path, body: (200, [
        _completion({"text": "a"}, usage={"completion_tokens": 2}),
        _completion({"text": "b"}, usage={"completion_tokens": 5}),
        _completion({"text": "", "finish_reason": "length"}, usage={"completion_tokens": 5}),
        "[DONE]",
    ])
    r = stream_request(Endpoint(fake.url, logprobs=False), ApiRequest("u", "p", 5))
    assert [n for _, n in r.emissions] == [2, 3] and r.token_source == "usage"
    assert "logprobs" not in fake.seen[-1][1]

    # text only: one token per chunk with text, the final usage fixes the total on the last emission
    fake.reply = lambda path, body: (200, [
        _completion({"text": "a"}), _completion({"text": "bc"}), _completion({"text": "", "finish_reason": "stop"}),
        {"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 7}}, "[DONE]",
    ])
    r = stream_request(Endpoint(fake.url, logprobs=False), ApiRequest("t", "p", 5))
    assert [n for _, n in r.emissions] == [1, 3] and r.token_source == "text+usage"
    assert r.record().prompt_tokens == 7 and r.record().output_tokens == 4


@pytest.mark.parametrize("case", ["status", "error_event", "truncated", "empty", "bad_json"])
def test_failures_become_failed_records(fake, case):
    replies = {
        "status": (500, []),
        "error_event": (200, [_completion({"text": "a", "token_ids": [1]}), {"error": {"message": "engine died"}}]),
        "truncated": (200, [_completion({"text": "a", "token_ids": [1]})]),
        "empty": (200, [_completion({"text": "", "finish_reason": "stop"}), "[DONE]"]),
        "bad_json": (200, ["{not json"]),
    }
    fake.reply = lambda path, body: replies[case]
    r = stream_request(Endpoint(fake.url), ApiRequest("f", "p", 4))
    record = r.record()
    assert record.failed and record.finish_reason == "error"
    assert {"status": "HTTP 500", "error_event": "engine died", "truncated": "before [DONE]",
            "empty": "no tokens", "bad_json": "JSONDecodeError"}[case] in record.error


def test_connection_refused_is_a_failed_record():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = stream_request(Endpoint(f"http://127.0.0.1:{port}", timeout_s=2), ApiRequest("x", "p", 4))
    assert r.record().failed and "ConnectionRefused" in r.error


def test_api_key_is_sent_but_never_shown(fake):
    fake.reply = lambda path, body: (500, [])
    endpoint = Endpoint(fake.url, "m", api_key="sk-secret-123")
    r = stream_request(endpoint, ApiRequest("k", "p", 4))
    assert fake.seen[-1][2]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in repr(endpoint) and "sk-secret" not in r.error and "sk-secret" not in repr(r)


def _ok(path, body):
    return 200, [_completion({"text": "x", "token_ids": [1, 2], "finish_reason": "length"}), "[DONE]"]


def test_closed_loop_keeps_concurrency_and_plays_turns(fake):
    fake.reply, fake.delay_s = _ok, 0.1
    first = [ApiRequest(f"{i}:0", [i + 1], 2) for i in range(6)]
    seen = []

    def next_turn(conv, turn, response):
        seen.append((conv, turn))
        return ApiRequest(f"{conv}:1", [conv + 1, 9], 2) if turn == 0 and conv % 2 == 0 else None

    progress = []
    out = run_openai_load(Endpoint(fake.url), first, Load(concurrency=2), next_turn, on_response=progress.append)
    assert len(out) == 9 and len(progress) == 9 and fake.max_in_flight == 2
    assert sorted((r.conversation, r.turn) for r in out) == sorted([(i, 0) for i in range(6)] + [(0, 1), (2, 1), (4, 1)])
    for conv in (0, 2, 4):  # a follow-up starts after its first turn finished
        a, b = (next(r for r in out if (r.conversation, r.turn) == (conv, t)) for t in (0, 1))
        assert b.arrival_s >= a.finish_s


def test_a_failed_turn_ends_its_conversation(fake):
    fake.reply = lambda path, body: (500, []) if body["prompt"] == [2] else _ok(path, body)
    calls = []
    out = run_openai_load(Endpoint(fake.url), [ApiRequest(f"{i}:0", [i + 1], 2) for i in range(3)],
                          Load(concurrency=3), lambda c, t, r: calls.append(c) or None)
    assert len(out) == 3 and sorted(calls) == [0, 2]
    assert [r.record().failed for r in sorted(out, key=lambda r: r.conversation)] == [False, True, False]


def test_open_loop_arrivals_follow_the_seeded_poisson_draws(fake):
    fake.reply = _ok
    offsets = arrival_offsets(5, 50.0, seed=3)
    rng, t, expected = random.Random(3), 0.0, []  # the in-house load's draws (backends.inhouse.load)
    for _ in range(5):
        t += rng.expovariate(50.0)
        expected.append(t)
    assert offsets == expected
    start = time.perf_counter()
    out = run_openai_load(Endpoint(fake.url), [ApiRequest(f"{i}:0", [1], 2) for i in range(5)], Load(rate=50.0, seed=3))
    arrivals = sorted((r.conversation, r.arrival_s - start) for r in out)
    for (conv, got), want in zip(arrivals, offsets):
        assert abs(got - want) < 0.05, conv  # scheduled arrival times, not when a thread got round to it


def test_load_and_endpoint_validation():
    with pytest.raises(ValueError):
        Load()
    with pytest.raises(ValueError):
        Load(concurrency=1, rate=1.0)
    with pytest.raises(ValueError):
        Endpoint("localhost:8000")
    assert Endpoint("http://h:1/v1/").root == "http://h:1"
