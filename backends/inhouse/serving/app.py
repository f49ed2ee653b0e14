"""The HTTP side (aiohttp.web): routes, bounded and timed bodies, the OpenAI error contract, streaming.

One asyncio event loop serves every connection (a stalled client holds a socket and a task, no thread);
the engine runs on its own thread (`engine_loop`), whose events are handed to the loop per request.

Limits (`Limits`): a body over `max_body_bytes` is refused with 413 as soon as its declared length is read
(a chunked one as soon as it grows past it); a body that does not arrive within `read_timeout_s` gets 408;
a connection that sends no complete request within `idle_timeout_s` (at its start or between keep-alive
requests) is closed; a stream whose client stops reading for `write_timeout_s` is aborted. The listen
backlog is `backlog` (the kernel caps it at net.core.somaxconn). Every refusal by a route (and a missing
route or method) is the OpenAI error object, naming the field where one is at fault (`validation`); only
what aiohttp refuses before routing (a malformed request line, oversized headers) is its own plain 400.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from backends.inhouse.serving.counters import Counters
from backends.inhouse.serving.engine_loop import EngineLoop, EngineUnavailable
from backends.inhouse.serving.responses import Chunks, completion, error_body
from backends.inhouse.serving.validation import BadRequest, ModelContext, ParsedRequest, build_request, parse_body

COMPLETION_ROUTES = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 << 20
    read_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0
    write_timeout_s: float = 60.0
    backlog: int = 4096


@dataclass
class Served:
    """Everything the handlers share."""

    loop: EngineLoop
    model: ModelContext
    version: str
    limits: Limits
    access_log: bool = False
    connections: Callable[[], int] = lambda: 0

    @property
    def counters(self) -> Counters:
        return self.loop.counters


SERVED = web.AppKey("served", Served)


class ListenError(Exception):
    """The server cannot listen where asked (one line for the start-up error)."""


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A bound, listening socket; `port=0` picks a free one. Bound before the engine loads, so a port in
    use is refused at once."""
    if not 0 <= port <= 65535:
        raise ListenError(f"--port {port} is out of range (0–65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"--host {host!r}: cannot resolve ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        reason = "the address is in use (another server?)" if exc.errno == 98 else exc.strerror or str(exc)
        raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.setblocking(False)
    return sock


# ------------------------------------------------------------------ handlers


def _error(status: int, message: str, param: str | None = None, kind: str | None = None,
           close: bool = False) -> web.Response:
    response = web.json_response(error_body(status, message, param, kind), status=status)
    if close:  # the body was not read to its end: the connection cannot carry another request
        response.force_close()
    return response


async def _read_body(request: web.Request, limits: Limits) -> bytes:
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        raise BadRequest(f"the body ({declared} bytes) exceeds the server's limit of {limits.max_body_bytes} bytes",
                         status=413)
    try:
        return await asyncio.wait_for(request.read(), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise BadRequest(f"the body did not arrive within {limits.read_timeout_s:g} s", status=408,
                         kind="timeout_error") from None
    except web.HTTPRequestEntityTooLarge:
        raise BadRequest(f"the body exceeds the server's limit of {limits.max_body_bytes} bytes", status=413) from None


class _ClientGone(Exception):
    """The client of a stream went away (or stopped reading): its request is aborted."""

    def __init__(self, response: web.StreamResponse):
        super().__init__()
        self.response = response


@dataclass
class _Exchange:
    """Where one request stands: the engine request to abort if its handler ends early (until the engine
    finished it), and its outcome for the counters (a finish reason; None: failed)."""

    running: str | None = None
    outcome: str | None = None
    received_s: float = 0.0  # perf_counter at arrival: the server's TTFT starts here (vLLM: the request's arrival)
    first_token_sent: bool = False

    def finished(self, reason: str) -> None:
        self.running, self.outcome = None, reason


async def _completion(request: web.Request, chat: bool) -> web.StreamResponse:
    served = request.app[SERVED]
    served.counters.begin()
    exchange = _Exchange(received_s=time.perf_counter())
    try:
        loop = asyncio.get_running_loop()
        data = await _read_body(request, served.limits)
        # parsing a large body takes a while: off the event loop (a bounded pool), so other clients are served;
        # tokenising stays on the loop (one thread: tokenizers are not safe to share between threads)
        body = await loop.run_in_executor(None, parse_body, data) if len(data) > 1 << 16 else parse_body(data)
        parsed = build_request(served.model, body, chat, served.loop.next_id())
        events: asyncio.Queue = asyncio.Queue()

        def deliver(event: tuple) -> None:  # on the engine thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the event loop is closed: the server is stopping
                pass

        served.loop.submit(parsed.request, deliver)
        exchange.running = parsed.request.request_id
        if parsed.stream:
            return await _stream(request, served, parsed, events, chat, exchange)
        return await _complete(served, parsed, events, chat, exchange)
    except BadRequest as exc:
        return _error(exc.status, str(exc), exc.param, exc.kind, close=exc.status in (408, 413))
    except EngineUnavailable as exc:
        return _error(503, str(exc))
    except _ClientGone as gone:
        if exchange.running is not None:
            exchange.outcome = "abort"
        return gone.response
    except asyncio.CancelledError:  # the client went away before its answer
        if exchange.running is not None:
            exchange.outcome = "abort"
        raise
    except Exception as exc:  # noqa: BLE001 — a bug: answer 500 with what it was, keep serving
        print(f"error in {request.path}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")
    finally:
        if exchange.running is not None:
            served.loop.abort(exchange.running)  # its slot is free for the next step
        served.counters.end(exchange.outcome)


async def _complete(served: Served, parsed: ParsedRequest, events: asyncio.Queue, chat: bool, exchange: _Exchange):
    while True:
        kind, *payload = await events.get()
        if kind == "error":
            exchange.running = None
            return _error(500, payload[0])
        if kind == "done":
            done = payload[0]
            exchange.finished(done.finish_reason)
            return web.json_response(completion(served.model.tokenizer, served.model.model_name, parsed.request,
                                                done, chat, parsed.logprobs))


async def _stream(request: web.Request, served: Served, parsed: ParsedRequest, events: asyncio.Queue, chat: bool,
                  exchange: _Exchange) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    timeout = served.limits.write_timeout_s

    async def send(payload: dict | bytes) -> None:
        data = payload if isinstance(payload, bytes) else \
            b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
        try:
            await asyncio.wait_for(response.write(data), timeout)
        except (ConnectionError, asyncio.TimeoutError):
            raise _ClientGone(response) from None

    chunks = Chunks(served.model.tokenizer, served.model.model_name, parsed.request, chat, parsed.logprobs)
    try:
        await response.prepare(request)
    except ConnectionError:
        raise _ClientGone(response) from None
    while True:
        kind, *payload = await events.get()
        if kind == "error":
            exchange.running = None
            await send({"error": error_body(500, payload[0])["error"]})
            break
        if kind == "tokens":  # one engine step's tokens: one chunk, sent at once
            await send(chunks.tokens(payload[0]))
            if not exchange.first_token_sent:
                exchange.first_token_sent = True
                served.counters.observe_ttft(time.perf_counter() - exchange.received_s)
            continue
        done = payload[0]
        exchange.finished(done.finish_reason)
        await send(chunks.final(done))
        if parsed.include_usage:
            await send(chunks.usage(done))
        break
    await send(b"data: [DONE]\n\n")
    try:
        await response.write_eof()
    except ConnectionError:
        pass
    return response


def _get_routes(served: Served) -> web.RouteTableDef:
    routes = web.RouteTableDef()

    @routes.get("/health")
    async def health(_: web.Request) -> web.Response:
        if served.loop.error is not None:
            return web.json_response({"status": "error", "error": served.loop.error}, status=503)
        return web.json_response({"status": "ok"})

    @routes.get("/v1/models")
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": served.model.model_name, "object": "model", "owned_by": "dspark-harness",
            "max_model_len": served.model.max_context}]})

    @routes.get("/version")
    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": served.version})

    @routes.get("/metrics")
    async def metrics(_: web.Request) -> web.Response:
        engine = served.loop.engine
        text = served.counters.prometheus(served.model.model_name, engine.num_active, engine.num_waiting,
                                          served.connections())
        return web.Response(text=text, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    @routes.post("/v1/completions")
    async def completions(request: web.Request) -> web.StreamResponse:
        return await _completion(request, chat=False)

    @routes.post("/v1/chat/completions")
    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await _completion(request, chat=True)

    return routes


@web.middleware
async def _json_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's own refusals (no route, wrong method, …) in the OpenAI error shape."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        what = {404: f"no route {request.method} {request.path}",
                405: f"{request.method} is not allowed on {request.path}"}.get(exc.status, exc.reason)
        return _error(exc.status, what)


def make_app(served: Served) -> web.Application:
    app = web.Application(client_max_size=served.limits.max_body_bytes, middlewares=[_json_errors],
                          handler_args={"max_field_size": 16 << 10})
    app[SERVED] = served
    app.add_routes(_get_routes(served))
    return app


async def serve(served: Served, sock: socket.socket, stop: asyncio.Event, ready: Callable[[], None] = lambda: None):
    """Serve on `sock` until `stop` is set; then close every connection within a second."""
    runner = web.AppRunner(make_app(served), handle_signals=False, handler_cancellation=True,
                           keepalive_timeout=served.limits.idle_timeout_s, lingering_time=1.0, shutdown_timeout=1.0,
                           access_log=web.access_logger if served.access_log else None)
    await runner.setup()
    served.connections = lambda: len(runner.server.connections) if runner.server is not None else 0
    site = web.SockSite(runner, sock, backlog=served.limits.backlog)
    await site.start()
    ready()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


class ServerThread:
    """The app on its own thread and event loop (a server inside a test or a script's process)."""

    def __init__(self, served: Served, sock: socket.socket):
        self.served, self.sock = served, sock
        self.port: int = sock.getsockname()[1]
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await serve(self.served, self.sock, self._stop, self._ready.set)

        asyncio.run(main())

    def __enter__(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the server thread did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
