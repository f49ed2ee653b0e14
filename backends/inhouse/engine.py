"""The in-house engine: continuous batching over `dspark_core`'s one generation loop.

Each `step()` first admits waiting requests into free slots (one batched prefill for all of them:
their first token comes from the target, which is their TTFT), then runs one speculative step for
every active request: each drafts γ tokens (or fewer, or none, if the policy plans so before the
draft forward), the policy picks each request's verify length, one batched target forward verifies
all of them, accepted tokens and the bonus are committed and caches roll back to the accepted length.
The engine owns the clock: it times each speculative step and tells the policy its outcome and seconds
(leaving out the hand-over of observations parked by earlier steps without drafts, which is their price).
Finished requests free and empty their slots at once, so waiting requests join as others finish. Free
slots are handed out lowest first, so the active slots tend to stay one contiguous range, and the holes
a finished request leaves hold nothing: the target and drafter then read their KV slots in place, over
the range around the holes, instead of gathering a copy (`kv_slots.covering_range`). Nothing here
changes what is sampled: the engine only decides *when* a request runs, and the loop's losslessness
holds for every interleaving (each request draws only from its own generator).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from contracts.records import StepRecord
from backends.inhouse.prefill_groups import prefill_groups
from dspark_core.calibration import OnlineCalibrator
from dspark_core.drafters.base import Drafter
from dspark_core.drafters.deferred import DeferredObservations
from dspark_core.generate import RequestCounters, emit, new_batch_state, prefill, release_slots, speculative_step
from dspark_core.policy import VERIFY_ALL, Policy
from dspark_core.target import TargetModel


@dataclass(frozen=True)
class EngineConfig:
    num_slots: int = 64  # requests decoded together at most (the batch)
    max_context: int = 2048  # prompt + output tokens a slot holds
    num_drafts: int = 7  # γ drafted per step (a policy may verify fewer)


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    seed: int = 0
    stop_token_ids: tuple[int, ...] = ()
    arrival_s: float | None = None  # engine clock; None: when submitted


@dataclass
class Completed:
    """A finished request with its raw timings (engine clock, seconds) and counters."""

    request: Request
    output_ids: list[int]
    finish_reason: str  # stop | length | abort
    counters: RequestCounters
    arrival_s: float
    first_token_s: float
    finish_s: float
    emissions: list[tuple[float, int]]  # (time, tokens emitted at once); the first is the prefill token


@dataclass
class Running:
    """A request in a slot, as the engine keeps it: what it has emitted so far, with the engine's times.
    Callers (the HTTP server) read these between steps; only the engine writes them."""

    request: Request
    generator: torch.Generator
    counters: RequestCounters
    arrival_s: float
    first_token_s: float = 0.0
    output: list[int] = field(default_factory=list)
    emissions: list[tuple[float, int]] = field(default_factory=list)


class Engine:
    def __init__(
        self,
        target: TargetModel,
        drafter: Drafter,
        config: EngineConfig = EngineConfig(),
        policy: Policy | None = None,
        clock: Callable[[], float] = time.perf_counter,
        calibrator: OnlineCalibrator | None = None,
        verifier: Callable | None = None,
    ):
        """`calibrator`, if given, observes every step's confidences with their outcomes (online STS);
        a policy holding the same calibrator then schedules with temperatures refitted while serving.
        `verifier`: `verification.synthetic_verifier(...)` for a synthetic-acceptance cell (not lossless)."""
        self.target, self.config, self.clock = target, config, clock
        self.policy: Policy = policy if policy is not None else VERIFY_ALL
        self.verifier = verifier
        self.calibrator = calibrator
        self.num_drafts = config.num_drafts if drafter.name != "none" else 0
        # A policy that may skip drafting: the drafter's observations wait for its next draft (bounded memory).
        self.deferred = (DeferredObservations(drafter, clock) if self.policy.may_skip_drafts and self.num_drafts
                         else None)
        self.drafter: Drafter = self.deferred or drafter
        self.capacity = config.max_context + self.num_drafts + 2
        self.state = new_batch_state(target, self.drafter, config.num_slots, self.capacity)
        self.waiting: deque[Request] = deque()
        self.slots: dict[int, Running] = {}
        self.free = list(range(config.num_slots))  # a heap: the lowest free slot is used first
        self.steps: list[StepRecord] = []  # one per step(), in the contracts' form the store keeps

    @property
    def num_active(self) -> int:
        return len(self.slots)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.slots)

    def running(self) -> list[Running]:
        """The requests in slots now, in slot order."""
        return [self.slots[row] for row in sorted(self.slots)]

    def abort(self, request_id: str) -> Completed | None:
        """Stop a request now (its client went away): a waiting one leaves the queue, a running one frees its
        slot for the next step. Returns it as finished with reason "abort" and what it had emitted, or None if
        the engine does not hold it (never submitted, or already finished)."""
        now = self.clock()
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                arrival = request.arrival_s if request.arrival_s is not None else now
                return Completed(request, [], "abort", RequestCounters(self.num_drafts), arrival, now, now, [])
        row = next((row for row, slot in self.slots.items() if slot.request.request_id == request_id), None)
        return None if row is None else self._finish(row, "abort", now)

    def submit(self, request: Request) -> None:
        if len(request.prompt_ids) == 0:
            raise ValueError(f"request {request.request_id}: empty prompt")
        if len(request.prompt_ids) + request.max_new_tokens > self.config.max_context:
            raise ValueError(
                f"request {request.request_id}: prompt {len(request.prompt_ids)} + max_new_tokens "
                f"{request.max_new_tokens} exceeds the engine's max_context {self.config.max_context}"
            )
        if request.arrival_s is None:
            request.arrival_s = self.clock()
        self.waiting.append(request)

    def step(self) -> list[Completed]:
        """Admit what fits, then one speculative step over every active request."""
        start = self.clock()
        num_prefilled, done = self._admit()
        rows = sorted(self.slots)
        verified = accepted = drafted = 0
        if rows:
            slots = [self.slots[r] for r in rows]
            device = self.target.device
            parked_s = self.deferred.handover_seconds if self.deferred is not None else 0.0
            started = self.clock()
            outcome = speculative_step(  # γ to the end, as generate()
                self.target, self.drafter, self.state, torch.tensor(rows, device=device),
                torch.tensor([s.request.temperature for s in slots], device=device),
                [s.generator for s in slots], self.num_drafts, self.policy, verifier=self.verifier,
            )
            now = self.clock()
            handed_over_s = self.deferred.handover_seconds - parked_s if self.deferred is not None else 0.0
            self.policy.observe(outcome, now - started - handed_over_s)
            for j, (row, slot) in enumerate(zip(rows, slots)):
                slot.counters.record_step(outcome, j)
                before = len(slot.output)
                reason = emit(slot.output, outcome.emitted[j], slot.request.max_new_tokens,
                              slot.request.stop_token_ids)
                slot.emissions.append((now, len(slot.output) - before))
                if reason is not None:
                    done.append(self._finish(row, reason, now))
            verified = sum(outcome.num_verified)
            accepted = sum(outcome.num_accepted)
            drafted = outcome.draft_length
            if self.calibrator is not None and outcome.confidences is not None and drafted > 0:
                self._observe_outcomes(outcome.confidences, outcome.num_verified, outcome.num_accepted)
        end = self.clock()
        self.steps.append(StepRecord(len(self.steps), end, len(rows), verified, accepted, end - start, drafted,
                                     num_prefilled))
        return done

    def _observe_outcomes(self, confs: list[list[float]], n_verified: list[int], n_accepted: list[int]) -> None:
        assert self.calibrator is not None
        table = torch.zeros(len(confs), self.num_drafts)
        for j, row in enumerate(confs):
            table[j, : len(row)] = torch.tensor(row)
        self.calibrator.observe(table, torch.tensor(n_verified), torch.tensor(n_accepted))

    def _admit(self) -> tuple[int, list[Completed]]:
        """Prefill waiting requests into free slots: (how many were admitted, those already finished by their
        prefill token). Prompts of like length are prefilled together (`prefill_groups`: padding costs what
        tokens cost), each batch into consecutive free slots where there are, so its KV slots are written in
        place; a batch's first tokens are timed when its own prefill ends."""
        requests: list[Request] = []
        free: list[int] = []
        while self.waiting and self.free:
            requests.append(self.waiting.popleft())
            free.append(heapq.heappop(self.free))
        if not requests:
            return 0, []
        device = self.target.device
        done = []
        groups = prefill_groups([len(r.prompt_ids) for r in requests])
        for group, rows_at in zip(groups, _consecutive(sorted(free), [len(g) for g in groups])):
            batch = [requests[i] for i in group]
            slots = [
                Running(r, torch.Generator(device="cpu").manual_seed(r.seed), RequestCounters(self.num_drafts),
                        r.arrival_s if r.arrival_s is not None else self.clock())  # `submit` sets it
                for r in batch
            ]
            first = prefill(  # slots empty: new, or emptied by `_finish`
                self.target, self.drafter, self.state, torch.tensor(rows_at, device=device),
                [r.prompt_ids for r in batch], torch.tensor([r.temperature for r in batch], device=device),
                [s.generator for s in slots],
            )
            now = self.clock()
            for row, request, slot, token in zip(rows_at, batch, slots, first.tolist()):
                slot.first_token_s = now
                slot.emissions.append((now, 1))
                self.slots[row] = slot
                reason = emit(slot.output, [token], request.max_new_tokens, request.stop_token_ids)
                if reason is not None:
                    done.append(self._finish(row, reason, now))
        return len(requests), done

    def _finish(self, row: int, reason: str, now: float) -> Completed:
        slot = self.slots.pop(row)
        heapq.heappush(self.free, row)
        # Emptied now, the one place a slot is emptied, not at its next admission: an idle slot that still held
        # its context would stop the target and drafter from running over the slot range around it
        # (kv_slots.covering_range).
        release_slots(self.state, self.drafter, torch.tensor([row], device=self.target.device))
        return Completed(
            slot.request, slot.output, reason, slot.counters, slot.arrival_s, slot.first_token_s, now, slot.emissions
        )

    def run_to_completion(self, requests: Sequence[Request]) -> list[Completed]:
        """Submit everything now and step until all finish (offline batch mode)."""
        for r in requests:
            self.submit(r)
        done: list[Completed] = []
        while self.has_work:
            done += self.step()
        return done


def _consecutive(rows: list[int], sizes: list[int]) -> list[list[int]]:
    """`rows` (ascending) dealt out in runs of `sizes`, in order: consecutive slots stay together."""
    out, start = [], 0
    for n in sizes:
        out.append(rows[start : start + n])
        start += n
    return out
