"""Load generation for the in-house engine: closed-loop concurrency and open-loop Poisson arrivals.

Closed loop (`concurrency` C): C conversations are in flight at all times; when one finishes the
next starts. Open loop (`rate` λ requests/s): arrival times are drawn up front from a seeded
exponential distribution, independent of how fast the engine is, so an overloaded engine builds a
queue (and its TTFT shows it). Multi-turn conversations (MT-Bench) submit their next turn, built from
the model's own answer, as soon as the previous turn finishes; the conversation keeps its place.

Warm-up: the first `warmup` conversations to start are run but marked, and the measurement window
runs from the first non-warm-up arrival to the last non-warm-up finish; metrics use only what the
window holds.

`loaded_tokens_per_s` is a closed loop's throughput while the engine was (nearly) full: what a
benchmark compares variants by, the drain at the end being as long as requests finish unevenly.
"""

from __future__ import annotations

import bisect
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from backends.inhouse.engine import Completed, Engine, Request
from contracts.records import StepRecord

# next_turn(conversation index, turn index, completed turn) → the next turn's request, or None when done
NextTurn = Callable[[int, int, Completed], Request | None]


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int | None = None  # closed loop: conversations in flight
    rate: float | None = None  # open loop: conversation arrivals per second (Poisson)
    warmup: int = 0  # first conversations excluded from the window
    seed: int = 0  # arrival times

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a load is either closed-loop (concurrency) or open-loop (rate), exactly one")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be ≥ 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")


@dataclass
class LoadResult:
    completed: list[Completed]  # every turn of every conversation, in finish order
    warmup_ids: set[str]  # request ids of warm-up conversations' turns
    steps: list[StepRecord]
    window: tuple[float, float]  # (start, end) on the engine clock
    conversation_of: dict[str, int] = field(default_factory=dict)

    @property
    def measured(self) -> list[Completed]:
        return [c for c in self.completed if c.request.request_id not in self.warmup_ids]


def run_load(
    engine: Engine,
    first_turns: Sequence[Request],
    load: LoadSpec,
    next_turn: NextTurn | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> LoadResult:
    """Drive `engine` with one conversation per entry of `first_turns` under `load`; returns every turn."""
    clock = engine.clock
    start = clock()
    arrivals: list[float] = []
    if load.rate is not None:
        rng = random.Random(load.seed)
        t = 0.0
        for _ in first_turns:
            t += rng.expovariate(load.rate)
            arrivals.append(start + t)
    pending = list(range(len(first_turns)))[::-1]  # conversations not started, next at the end
    in_flight: dict[str, tuple[int, int]] = {}  # request id → (conversation, turn)
    conversation_of: dict[str, int] = {}
    warmup_ids: set[str] = set()
    completed: list[Completed] = []

    def start_turn(conv: int, turn: int, request: Request, at: float | None) -> None:
        request.arrival_s = at
        in_flight[request.request_id] = (conv, turn)
        conversation_of[request.request_id] = conv
        if conv < load.warmup:
            warmup_ids.add(request.request_id)
        engine.submit(request)

    while pending or in_flight:
        now = clock()
        if load.concurrency is not None:
            open_convs = len({c for c, _ in in_flight.values()})
            while pending and open_convs < load.concurrency:
                conv = pending.pop()
                start_turn(conv, 0, first_turns[conv], now)
                open_convs += 1
        else:
            while pending and arrivals[pending[-1]] <= now:
                conv = pending.pop()
                start_turn(conv, 0, first_turns[conv], arrivals[conv])
            if not engine.has_work and pending:
                sleep(max(0.0, arrivals[pending[-1]] - clock()))
                continue
        for done in engine.step():
            completed.append(done)
            conv, turn = in_flight.pop(done.request.request_id)
            follow = next_turn(conv, turn, done) if next_turn is not None else None
            if follow is not None:
                start_turn(conv, turn + 1, follow, clock())

    measured = [c for c in completed if c.request.request_id not in warmup_ids]
    window = (min((c.arrival_s for c in measured), default=start), max((c.finish_s for c in measured), default=start))
    return LoadResult(completed, warmup_ids, list(engine.steps), window, conversation_of)


def loaded_tokens_per_s(result: LoadResult, concurrency: int) -> float:
    """Tokens emitted in the steps that ran at least 3/4 of `concurrency` requests, over those steps' wall time
    (admission and prefill included): a closed loop's throughput while the load kept the engine (nearly) full.
    The drain at the end is left out (its length depends on how unevenly requests finish, not on the steady
    rate), but no prefill is, and one request ending early does not end the count. An emission is stamped
    inside the step that made it (`Engine.step`), so it is found by its time."""
    loaded = [s for s in result.steps if 4 * s.batch_size >= 3 * concurrency]
    if not loaded:
        return float("nan")
    starts = [s.start_s for s in loaded]
    tokens = 0
    for completed in result.measured:
        for t, n in completed.emissions:
            i = bisect.bisect_right(starts, t) - 1
            if i >= 0 and t <= loaded[i].t_s:
                tokens += n
    return tokens / sum(s.wall_s for s in loaded)
