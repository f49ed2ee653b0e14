"""A streaming client for OpenAI-compatible servers and the load that drives it (asyncio + aiohttp).

    from backends.openai.client import ApiRequest, Endpoint, Load, run_openai_load

    endpoint = Endpoint("http://127.0.0.1:8000", model="Qwen/Qwen3-8B")         # chat=False: /v1/completions
    first = [ApiRequest(f"{i}:0", prompt=ids, max_tokens=256) for i, ids in enumerate(prompt_ids)]
    responses = run_openai_load(endpoint, first, Load(concurrency=4))          # every turn, in finish order
    records = [r.record(num_drafts=3) for r in responses]                      # harness RequestRecords

One request is one streamed POST (`stream: true`) to /v1/completions (`prompt`: text or a list of
token ids, which vLLM, SGLang and our server accept) or /v1/chat/completions (`messages`). Each
server-sent event is one *chunk*; the client times every chunk on arrival (`time.perf_counter`, the
clock of `RequestRecord`) and counts the tokens in it. Token counting rule, first that applies per chunk:

  1. `choices[0].token_ids` (our server; vLLM with `return_token_ids`): their number;
  2. `choices[0].logprobs` (asked for unless `Endpoint.logprobs=False`): completions' `tokens` list,
     chat's `content` list — one entry per token;
  3. `usage.completion_tokens` in the chunk (vLLM `continuous_usage_stats`): the increase since the last chunk;
  4. otherwise 1 if the chunk carries text, else 0 (a role-only or usage-only chunk).
  After the stream, if only rule 4 counted and the final `usage.completion_tokens` differs, the last
  emission absorbs the difference (one with no text, e.g. a lone stop token, still counts).
A chunk's top-level `metrics.speculative_decoding` (vLLM's per-request acceptance) is kept as the `spec_*`
fields of `StreamedResponse.usage` (`backends.openai.metrics.per_request_usage`).
`StreamedResponse.token_source` says which rules counted. A chunk's tokens share its arrival time, so a
speculative step that emits several tokens in one chunk is one emission event, as in the engine.

Failures (connection refused, HTTP status ≠ 200, an `error` event, a broken stream, no tokens) never
raise: the response carries `error`, its record is a failed request, and the load goes on.

Transport: one asyncio event loop per load and one pooled keep-alive `aiohttp.ClientSession` (as vLLM's
bench and AIPerf drive servers): a connection is reused by the next request once its stream ends, no
thread per request, and chunks are timed on arrival by the loop (`clock`), so a busy client adds no
per-thread scheduling delay to TTFT at high concurrency. `stream_request` is the same for one request,
from synchronous code. The session never reads $http_proxy (`trust_env=False`): requests go straight
to the server.

The API key (`Endpoint.api_key`) is sent as a bearer token only; it is kept out of repr and messages.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp

from backends.openai.metrics import per_request_usage
from contracts.records import RequestRecord

Clock = Callable[[], float]


@dataclass(frozen=True)
class Endpoint:
    """Where requests go and how they are shaped."""

    base_url: str  # http(s)://host:port[/prefix]; a trailing /v1 is accepted (OpenAI SDK style) and dropped
    model: str | None = None  # the body's `model`; None: left out (servers with one model accept that)
    chat: bool = False  # True: /v1/chat/completions with `messages`; False: /v1/completions with `prompt`
    api_key: str | None = field(default=None, repr=False, compare=False)  # bearer token; never logged
    timeout_s: float = 600.0  # socket timeout: connect, and each read of the stream
    logprobs: bool = True  # ask for per-token logprobs (rule 2 of the token count)
    extra_body: Mapping[str, Any] = field(default_factory=dict, hash=False)  # merged into every body

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port][/prefix], got {self.base_url!r}")

    @property
    def root(self) -> str:
        """The base URL without a trailing slash or /v1: paths below are /v1/…, /metrics, /health."""
        url = self.base_url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url

    def url(self, path: str) -> str:
        return self.root + path

    def session(self, max_connections: int = 0) -> aiohttp.ClientSession:
        """A pooled keep-alive session for this endpoint (`max_connections` 0: no limit). `timeout_s`
        bounds the connect and each read of a stream, not the whole request (a long answer may stream
        for minutes). Call inside a running event loop; close it when the load is done."""
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s)
        return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, auto_decompress=True,
                                     read_bufsize=1 << 22)  # one SSE line may carry a whole request's step lists

    def headers(self) -> dict[str, str]:
        out = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out


@dataclass
class ApiRequest:
    """One turn to send. `prompt`: text or token ids (completions) or chat messages (chat)."""

    request_id: str
    prompt: str | Sequence[int] | Sequence[Mapping[str, Any]]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # per request, merged after the endpoint's

    def body(self, endpoint: Endpoint) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature, "stream": True,
                                "stream_options": {"include_usage": True}}
        if endpoint.model is not None:
            body["model"] = endpoint.model
        if endpoint.chat:
            body["messages"] = [dict(m) for m in self.prompt]
            if endpoint.logprobs:
                body |= {"logprobs": True, "top_logprobs": 0}
        else:
            body["prompt"] = self.prompt if isinstance(self.prompt, str) else [int(t) for t in self.prompt]
            if endpoint.logprobs:
                body["logprobs"] = 0
        if self.seed is not None:
            body["seed"] = self.seed
        return body | dict(endpoint.extra_body) | dict(self.extra_body)


@dataclass
class StreamedResponse:
    """What one streamed request returned, timed on the client's clock (seconds, `time.perf_counter`)."""

    request: ApiRequest
    arrival_s: float  # sent (open loop: its scheduled arrival, so client-side queueing counts in TTFT)
    first_token_s: float | None = None  # first chunk with ≥ 1 token
    finish_s: float = 0.0  # last token (success) or the failure
    emissions: list[tuple[float, int]] = field(default_factory=list)  # (chunk arrival, tokens in it), tokens ≥ 1
    text: str = ""
    token_ids: list[int] = field(default_factory=list)  # when every chunk with tokens carried `token_ids`
    prompt_ids: list[int] = field(default_factory=list)  # the request's ids, or the server's `prompt_token_ids`
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)  # the last `usage` seen (with extensions, e.g. spec_*)
    token_source: str = ""  # the counting rules that applied: "token_ids", "logprobs", "usage", "text", joined by +
    error: str | None = None
    conversation: int = 0  # set by run_openai_load
    turn: int = 0

    @property
    def output_tokens(self) -> int:
        return sum(n for _, n in self.emissions)

    def record(self, num_drafts: int = 0) -> RequestRecord:
        """The harness record; per-step verify counts from the response's spec extension when it has them
        (`backends.openai.metrics.per_request_steps`), else none."""
        from backends.openai.metrics import per_request_confidences, per_request_steps

        steps = per_request_steps(self.usage, num_drafts) if self.error is None else None
        gamma, verified, accepted = steps if steps is not None else (num_drafts, (), ())
        confidences = per_request_confidences(self.usage, verified) if steps is not None else ()
        times = [t for t, n in self.emissions for _ in range(n)]
        error = self.error
        if error is None and not times:
            error = "the response has no tokens"
        finish = self.finish_s if error is not None else times[-1]
        reason = "error" if error is not None else _finish_reason(self.finish_reason)
        usage_prompt = self.usage.get("prompt_tokens")
        prompt_tokens = int(usage_prompt) if isinstance(usage_prompt, int) else len(self.prompt_ids)
        return RequestRecord(
            request_id=self.request.request_id, prompt_tokens=prompt_tokens, output_tokens=len(times),
            arrival_s=self.arrival_s, first_token_s=times[0] if times else None, finish_s=max(finish, self.arrival_s),
            token_times_s=tuple(times), num_drafts=gamma, num_verified=verified, num_accepted=accepted,
            confidence_logits=confidences, finish_reason=reason, error=error,
            all_steps=steps is None or self.usage.get("spec_steps") != "drafting",
        )


def _finish_reason(reason: str | None) -> str:
    return reason if reason in ("stop", "length", "abort") else "stop" if reason else "length"


class _Failed(Exception):
    pass


# ------------------------------------------------------------------ one request

# What a request may raise that the server or the network caused (never a bug of ours): a failed record.
NETWORK_ERRORS = (OSError, aiohttp.ClientError, asyncio.TimeoutError, ValueError)  # ValueError: bad JSON


async def astream_request(session: aiohttp.ClientSession, endpoint: Endpoint, request: ApiRequest,
                          clock: Clock = time.perf_counter, arrival_s: float | None = None) -> StreamedResponse:
    """Send one request on `session` and read its stream to the end; never raises for what the server or
    network does."""
    out = StreamedResponse(request, clock() if arrival_s is None else arrival_s)
    if not isinstance(request.prompt, str) and not endpoint.chat:
        out.prompt_ids = [int(t) for t in request.prompt]
    reader = _ChunkReader(out)
    try:
        path = "/v1/chat/completions" if endpoint.chat else "/v1/completions"
        body = json.dumps(request.body(endpoint)).encode()
        async with session.post(endpoint.url(path), data=body, headers=endpoint.headers()) as response:
            if response.status != 200:
                raise _Failed(f"HTTP {response.status} {response.reason}: {_short(await response.content.read(4096))}")
            done = False
            async for data in sse_events(response.content):
                now = clock()
                if data.strip() == "[DONE]":
                    done = True
                    break
                reader.add(json.loads(data), now)
        if not done and out.finish_reason is None:
            raise _Failed("the stream ended before [DONE] or a finish reason")
        reader.finish()
    except _Failed as exc:
        out.error = str(exc)
    except NETWORK_ERRORS as exc:
        out.error = network_error(exc)
    out.finish_s = clock() if out.error is not None else (out.emissions[-1][0] if out.emissions else clock())
    return out


def network_error(exc: BaseException) -> str:
    """One line for a failed request: the OS error under aiohttp's wrapper named first (ConnectionRefusedError …)."""
    cause = getattr(exc, "os_error", None)
    return f"{type(cause if isinstance(cause, OSError) else exc).__name__}: {exc}"


def stream_request(endpoint: Endpoint, request: ApiRequest, clock: Clock = time.perf_counter,
                   arrival_s: float | None = None) -> StreamedResponse:
    """`astream_request` from synchronous code: one request on a session of its own."""

    async def once() -> StreamedResponse:
        async with endpoint.session(1) as session:
            return await astream_request(session, endpoint, request, clock, arrival_s)

    return asyncio.run(once())


async def sse_events(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent event stream (multi-line data joined by newlines)."""
    lines: list[str] = []
    while True:
        raw = await content.readline()
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
    if lines:
        yield "\n".join(lines)


class _ChunkReader:
    """Turns chunks into emissions, text, ids and usage, by the module's token counting rule."""

    def __init__(self, out: StreamedResponse):
        self.out = out
        self.sources: list[str] = []
        self.usage_tokens = 0  # the last cumulative usage.completion_tokens seen
        self.ids_complete = True  # every chunk with tokens carried token_ids
        self.last_s = float("-inf")  # arrival of the last chunk
        self.spec: dict[str, Any] | None = None  # vLLM's per-request spec block, as usage fields

    def add(self, chunk: Mapping[str, Any], now: float) -> None:
        out = self.out
        self.last_s = now
        if chunk.get("error"):
            error = chunk["error"]
            raise _Failed("server error: " + _short(error.get("message", error) if isinstance(error, dict) else error))
        usage = chunk.get("usage")
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            if out.first_token_s is None and choice.get("prompt_token_ids") and not out.prompt_ids:
                out.prompt_ids = [int(t) for t in choice["prompt_token_ids"]]
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content") or ""
            out.text += text
            count, source = self._count(choice, usage, text)
            if count > 0:
                self._source(source)
                if choice.get("token_ids") is None:
                    self.ids_complete = False
                else:
                    out.token_ids += [int(t) for t in choice["token_ids"]]
                out.emissions.append((now, count))
                if out.first_token_s is None:
                    out.first_token_s = now
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
        if isinstance(usage, Mapping):
            out.usage = dict(usage)
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]
        spec = per_request_usage(chunk.get("metrics"))
        if spec is not None:
            self.spec = spec

    def _count(self, choice: Mapping[str, Any], usage, text: str) -> tuple[int, str]:
        if choice.get("token_ids") is not None:
            return len(choice["token_ids"]), "token_ids"
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, Mapping):
            tokens = logprobs.get("tokens") if "tokens" in logprobs else logprobs.get("content")
            if tokens is not None:
                return len(tokens), "logprobs"
        if isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
            return max(0, usage["completion_tokens"] - self.usage_tokens), "usage"
        return (1 if text else 0), "text"

    def _source(self, source: str) -> None:
        if source not in self.sources:
            self.sources.append(source)
        self.out.token_source = "+".join(self.sources)

    def finish(self) -> None:
        out = self.out
        if not self.ids_complete:
            out.token_ids = []
        if self.spec is not None:  # vLLM's `metrics.speculative_decoding` (final chunk), as the spec extension
            out.usage = {**out.usage, **self.spec}
        total = out.usage.get("completion_tokens")
        if self.sources in ([], ["text"]) and isinstance(total, int) and total != out.output_tokens:
            self._reconcile(total)

    def _reconcile(self, total: int) -> None:
        out = self.out
        missing = total - out.output_tokens
        if missing > 0:  # tokens without text (e.g. a lone stop token) arrived with the last chunk
            t, n = out.emissions.pop() if out.emissions else (max(self.last_s, out.arrival_s), 0)
            out.emissions.append((t, n + missing))
        while missing < 0 and out.emissions:
            t, n = out.emissions.pop()
            if n + missing > 0:
                out.emissions.append((t, n + missing))
            missing += n
        out.first_token_s = out.emissions[0][0] if out.emissions else None
        self._source("usage")


def _short(value: Any, limit: int = 300) -> str:
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


# ------------------------------------------------------------------ load


@dataclass(frozen=True)
class Load:
    """The load's shape, with the semantics of `backends.inhouse.load.LoadSpec` (either may be passed).

    Closed loop (`concurrency` C): C conversations in flight; when one ends the next starts. Open loop
    (`rate` λ conversations/s): arrival times drawn up front from a seeded exponential distribution, the
    same draws as the in-house load, independent of how fast the server answers."""

    concurrency: int | None = None
    rate: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a load is either closed-loop (concurrency) or open-loop (rate), exactly one")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be ≥ 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")


def arrival_offsets(num_conversations: int, rate: float, seed: int) -> list[float]:
    """Seconds after the load starts at which each conversation arrives (Poisson, as the in-house load)."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(num_conversations):
        t += rng.expovariate(rate)
        out.append(t)
    return out


# next_turn(conversation index, turn index, its successful response) → the next turn, or None when done
NextTurn = Callable[[int, int, StreamedResponse], ApiRequest | None]
# send(session, endpoint, request, clock, scheduled arrival or None) → awaitable of the finished response
# (`astream_request`, or another API's client on the same pooled session, such as SGLang's native
# /generate, `backends.sglang.client.astream_generate`). A plain function (endpoint, request, clock,
# arrival) → response is also accepted and runs in a worker thread (a client without asyncio).
Send = Callable[..., "Awaitable[StreamedResponse] | StreamedResponse"]


def run_openai_load(
    endpoint: Endpoint,
    first_turns: Sequence[ApiRequest],
    load,
    next_turn: NextTurn | None = None,
    *,
    on_response: Callable[[StreamedResponse], None] | None = None,
    clock: Clock = time.perf_counter,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    send: Send | None = None,
) -> list[StreamedResponse]:
    """Run one conversation per entry of `first_turns` under `load` (`Load` or a LoadSpec); every turn's
    response, in finish order. A conversation's next turn (`next_turn`) is sent as soon as its previous
    turn succeeded; a failed turn ends its conversation. `on_response` is called once per response, as
    they finish (progress). `send` sends one request (default `astream_request`, the OpenAI API). The
    whole load runs on one event loop in this thread (a thread of its own if this one already runs a
    loop), on one pooled keep-alive session."""
    coro = run_openai_load_async(endpoint, first_turns, load, next_turn, on_response=on_response, clock=clock,
                                 sleep=sleep, send=send)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures  # called from inside a loop (a notebook): run ours beside it

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def run_openai_load_async(
    endpoint: Endpoint,
    first_turns: Sequence[ApiRequest],
    load,
    next_turn: NextTurn | None = None,
    *,
    on_response: Callable[[StreamedResponse], None] | None = None,
    clock: Clock = time.perf_counter,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    send: Send | None = None,
) -> list[StreamedResponse]:
    """`run_openai_load` inside a running event loop."""
    n = len(first_turns)
    out: list[StreamedResponse] = []
    closed = load.concurrency is not None
    width = min(load.concurrency, n) if closed else 0  # open loop: as many connections as requests in flight

    async with endpoint.session(width) as session:
        one = _sender(send, session)

        async def conversation(conv: int, arrival: float | None) -> None:
            request, turn = first_turns[conv], 0
            while request is not None:
                response = await one(endpoint, request, clock, arrival)
                response.conversation, response.turn = conv, turn
                follow = next_turn(conv, turn, response) if next_turn is not None and response.error is None else None
                out.append(response)
                if on_response is not None:
                    on_response(response)
                request, turn, arrival = follow, turn + 1, None

        if closed:
            order = iter(range(n))

            async def worker() -> None:
                for conv in order:  # one shared iterator: the next free worker takes the next conversation
                    await conversation(conv, None)

            tasks = [asyncio.create_task(worker()) for _ in range(width)]
        else:
            start = clock()
            arrivals = [start + t for t in arrival_offsets(n, load.rate, load.seed)]
            tasks = []
            for conv, at in enumerate(arrivals):
                wait = at - clock()
                if wait > 0:
                    await sleep(wait)
                tasks.append(asyncio.create_task(conversation(conv, at)))
        try:
            await asyncio.gather(*tasks)  # a bug in next_turn or on_response surfaces here, the rest cancelled
        finally:
            for task in tasks:
                task.cancel()
    return out


def _sender(send: Send | None, session: aiohttp.ClientSession):
    """`send` as `await one(endpoint, request, clock, arrival)`: on the shared session if it is a coroutine
    function, else in a worker thread."""
    if send is None:
        send = astream_request
    if inspect.iscoroutinefunction(send) or inspect.iscoroutinefunction(getattr(send, "func", None)):
        return lambda endpoint, request, clock, arrival: send(session, endpoint, request, clock, arrival)
    return lambda endpoint, request, clock, arrival: asyncio.to_thread(send, endpoint, request, clock, arrival)
