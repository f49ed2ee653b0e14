"""The engine thread: one thread owns the `Engine`, submits what the HTTP side queues, steps while there is
work and publishes each request's tokens, one event per engine emission — the prefill token, then each
step's tokens (so a speculative step's accepted tokens and bonus arrive as one SSE chunk, as from vLLM).

Events reach the HTTP side through each stream's `deliver` callback (called on this thread; the HTTP app
hands it on to its event loop): ("tokens", ids, t) … then ("done", Completed) or ("error", message).
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
from dataclasses import dataclass
from typing import Callable

from backends.inhouse.engine import Completed, Engine, Request
from backends.inhouse.serving.counters import Counters

Deliver = Callable[[tuple], None]


@dataclass
class _Abort:
    """The HTTP side's request to drop a request from the engine (its client went away)."""

    request_id: str


@dataclass
class _Stream:
    """One request's link between the engine thread and the HTTP side."""

    request: Request
    deliver: Deliver
    sent_tokens: int = 0
    sent_emissions: int = 0
    seen_steps: int = 0


class EngineUnavailable(Exception):
    """The engine failed earlier; no request is accepted any more."""


class EngineLoop:
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

    def submit(self, request: Request, deliver: Deliver) -> None:
        if self.error is not None:
            raise EngineUnavailable(f"the engine failed: {self.error}")
        self.inbox.put(_Stream(request, deliver))

    def abort(self, request_id: str) -> None:
        """Drop a request (its client is gone): its slot is free for the next step; a no-op once it finished."""
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
                    stream.deliver(("error", self.error))
                self.streams.clear()
                while not self.inbox.empty():
                    item = self.inbox.get_nowait()
                    if isinstance(item, _Stream):
                        item.deliver(("error", self.error))
                return

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, _Abort):
                self._abort(item.request_id)
            else:
                self._admit(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, stream: _Stream) -> None:
        stream.request.arrival_s = None  # the engine clock stamps it on submission
        try:
            self.engine.submit(stream.request)
        except ValueError as exc:  # validated by the HTTP side already; kept from killing the loop
            stream.deliver(("error", str(exc)))
        else:
            self.streams[stream.request.request_id] = stream
            self.counters.add_tokens(prompt=len(stream.request.prompt_ids))

    def _abort(self, request_id: str) -> None:
        stream = self.streams.pop(request_id, None)
        done = self.engine.abort(request_id) if stream is not None else None
        if done is not None:
            self.counters.add_tokens(generated=len(done.output_ids) - stream.sent_tokens)
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
                    stream.deliver(("tokens", list(ids), t))
                stream.sent_tokens += len(ids)
            stream.sent_emissions = len(source.emissions)
            self.counters.add_tokens(generated=stream.sent_tokens - before)
            if isinstance(source, Completed):
                stream.deliver(("done", source))
                del self.streams[request_id]
