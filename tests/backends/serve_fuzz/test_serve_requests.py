"""Fuzz table: a request to `harness serve` → the status, the error's `param` and a phrase of its message.

Every answer that is not a 200 must be the OpenAI error object ({"error": {message, type, param, code}});
after every row /metrics must add up (received = failed + finished + in flight) with nothing in flight, and
the row's request must have moved `received` by exactly one (completion routes) and landed in the right
outcome. The next class of bad input is one row.
"""

from __future__ import annotations

import json

import pytest

from backends.inhouse.serving.abuse import consistent, metrics, post

C, CHAT = "/v1/completions", "/v1/chat/completions"


def body(**fields) -> bytes:
    return json.dumps({"prompt": [3, 17, 42], "max_tokens": 2, "temperature": 0} | fields).encode()


def chat(messages, **fields) -> bytes:
    return json.dumps({"messages": messages, "max_tokens": 2, "temperature": 0} | fields).encode()


def raw(text: str) -> bytes:
    return text.encode()


USER = [{"role": "user", "content": "Hello"}]

# (id, route, body, status, param, phrase)
ROWS = [
    # well-formed: the counters' success side
    ("ok", C, body(), 200, None, None),
    ("ok text prompt", C, body(prompt="Hello there"), 200, None, None),
    ("ok stream", C, body(stream=True, stream_options={"include_usage": True}), 200, None, None),
    ("ok chat", CHAT, chat(USER), 200, None, None),
    ("ok large body", C, body(user="u" * (128 << 10)), 200, None, None),  # parsed off the event loop
    ("NaN in a large body", C, raw('{"prompt": [3], "pad": "' + "p" * (128 << 10) + '", "temperature": NaN}'), 400,
     "temperature", "finite"),
    ("ok chat parts", CHAT, chat([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]), 200, None, None),
    # prompt
    ("empty prompt", C, body(prompt=""), 400, "prompt", "empty"),
    ("empty id list", C, body(prompt=[]), 400, "prompt", "non-empty"),
    ("no prompt", C, json.dumps({"max_tokens": 2}).encode(), 400, "prompt", "required"),
    ("negative id", C, body(prompt=[-1]), 400, "prompt", "token ids must lie in"),
    ("id past vocab", C, body(prompt=[10**9]), 400, "prompt", "token ids must lie in"),
    ("float id", C, body(prompt=[1.5]), 400, "prompt", "token ids"),
    ("prompt object", C, body(prompt={"a": 1}), 400, "prompt", "string or a non-empty list"),
    # temperature
    ("temperature NaN", C, raw('{"prompt": [3], "temperature": NaN}'), 400, "temperature", "finite"),
    ("temperature Infinity", C, raw('{"prompt": [3], "temperature": Infinity}'), 400, "temperature", "finite"),
    ("temperature -Infinity", C, raw('{"prompt": [3], "temperature": -Infinity}'), 400, "temperature", "finite"),
    ("temperature 1e308", C, body(temperature=1e308), 400, "temperature", "[0, 100]"),
    ("temperature negative", C, body(temperature=-0.5), 400, "temperature", "[0, 100]"),
    ("temperature string", C, body(temperature="hot"), 400, "temperature", "number"),
    ("temperature bool", C, body(temperature=True), 400, "temperature", "number"),
    ("NaN elsewhere", C, raw('{"prompt": [3], "seed": NaN}'), 400, "seed", "finite"),
    # max_tokens
    ("max_tokens 0", C, body(max_tokens=0), 400, "max_tokens", "positive integer"),
    ("max_tokens negative", C, body(max_tokens=-3), 400, "max_tokens", "positive integer"),
    ("max_tokens float", C, body(max_tokens=1.5), 400, "max_tokens", "positive integer"),
    ("max_tokens string", C, body(max_tokens="8"), 400, "max_tokens", "positive integer"),
    ("max_tokens past context", C, body(max_tokens=10**6), 400, "max_tokens", "exceeds the context"),
    ("max_tokens 400 digits", C, raw('{"prompt": [3], "max_tokens": ' + "9" * 400 + "}"), 400, "max_tokens",
     "exceeds the context"),
    ("max_completion_tokens", CHAT, chat(USER, max_completion_tokens=0), 400, "max_completion_tokens",
     "positive integer"),
    # model and unsupported sampling
    ("unknown model", C, body(model="other"), 404, "model", "does not exist"),
    ("model not a string", C, body(model=["x"]), 404, "model", "does not exist"),
    ("n 2", C, body(n=2), 400, "n", "not supported"),
    ("top_p", C, body(top_p=0.5), 400, "top_p", "not supported"),
    ("echo", C, body(echo=True), 400, "echo", "not supported"),
    ("string stop", C, body(stop="\n"), 400, "stop", "stop_token_ids"),
    # streaming and other options
    ("stream string", C, body(stream="yes"), 400, "stream", "true or false"),
    ("stream_options string", C, body(stream=True, stream_options="yes"), 400, "stream_options", "an object"),
    ("stream_options list", C, body(stream=True, stream_options=[1]), 400, "stream_options", "an object"),
    ("include_usage string", C, body(stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage", "true or false"),
    ("logprobs string", C, body(logprobs="x"), 400, "logprobs", "logprobs must be"),
    ("logprobs 99", C, body(logprobs=99), 400, "logprobs", "logprobs must be"),
    ("seed string", C, body(seed="x"), 400, "seed", "integer"),
    ("seed float", C, body(seed=1.5), 400, "seed", "integer"),
    ("stop_token_ids string", C, body(stop_token_ids="x"), 400, "stop_token_ids", "list of token ids"),
    ("stop_token_ids negative", C, body(stop_token_ids=[-1]), 400, "stop_token_ids", "list of token ids"),
    ("ignore_eos string", C, body(ignore_eos="no"), 400, "ignore_eos", "true or false"),
    # chat messages
    ("no messages", CHAT, json.dumps({"max_tokens": 2}).encode(), 400, "messages", "non-empty list"),
    ("messages string", CHAT, chat("hi"), 400, "messages", "non-empty list"),
    ("messages empty", CHAT, chat([]), 400, "messages", "non-empty list"),
    ("message not an object", CHAT, chat([1]), 400, "messages[0]", "an object"),
    ("role int", CHAT, chat([{"role": 5, "content": "x"}]), 400, "messages[0].role", "one of"),
    ("role unknown", CHAT, chat([{"role": "wizard", "content": "x"}]), 400, "messages[0].role", "one of"),
    ("role missing", CHAT, chat([{"content": "x"}]), 400, "messages[0].role", "one of"),
    ("content int", CHAT, chat([{"role": "user", "content": 5}]), 400, "messages[0].content", "string or a list"),
    ("content object", CHAT, chat([{"role": "user", "content": {"a": 1}}]), 400, "messages[0].content",
     "string or a list"),
    ("content image part", CHAT, chat([{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "messages[0].content[0]", "text part"),
    ("content part int", CHAT, chat([USER[0], {"role": "user", "content": [5]}]), 400, "messages[1].content[0]",
     "text part"),
    # the body itself
    ("bad JSON", C, raw('{"prompt": [3'), 400, None, "not valid JSON"),
    ("JSON array", C, raw("[1, 2]"), 400, None, "JSON object"),
    ("JSON string", C, raw('"prompt"'), 400, None, "JSON object"),
    ("JSON null", C, raw("null"), 400, None, "JSON object"),
    ("empty body", C, b"", 400, None, "JSON object"),
    ("not UTF-8", C, b'{"prompt": "\xff\xfe"}', 400, None, "not UTF-8"),
    ("deep brackets", C, raw("[" * 20000), 400, None, "not valid JSON"),
    ("deep but valid", C, raw('{"prompt": [3], "x": ' + "[" * 100 + "]" * 100 + "}"), 400, "x", "nested deeper"),
    ("5000-digit int", C, raw('{"prompt": [3], "seed": ' + "7" * 5000 + "}"), 400, None, "not valid JSON"),
    ("oversized body", C, body(prompt="a" * (512 << 10)), 413, None, "exceeds the server's limit"),
]


@pytest.mark.parametrize("route,data,status,param,phrase", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_request_table(served, route, data, status, param, phrase):
    before = metrics("127.0.0.1", served.port)
    got, answer = post("127.0.0.1", served.port, route, data)
    after = metrics("127.0.0.1", served.port)
    assert got == status, answer
    if status != 200:
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
        assert error["param"] == param and phrase in error["message"], error
        assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        assert "\n" not in error["message"] and len(error["message"]) < 400
    assert consistent(after) and after["requests_in_flight"] == 0, after
    assert after["requests_received_total"] - before["requests_received_total"] == 1
    moved = "requests_failed_total" if status != 200 else "request_success_total"
    assert after[moved] - before.get(moved, 0.0) == 1, (moved, before, after)


# (id, method, path, status, phrase): requests outside the completion routes, counted nowhere
OTHER = [
    ("no route", "POST", "/v1/nothing", 404, "no route POST /v1/nothing"),
    ("wrong method", "GET", "/v1/completions", 405, "GET is not allowed"),
    ("no route GET", "GET", "/admin", 404, "no route GET /admin"),
]


@pytest.mark.parametrize("method,path,status,phrase", [r[1:] for r in OTHER], ids=[r[0] for r in OTHER])
def test_other_routes_answer_json_errors(served, method, path, status, phrase):
    import http.client

    before = metrics("127.0.0.1", served.port)
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request(method, path, b"{}" if method == "POST" else None)
    response = conn.getresponse()
    error = json.loads(response.read())["error"]
    conn.close()
    assert response.status == status and phrase in error["message"] and error["code"] == status
    after = metrics("127.0.0.1", served.port)
    assert after["requests_received_total"] == before["requests_received_total"] and consistent(after)
