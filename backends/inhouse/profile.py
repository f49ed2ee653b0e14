"""Measuring what the cost-aware and prefix schedulers plan with, on the device the engine runs on.

`profile_sps` times bare target forwards over KV slots (an SPS(B) table: verified tokens → steps/s);
`profile_step_costs` times whole `speculative_step`s, draft forward included (a step-cost table). Both
return tables of `dspark_core.costs`, fingerprinted with what they were measured on.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from dspark_core.costs import SPSTable, StepCostTable, fingerprint_for
from dspark_core.policy import VerifyAll


@torch.no_grad()
def profile_sps(
    target: Any,
    batch_sizes: Sequence[int],
    context_len: int,
    *,
    tokens_per_request: int = 8,
    warmup: int = 2,
    repeats: int = 5,
    target_id: str | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> SPSTable:
    """Measure SPS(B) on the target's device with real `TargetModel.forward` calls over KV slots.

    Each B is laid out as a verify step would be: ceil(B / tokens_per_request) requests (γ + 1 = 8 tokens
    each by default, the last one takes the remainder), every request already holding `context_len`
    cached positions. The context keys/values are random rather than prefilled: attention costs the same
    whatever the values, and it spares a prefill of every slot. Each timed call appends B positions and is
    rolled back afterwards, so every repeat sees the same context. `warmup` untimed calls, then the median
    of `repeats` timed ones (CUDA synchronised around each); SPS = 1 / median latency.
    """
    sizes = sorted(int(b) for b in batch_sizes)
    if not sizes or sizes[0] < 1 or len(set(sizes)) != len(sizes):
        raise ValueError(f"batch_sizes must be distinct integers >= 1, got {list(batch_sizes)}")
    if tokens_per_request < 1 or repeats < 1 or warmup < 0 or context_len < 0:
        raise ValueError("need tokens_per_request >= 1, repeats >= 1, warmup >= 0, context_len >= 0")
    device = target.device
    max_rows = -(-sizes[-1] // tokens_per_request)
    cache = target.new_cache(max_rows, context_len + tokens_per_request)
    fill = torch.Generator(device=device).manual_seed(seed)  # on the device: no host copy of the cache
    for keys, values in zip(cache.keys, cache.values):
        keys.normal_(generator=fill)
        values.normal_(generator=fill)
    cache.lengths.fill_(context_len)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    points = []
    latencies: dict[int, list[float]] = {}
    for b in sizes:
        num_rows = -(-b // tokens_per_request)
        width = min(b, tokens_per_request)
        num_new = torch.full((num_rows,), width, dtype=torch.long)
        num_new[-1] = b - width * (num_rows - 1)  # [num_rows], sums to b
        rows = torch.arange(num_rows, device=device)
        num_new = num_new.to(device)
        token_ids = torch.randint(0, target.vocab_size, (num_rows, width), generator=gen).to(device)
        times = []
        for i in range(warmup + repeats):
            sync()
            start = clock()
            target.forward(cache, rows, token_ids, num_new)
            sync()
            elapsed = clock() - start
            cache.rollback(rows, torch.full_like(num_new, context_len))
            if i >= warmup:
                times.append(elapsed)
        median = statistics.median(times)
        if median <= 0:
            raise RuntimeError(f"B={b}: the clock measured {median} s; use a finer clock")
        latencies[b] = times
        points.append((b, 1.0 / median))
    meta = {
        "method": "profile_sps", "tokens_per_request": tokens_per_request, "warmup": warmup, "repeats": repeats,
        "latencies_s": {str(b): t for b, t in latencies.items()}, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "torch": torch.__version__,
    }
    return SPSTable.from_points(points, fingerprint_for(target, context_len, target_id), meta)


class _FixedStep(VerifyAll):
    """The policy `profile_step_costs` times steps with: draft `num_drafts`, verify `num_verify` of every row."""

    may_skip_drafts = True

    def __init__(self, num_drafts: int, num_verify: int) -> None:
        self.num_drafts, self.num_verify = num_drafts, num_verify

    def plan(self, step: Any) -> int:
        return self.num_drafts

    def choose(self, proposal: Any, step: Any) -> Tensor:
        return torch.full((len(step.rows),), self.num_verify, dtype=torch.long, device=step.rows.device)


class _TimedDrafter:
    """Wraps a drafter and adds the wall time of each `propose` to `seconds` (CUDA synchronised)."""

    def __init__(self, drafter: Any, clock: Callable[[], float], sync: Callable[[], None]) -> None:
        self.drafter, self.clock, self.sync, self.seconds = drafter, clock, sync, 0.0
        self.name, self.target_layer_ids = drafter.name, drafter.target_layer_ids

    def start(self, num_slots: int, capacity: int) -> Any:
        return self.drafter.start(num_slots, capacity)

    def reset(self, state: Any, rows: Tensor) -> None:
        self.drafter.reset(state, rows)

    def observe(self, state: Any, rows: Tensor, token_ids: Tensor, features: Tensor, num_new: Tensor) -> None:
        self.drafter.observe(state, rows, token_ids, features, num_new)

    def propose(self, state: Any, step: Any) -> Any:
        self.sync()
        start = self.clock()
        out = self.drafter.propose(state, step)
        self.sync()
        self.seconds += self.clock() - start
        return out


@torch.no_grad()
def profile_step_costs(
    target: Any,
    drafter: Any,
    rows: Sequence[int],
    context_len: int,
    *,
    num_drafts: int = 7,
    warmup: int = 1,
    repeats: int = 5,
    target_id: str | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> StepCostTable:
    """Measure a `StepCostTable` by timing real `speculative_step`s of `drafter` on the target's device.

    Every R in `rows` gets its own block of R request slots (a contiguous range, as in a busy engine), all
    prefilled with random prompts of `context_len` tokens. Then, round after round, every block runs one
    step for each g = 0 … num_drafts that drafts g tokens and verifies all of them (so W = g + 1): the draft
    forward is timed around `drafter.propose`, the rest of the step is the verify cost at width W. All
    (R, g) are interleaved within a round, so a burst of other work on a shared machine disturbs a few cells
    of one round, not one R's whole row; each cost is the *minimum* over the `repeats` timed rounds (after
    `warmup` untimed ones), the least disturbed one. Contexts grow by the few tokens each step commits, alike
    for every g. Greedy decoding.
    """
    from dspark_core.drafters.deferred import DeferredObservations, DeferredState
    from dspark_core.generate import new_batch_state, prefill, speculative_step

    sizes = sorted(int(r) for r in rows)
    if not sizes or sizes[0] < 1 or len(set(sizes)) != len(sizes):
        raise ValueError(f"rows must be distinct integers >= 1, got {list(rows)}")
    if num_drafts < 1 or repeats < 1 or warmup < 0 or context_len < 1:
        raise ValueError("need num_drafts >= 1, repeats >= 1, warmup >= 0, context_len >= 1")
    device = target.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    timed = _TimedDrafter(drafter, clock, sync)
    deferred = DeferredObservations(timed)  # as the engine runs a policy that skips drafts (g = 0 parks)
    rounds = warmup + repeats
    capacity = context_len + 2 + rounds * (num_drafts + 1) * (num_drafts + 1)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    state = new_batch_state(target, deferred, sum(sizes), capacity)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    all_rows = torch.arange(sum(sizes), device=device)
    prompts = torch.randint(0, target.vocab_size, (len(all_rows), context_len - 1), generator=gen).tolist()
    generators = [torch.Generator(device="cpu").manual_seed(seed + i) for i in range(len(all_rows))]
    prefill(target, deferred, state, all_rows, prompts, torch.zeros(len(all_rows), device=device), generators)
    parked = state.draft_state
    assert isinstance(parked, DeferredState)  # what `deferred.start` made
    deferred.hand_over(parked, all_rows.tolist())  # the prompts are context, not a step's price
    times = {(r, g): [] for r in sizes for g in range(num_drafts + 1)}  # (R, g) → [(verify s, draft s)]
    for i in range(rounds):
        for num_rows, start in zip(sizes, starts):
            block = all_rows[start : start + num_rows]
            temperatures = torch.zeros(num_rows, device=device)
            for g in range(num_drafts + 1):
                timed.seconds = 0.0
                sync()
                begin = clock()
                speculative_step(target, deferred, state, block, temperatures, generators[start : start + num_rows],
                                 num_drafts, _FixedStep(g, g))
                sync()
                if i >= warmup:
                    times[num_rows, g].append((clock() - begin - timed.seconds, timed.seconds))
    verify_s = tuple(tuple(max(min(t[0] for t in times[r, g]), 1e-9) for g in range(num_drafts + 1)) for r in sizes)
    draft_s = tuple(tuple(max(min(t[1] for t in times[r, g]), 1e-9) for g in range(1, num_drafts + 1)) for r in sizes)
    meta = {
        "method": "profile_step_costs", "drafter": getattr(drafter, "name", "?"), "warmup": warmup,
        "repeats": repeats, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": torch.__version__,
    }
    return StepCostTable(
        tuple(sizes), tuple(range(1, num_drafts + 2)), verify_s, tuple(range(1, num_drafts + 1)), draft_s,
        fingerprint_for(target, context_len, target_id), meta,
    )
