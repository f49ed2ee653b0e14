"""Our OpenAI-compatible HTTP server over the in-house engine (stdlib `http.server`, no web framework).

    python -m backends.inhouse.server --target embedded --drafter-method dspark \\
        --drafter-checkpoint embedded:dspark --num-drafts 3 --port 8000

One engine thread owns the `Engine` and runs `step()` while it has work; each HTTP request thread
tokenises, submits its request through a queue and reads the tokens back from its own queue, one event
per engine emission — the prefill token, then each step's tokens (so a speculative step's accepted tokens
and bonus arrive as one SSE chunk, as from vLLM). The engine is the one the in-house backend runs (same loading, policy and stop
tokens), so greedy output through the server equals the in-house backend's for the same prompt ids.

Endpoints: POST /v1/completions (`prompt`: text or token ids) and /v1/chat/completions (`messages`,
through the tokenizer's chat template as `harness.tasks.tokenize_messages`), streaming (SSE) or not;
GET /health, /v1/models, /version, /metrics (Prometheus text: vLLM's spec-decode counter names, see
`backends.openai.metrics`, plus request and token counters, and vLLM's TTFT histogram
`vllm:time_to_first_token_seconds`, timed from the POST's arrival to its first token chunk written).

Extensions of the OpenAI schema: each choice carries `token_ids` (the first streamed chunk also
`prompt_token_ids`); `usage` carries the request's speculative steps — `spec_num_drafts` (γ),
`spec_verify_ct`, `spec_verified_per_step`, `spec_accepted_per_step`, and with a confidence head
`spec_confidence_logits_per_step` (the raw logit of each verified draft, so calibration is measured
through the server too) — in the final chunk of a stream
(with `stream_options.include_usage`) or the response. Not supported (400): n > 1, best_of > 1, echo,
top_p ≠ 1, penalties, string `stop`; `stop_token_ids` and `ignore_eos` (vLLM's) are. The engine computes
no logprobs: asked for, they list the tokens with `logprob: null`. A streamed request whose client goes away
is aborted (`Engine.abort`): its slot is free for the next step, and /metrics counts it under
finished_reason="abort".

Timing: `Engine.step()` admits (prefills) and then runs one speculative step in one call, so a request's
prefill token leaves the server together with its first step's tokens (two chunks, at once): TTFT seen
by a client includes that first step, where the in-house backend's TTFT ends at the prefill.
"""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from backends.inhouse.engine import Completed, Engine, Request
from harness.suite.schema import HEADS, METHODS, POLICIES, WEIGHTED_METHODS  # the suite's names are the choices


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


# ------------------------------------------------------------------ the engine thread


@dataclass
class _Abort:
    """An HTTP thread's request to drop a request from the engine (its client went away)."""

    request_id: str


@dataclass
class _Stream:
    """One request's link between the engine thread and its HTTP thread."""

    request: Request
    events: queue.Queue  # ("tokens", ids, t) … then ("done", Completed) or ("error", message)
    sent_tokens: int = 0
    sent_emissions: int = 0
    seen_steps: int = 0


TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # vLLM's buckets for the same histogram


@dataclass
class Counters:
    """What /metrics exports; updated by the engine thread at every step, read under the lock."""

    num_drafts: int  # γ: the positions of the per-position counter
    drafts: int = 0  # (request, step) pairs that verified ≥ 1 draft (vLLM's num_drafts)
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    steps: int = 0  # every verify step, drafts or not
    prompt_tokens: int = 0
    generation_tokens: int = 0
    received: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason → requests
    failed: int = 0
    # TTFT as the server sees it (vLLM's histogram): POST received → first token chunk written, streams only
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))  # per bucket, not cumulative
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.num_drafts

    def observe_ttft(self, seconds: float) -> None:
        with self.lock:
            self.ttft_sum_s += seconds
            self.ttft_count += 1
            bucket = next((i for i, le in enumerate(TTFT_BUCKETS_S) if seconds <= le), None)
            if bucket is not None:
                self.ttft_counts[bucket] += 1

    def observe_steps(self, verified: list[int], accepted: list[int]) -> None:
        with self.lock:
            for v, a in zip(verified, accepted):
                self.steps += 1
                self.drafts += v > 0
                self.draft_tokens += v
                self.accepted += a
                for k in range(a):
                    self.accepted_per_pos[k] += 1

    def prometheus(self, model: str, running: int, waiting: int) -> str:
        m = f'model_name="{_escape(model)}"'
        rows = [
            ("vllm:spec_decode_num_drafts_total", "counter", "Verify steps (per request) with at least one draft.",
             [(m, self.drafts)]),
            ("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.", [(m, self.draft_tokens)]),
            ("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", [(m, self.accepted)]),
            ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
             "Accepted draft tokens per position (from 0).",
             [(f'{m},position="{k}"', n) for k, n in enumerate(self.accepted_per_pos)]),
            ("dspark:spec_decode_num_steps_total", "counter", "Verify steps (per request), with or without drafts.",
             [(m, self.steps)]),
            ("vllm:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", [(m, self.prompt_tokens)]),
            ("vllm:generation_tokens_total", "counter", "Generated tokens.", [(m, self.generation_tokens)]),
            ("vllm:request_success_total", "counter", "Finished requests by finish reason.",
             [(f'{m},finished_reason="{r}"', n) for r, n in sorted(self.finished.items())]),
            ("dspark:requests_received_total", "counter", "Requests received (valid or not).", [(m, self.received)]),
            ("dspark:requests_failed_total", "counter", "Requests rejected or failed.", [(m, self.failed)]),
            ("vllm:num_requests_running", "gauge", "Requests in the engine's batch.", [(m, running)]),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting for a slot.", [(m, waiting)]),
        ]
        lines = []
        with self.lock:
            for name, kind, help_text, samples in rows:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
                lines += [f"{name}{{{labels}}} {float(value)}" for labels, value in samples]
            name = "vllm:time_to_first_token_seconds"
            lines += [f"# HELP {name} Time to first token (request received to first token chunk written).",
                      f"# TYPE {name} histogram"]
            cumulative = list(itertools.accumulate(self.ttft_counts))
            lines += [f'{name}_bucket{{{m},le="{le}"}} {float(n)}' for le, n in zip(TTFT_BUCKETS_S, cumulative)]
            lines += [f'{name}_bucket{{{m},le="+Inf"}} {float(self.ttft_count)}',
                      f"{name}_sum{{{m}}} {self.ttft_sum_s}", f"{name}_count{{{m}}} {float(self.ttft_count)}"]
        return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class EngineLoop:
    """The engine thread: submits what request threads queue, steps while there is work, publishes tokens."""

    def __init__(self, engine: Engine, counters: Counters):
        self.engine, self.counters = engine, counters
        self.inbox: queue.Queue[_Stream | _Abort] = queue.Queue()
        self.streams: dict[str, _Stream] = {}  # request id → stream, engine thread only
        self.error: str | None = None
        self._stop = threading.Event()
        self._ids = itertools.count()
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> EngineLoop:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)

    def next_id(self) -> str:
        return f"cmpl-{next(self._ids)}"

    def submit(self, request: Request) -> queue.Queue:
        if self.error is not None:
            raise BadRequest(f"the engine failed: {self.error}", status=503)
        stream = _Stream(request, queue.Queue())
        self.inbox.put(stream)
        return stream.events

    def abort(self, request_id: str) -> None:
        """Ask the engine thread to drop a request (its client is gone); a no-op once it has finished."""
        self.inbox.put(_Abort(request_id))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._take_inbox(block=not self.engine.has_work)
                if self.engine.has_work:
                    self._publish(self.engine.step())
            except Exception as exc:  # noqa: BLE001 — fail every request in flight, refuse new ones
                self.error = f"{type(exc).__name__}: {exc}"
                print(f"engine failed: {self.error}", file=sys.stderr, flush=True)
                for stream in list(self.streams.values()):
                    stream.events.put(("error", self.error))
                self.streams.clear()
                while not self.inbox.empty():
                    self.inbox.get_nowait().events.put(("error", self.error))
                return

    def _take_inbox(self, block: bool) -> None:
        try:
            stream = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(stream, _Abort):
                self._abort(stream.request_id)
            else:
                self._admit(stream)
            try:
                stream = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, stream: _Stream) -> None:
        stream.request.arrival_s = None  # the engine clock stamps it on submission
        try:
            self.engine.submit(stream.request)
        except ValueError as exc:  # checked by the HTTP thread already; kept from killing the loop
            stream.events.put(("error", str(exc)))
        else:
            self.streams[stream.request.request_id] = stream
            with self.counters.lock:
                self.counters.prompt_tokens += len(stream.request.prompt_ids)

    def _abort(self, request_id: str) -> None:
        stream = self.streams.pop(request_id, None)
        done = self.engine.abort(request_id) if stream is not None else None
        if done is not None:
            with self.counters.lock:
                self.counters.finished["abort"] = self.counters.finished.get("abort", 0) + 1
                self.counters.generation_tokens += len(done.output_ids) - stream.sent_tokens
            self.counters.observe_steps(done.counters.num_verified[stream.seen_steps:],
                                        done.counters.num_accepted[stream.seen_steps:])

    def _publish(self, done: list[Completed]) -> None:
        finished = {c.request.request_id: c for c in done}
        active = {running.request.request_id: running for running in self.engine.running()}
        for request_id, stream in list(self.streams.items()):
            source = finished.get(request_id) or active.get(request_id)
            if source is None:  # still waiting for a slot
                continue
            output = source.output_ids if isinstance(source, Completed) else source.output
            counters = source.counters
            self.counters.observe_steps(counters.num_verified[stream.seen_steps:], counters.num_accepted[stream.seen_steps:])
            stream.seen_steps = counters.num_steps
            # one event per engine emission (the prefill token, then each step's tokens), as the engine times them
            # (a request admitted in this step() gets its prefill token and its first step's tokens together)
            before = stream.sent_tokens
            for t, n in source.emissions[stream.sent_emissions:]:
                ids = output[stream.sent_tokens: stream.sent_tokens + n]
                if ids:
                    stream.events.put(("tokens", list(ids), t))
                stream.sent_tokens += len(ids)
            stream.sent_emissions = len(source.emissions)
            with self.counters.lock:
                self.counters.generation_tokens += stream.sent_tokens - before
            if isinstance(source, Completed):
                with self.counters.lock:
                    reason = source.finish_reason
                    self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1
                stream.events.put(("done", source))
                del self.streams[request_id]


# ------------------------------------------------------------------ the HTTP side


@dataclass
class Served:
    """Everything the handlers share."""

    loop: EngineLoop
    tokenizer: Any
    stop_token_ids: tuple[int, ...]
    model_name: str
    max_context: int
    version: str
    access_log: bool = False


def _prompt_ids(served: Served, body: dict, chat: bool) -> list[int]:
    if chat:
        from harness.tasks import tokenize_messages

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", "messages")
        flat = []
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise BadRequest("each message needs a role and content", "messages")
            content = m.get("content") or ""
            if isinstance(content, list):  # content parts: text only
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            flat.append({"role": m["role"], "content": content})
        return tokenize_messages(served.tokenizer, flat)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return list(served.tokenizer.encode(prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = len(served.tokenizer)
        if any(not 0 <= t < vocab for t in prompt):
            raise BadRequest(f"token ids must lie in [0, {vocab})", "prompt")
        return list(prompt)
    raise BadRequest("prompt must be a string or a non-empty list of token ids (one prompt per request)", "prompt")


def build_request(served: Served, body: dict, chat: bool, request_id: str) -> Request:
    """Validate an OpenAI body and build the engine request (BadRequest says what is wrong)."""
    model = body.get("model")
    if model is not None and model != served.model_name:
        raise BadRequest(f"the model `{model}` does not exist; this server serves `{served.model_name}`", "model", 404)
    for key, ok in (("n", 1), ("best_of", 1), ("echo", False), ("top_p", 1), ("frequency_penalty", 0),
                    ("presence_penalty", 0)):
        if body.get(key) not in (None, ok):
            raise BadRequest(f"{key}={body[key]!r} is not supported (only {ok!r})", key)
    if body.get("stop"):
        raise BadRequest("string stop sequences are not supported; use stop_token_ids", "stop")
    prompt = _prompt_ids(served, body, chat)
    max_tokens = body.get("max_completion_tokens") if chat else None
    max_tokens = max_tokens if max_tokens is not None else body.get("max_tokens")
    if max_tokens is None:
        max_tokens = served.max_context - len(prompt) if chat else 16
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest(f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    if len(prompt) + max_tokens > served.max_context:
        raise BadRequest(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the context "
                         f"({served.max_context})", "max_tokens")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
        raise BadRequest(f"temperature must be a number ≥ 0, got {temperature!r}", "temperature")
    seed = body.get("seed")
    if seed is None:
        seed = random.getrandbits(63)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise BadRequest(f"seed must be an integer, got {seed!r}", "seed")
    stop = () if body.get("ignore_eos") else served.stop_token_ids
    extra = body.get("stop_token_ids") or []
    if not isinstance(extra, list) or not all(isinstance(t, int) for t in extra):
        raise BadRequest("stop_token_ids must be a list of token ids", "stop_token_ids")
    return Request(request_id, prompt, max_tokens, float(temperature), seed % (2**63),
                   tuple(sorted(set(stop) | set(extra))))


class _Text:
    """Incremental detokenisation: each call returns the text the new ids add (held back while it ends in
    an incomplete character); the pieces join to decode(all ids)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.sent = tokenizer, [], ""

    def add(self, ids: list[int], final: bool = False) -> str:
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        delta = text[len(self.sent):]  # (a tokenizer that rewrote earlier text cannot take it back)
        self.sent = text
        return delta


def _usage(prompt_tokens: int, done: Completed) -> dict[str, Any]:
    c = done.counters
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(done.output_ids),
             "total_tokens": prompt_tokens + len(done.output_ids), "spec_num_drafts": c.num_drafts,
             "spec_verify_ct": c.num_steps, "spec_verified_per_step": list(c.num_verified),
             "spec_accepted_per_step": list(c.num_accepted)}
    if c.confidence_logits and len(c.confidence_logits) == c.num_steps:  # drafts with a confidence head
        usage["spec_confidence_logits_per_step"] = [list(step) for step in c.confidence_logits]
    return usage


def _logprobs(tokenizer, ids: list[int], chat: bool, offset: int) -> dict[str, Any]:
    tokens = tokenizer.convert_ids_to_tokens(ids)
    if chat:
        return {"content": [{"token": t, "logprob": None, "top_logprobs": []} for t in tokens]}
    return {"tokens": tokens, "token_logprobs": [None] * len(ids), "top_logprobs": None,
            "text_offset": [offset] * len(ids)}


class Handler(BaseHTTPRequestHandler):
    server_version = "dspark-inhouse"
    protocol_version = "HTTP/1.1"
    served: Served  # set on the class built by make_server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 — the base class's name
        if self.served.access_log:
            super().log_message(format, *args)

    # ---------------------------------------------------------------- GET

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        loop = self.served.loop
        if path == "/health":
            if loop.error is not None:
                self._json(503, {"status": "error", "error": loop.error})
            else:
                self._json(200, {"status": "ok"})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.served.model_name, "object": "model",
                                                         "owned_by": "dspark-harness",
                                                         "max_model_len": self.served.max_context}]})
        elif path == "/version":
            self._json(200, {"version": self.served.version})
        elif path == "/metrics":
            engine = loop.engine
            text = loop.counters.prometheus(self.served.model_name, engine.num_active, engine.num_waiting)
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"no route GET {path}")

    # ---------------------------------------------------------------- POST

    def do_POST(self) -> None:
        received_s = time.perf_counter()  # the server's TTFT starts here (vLLM: the request's arrival)
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"no route POST {path}")
            return
        chat = path == "/v1/chat/completions"
        counters = self.served.loop.counters
        with counters.lock:
            counters.received += 1
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            request = build_request(self.served, body, chat, self.served.loop.next_id())
            events = self.served.loop.submit(request)
        except (BadRequest, ValueError) as exc:
            with counters.lock:
                counters.failed += 1
            status, param = (exc.status, exc.param) if isinstance(exc, BadRequest) else (400, None)
            self._error(status, str(exc), param)
            return
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(request, events, chat, bool(body.get("logprobs")), include_usage, received_s)
        else:
            self._complete(request, events, chat, bool(body.get("logprobs")))

    def _complete(self, request: Request, events: queue.Queue, chat: bool, logprobs: bool) -> None:
        while True:
            kind, *payload = events.get()
            if kind == "error":
                self._count_failure()
                self._error(500, payload[0], kind="server_error")
                return
            if kind == "done":
                break
        done: Completed = payload[0]
        tok = self.served.tokenizer
        text = tok.decode(done.output_ids, skip_special_tokens=True)
        choice: dict[str, Any] = {"index": 0, "finish_reason": done.finish_reason, "token_ids": list(done.output_ids),
                                  "logprobs": _logprobs(tok, done.output_ids, chat, 0) if logprobs else None}
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        self._json(200, {"id": request.request_id, "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": self.served.model_name, "choices": [choice],
                         "usage": _usage(len(request.prompt_ids), done)})

    def _stream(self, request: Request, events: queue.Queue, chat: bool, logprobs: bool, include_usage: bool,
                received_s: float | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        head = {"id": request.request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.served.model_name}
        text, first, offset = _Text(self.served.tokenizer), True, 0
        try:
            while True:
                kind, *payload = events.get()
                if kind == "error":
                    self._count_failure()
                    self._event({"error": {"message": payload[0], "type": "server_error", "code": 500}})
                    break
                if kind == "tokens":  # one engine step's tokens: one chunk, sent at once
                    ids = payload[0]
                    self._event(self._chunk(head, ids, text.add(ids), None, first, request, chat, logprobs, offset))
                    if first and received_s is not None:
                        self.served.loop.counters.observe_ttft(time.perf_counter() - received_s)
                    offset, first = offset + len(ids), False
                    continue
                done: Completed = payload[0]
                self._event(self._chunk(head, [], text.add([], final=True), done.finish_reason, first, request, chat,
                                        logprobs, offset))
                if include_usage:
                    self._event(head | {"choices": [], "usage": _usage(len(request.prompt_ids), done)})
                break
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.served.loop.abort(request.request_id)  # the client left: free its slot

    def _chunk(self, head, ids, delta, finish_reason, first, request, chat, logprobs, offset) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "token_ids": ids,
                                  "logprobs": _logprobs(self.served.tokenizer, ids, chat, offset) if logprobs and ids else None}
        if chat:
            choice["delta"] = ({"role": "assistant"} if first else {}) | {"content": delta}
        else:
            choice["text"] = delta
        if first:
            choice["prompt_token_ids"] = list(request.prompt_ids)
        return head | {"choices": [choice]}

    def _event(self, payload: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")
        self.wfile.flush()

    def _count_failure(self) -> None:
        counters = self.served.loop.counters
        with counters.lock:
            counters.failed += 1

    def _json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> None:
        if status == 404 and kind == "invalid_request_error":
            kind = "not_found_error"
        self._json(status, {"error": {"message": message, "type": kind, "param": param, "code": status},
                            "object": "error", "message": message})


# ------------------------------------------------------------------ building and running


def load_engine(args: argparse.Namespace) -> tuple[Engine, Any, tuple[int, ...], str]:
    """The engine the in-house backend would build for a cell with these options: (engine, tokenizer,
    stop token ids, version)."""
    import torch
    import transformers

    from backends.inhouse.adapter import InhouseBackend
    from backends.inhouse.engine import EngineConfig
    from harness.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

    backend = InhouseBackend(device=args.device, num_slots=args.num_slots, max_context=args.max_context,
                             num_threads=args.num_threads)
    cell = Cell("inhouse", TargetSpec("served", args.target, args.dtype),
                DrafterSpec(args.drafter_method, args.drafter_method, args.drafter_checkpoint, args.head),
                args.num_drafts, TaskSpec("serve", 1, 1, args.policy_temperature),
                PolicySpec(args.policy, args.verify_length, args.threshold, args.sps_table), concurrency=args.num_slots)
    backend.check(cell)
    target = backend._target(cell)
    drafter, info = backend._drafter(cell, target)
    layer_ids = tuple(getattr(drafter, "target_layer_ids", ()) or ())
    if target.model.layer_ids != layer_ids:
        target.model.set_layer_ids(layer_ids)
    sts = info.get("sts", {}).get(f"{args.policy_temperature:g}")
    policy, note = backend._policy(cell, target, sts, drafter)
    if note:
        print(note, file=sys.stderr, flush=True)
    max_context = min(args.max_context, getattr(target.model.config, "max_position_embeddings", 1 << 30))
    engine = Engine(target.model, drafter, EngineConfig(num_slots=args.num_slots, max_context=max_context,
                                                        num_drafts=max(args.num_drafts, 1)), policy)
    version = f"dspark-inhouse/torch-{torch.__version__}/transformers-{transformers.__version__}"
    return engine, target.tokenizer, target.stop_token_ids, version


def make_server(engine: Engine, tokenizer, stop_token_ids: tuple[int, ...], *, host: str = "127.0.0.1",
                port: int = 8000, model_name: str = "embedded", version: str = "dspark-inhouse",
                access_log: bool = False) -> tuple[ThreadingHTTPServer, EngineLoop]:
    """An HTTP server (not yet serving) and its started engine loop, e.g. for a test in one process;
    `port=0` picks a free port (`server.server_address[1]`)."""
    loop = EngineLoop(engine, Counters(engine.num_drafts)).start()
    served = Served(loop, tokenizer, tuple(stop_token_ids), model_name, engine.config.max_context, version, access_log)
    handler = type("ServedHandler", (Handler,), {"served": served})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server, loop


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="harness serve", description="Serve the in-house engine over an OpenAI-compatible API.")
    p.add_argument("--target", default="embedded", help="target path, hub id or 'embedded' (default)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--drafter-method", default="none", choices=METHODS)
    p.add_argument("--drafter-checkpoint", default=None,
                   help="draft checkpoint directory or embedded:<draft>; draft_model: a causal LM (or 'embedded')")
    p.add_argument("--head", default=None, choices=HEADS, help="dspark head the checkpoint must have")
    p.add_argument("--num-drafts", type=int, default=None, help="γ (default 3 with a drafter, 0 without)")
    p.add_argument("--policy", default="full", choices=POLICIES)
    p.add_argument("--verify-length", type=int, default=None, help="static: γ' ≤ γ")
    p.add_argument("--threshold", type=float, default=None, help="threshold: σ(c_k) cut-off")
    p.add_argument("--sps-table", default=None,
                   help="scheduler/budget: SPS(B) table JSON; adaptive: a store with step costs (default: profile here)")
    p.add_argument("--policy-temperature", type=float, default=0.0,
                   help="decoding temperature whose STS temperatures calibrate the policy's confidences")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: a free port (printed)")
    p.add_argument("--num-slots", type=int, default=64, help="requests decoded together at most")
    p.add_argument("--max-context", type=int, default=2048, help="prompt + output tokens per request")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda if available)")
    p.add_argument("--num-threads", type=int, default=None, help="torch threads")
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: --target)")
    p.add_argument("--access-log", action="store_true", help="log every HTTP request to stderr")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.num_drafts is None:
        args.num_drafts = 0 if args.drafter_method == "none" else 3
    if args.drafter_method == "none" and args.num_drafts != 0:
        p.error("--num-drafts must be 0 without a drafter")
    if args.drafter_method != "none" and args.num_drafts < 1:
        p.error("--num-drafts must be ≥ 1 with a drafter")
    if args.drafter_method in WEIGHTED_METHODS and not args.drafter_checkpoint:
        p.error(f"--drafter-method {args.drafter_method} needs --drafter-checkpoint")
    if args.policy == "static" and args.verify_length is None:
        p.error("--policy static needs --verify-length")
    if args.policy == "threshold" and args.threshold is None:
        p.error("--policy threshold needs --threshold")
    if args.num_slots < 1 or args.max_context < 2:
        p.error("--num-slots must be ≥ 1 and --max-context ≥ 2")


def serve_main(argv: list[str] | None = None) -> int:
    """`harness serve …` / `python -m backends.inhouse.server …`: load, listen, serve until SIGTERM/SIGINT."""
    from backends.base import BackendError

    p = parser()
    args = p.parse_args(argv)
    check_args(p, args)
    try:
        engine, tokenizer, stop_ids, version = load_engine(args)
    except BackendError as exc:
        print(f"harness serve: {exc}", file=sys.stderr)
        return 2
    server, loop = make_server(engine, tokenizer, stop_ids, host=args.host, port=args.port,
                               model_name=args.served_model_name or args.target, version=version,
                               access_log=args.access_log)

    def terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    host, port = server.server_address[:2]
    print(f"serving {args.served_model_name or args.target} ({args.drafter_method}, γ={args.num_drafts}, "
          f"policy {args.policy}) on http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        loop.stop()
        print("server stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve_main(sys.argv[1:]))
