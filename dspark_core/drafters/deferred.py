"""Deferred observation: a drafter that sees its context only when it drafts.

A policy that plans draft lengths (`policy.Policy.may_skip_drafts`) runs steps without a draft forward; under a
load where drafting does not pay, most steps are such. The drafter still needs every committed position
before it drafts again, but not sooner, so `DeferredObservations` wraps it: an `observe` of slots that were
not drafted for since their last observation (a prefill, a step without drafts) is parked, and the next
`propose` for those slots first hands everything parked over in one batched `observe`. A request that is
never drafted for never costs the drafter a pass over its prompt (≈ 15% of a prefill on the embedded
default). The observation that follows a draft goes through at once: the step that drafted pays it.

Bounded memory: each slot parks at most `max_parked` positions, its tokens and target features, in one
buffer allocated at the first park, [num_slots, max_parked, F]: at most `max_parked_bytes` of features per
slot (default 8 MiB; ≈ 200 positions of an 8 B target reading 5 layers of 4,096 in bf16, 0.5 GiB at 64 slots,
where parking whole 2,048-token prompts took ≈ 84 MB a slot). A slot whose buffer would overflow first
hands what it holds over; an observation longer than the whole buffer (a long prompt) goes through at once.
Either way the drafter sees every position, in order, before it drafts: only when it pays changes.

`handover_seconds` adds up the hand-overs' time on the engine's `clock`: their observe is the price of the
steps that parked, so the engine leaves it out of the drafting step it happens in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from dspark_core.drafters.base import DraftProposal, DraftStep, Drafter

MAX_PARKED_BYTES = 8 << 20  # target features a slot may park


@dataclass
class DeferredState:
    inner: Any  # the wrapped drafter's state
    capacity: int  # positions a slot holds (prompt + output + γ + 2)
    count: list[int]  # [num_slots] parked positions per slot
    drafted: list[bool]  # [num_slots] drafted for since the last observation
    max_parked: int = 0  # positions a slot may park (set with the buffers)
    token_ids: Tensor | None = None  # [num_slots, max_parked]
    features: Tensor | None = None  # [num_slots, max_parked, F]


class DeferredObservations:
    """Wraps `drafter`; parks observations of slots not drafted for and hands them over at their next draft."""

    def __init__(self, drafter: Drafter, clock: Callable[[], float] | None = None,
                 max_parked_bytes: int | None = None) -> None:
        self.drafter, self.clock = drafter, clock
        self.max_parked_bytes = MAX_PARKED_BYTES if max_parked_bytes is None else max_parked_bytes
        self.name, self.target_layer_ids = drafter.name, drafter.target_layer_ids
        self.handover_seconds = 0.0

    def start(self, num_slots: int, capacity: int) -> DeferredState:
        return DeferredState(self.drafter.start(num_slots, capacity), capacity, [0] * num_slots, [False] * num_slots)

    def reset(self, state: DeferredState, rows: Tensor) -> None:
        for row in rows.tolist():
            state.count[row], state.drafted[row] = 0, False
        self.drafter.reset(state.inner, rows)

    def propose(self, state: DeferredState, step: DraftStep) -> DraftProposal:
        rows = step.rows.tolist()
        self.hand_over(state, rows)  # the drafter's context must be complete before it drafts
        for row in rows:
            state.drafted[row] = True
        return self.drafter.propose(state.inner, step)

    def observe(self, state: DeferredState, rows: Tensor, token_ids: Tensor, features: Tensor, num_new: Tensor) -> None:
        if state.features is None:
            self._allocate(state, features)
        rows_l, new_l = rows.tolist(), num_new.tolist()
        through = [state.drafted[r] or n > state.max_parked for r, n in zip(rows_l, new_l)]
        full = [not t and state.count[r] + n > state.max_parked for r, n, t in zip(rows_l, new_l, through)]
        self.hand_over(state, [r for r, t, f in zip(rows_l, through, full) if t or f])  # what is parked goes first
        if all(through):
            self.drafter.observe(state.inner, rows, token_ids, features, num_new)
        else:
            if any(through):
                go = torch.tensor([i for i, t in enumerate(through) if t], device=rows.device)
                self.drafter.observe(state.inner, rows[go], token_ids[go], features[go], num_new[go])
            self._park(state, [i for i, t in enumerate(through) if not t], rows, token_ids, features, num_new)
        for row in rows_l:
            state.drafted[row] = False

    def hand_over(self, state: DeferredState, rows: list[int]) -> None:
        """One batched `observe` of everything slots `rows` hold parked, in order."""
        rows = [r for r in rows if state.count[r] > 0]
        if not rows or state.token_ids is None or state.features is None:
            return
        started = self.clock() if self.clock is not None else 0.0
        device = state.token_ids.device
        slots, counts = torch.tensor(rows, device=device), torch.tensor([state.count[r] for r in rows], device=device)
        width = int(max(state.count[r] for r in rows))
        self.drafter.observe(state.inner, slots, state.token_ids[slots, :width], state.features[slots, :width], counts)
        for r in rows:
            state.count[r] = 0
        if self.clock is not None:
            self.handover_seconds += self.clock() - started

    def _allocate(self, state: DeferredState, features: Tensor) -> None:
        num_slots, num_features = len(state.count), features.shape[-1]
        per_position = num_features * features.element_size()
        state.max_parked = state.capacity if per_position == 0 else max(
            1, min(state.capacity, self.max_parked_bytes // per_position))
        state.token_ids = torch.zeros(num_slots, state.max_parked, dtype=torch.long, device=features.device)
        state.features = torch.empty(num_slots, state.max_parked, num_features, dtype=features.dtype,
                                     device=features.device)

    def _park(self, state: DeferredState, index: list[int], rows: Tensor, token_ids: Tensor, features: Tensor,
              num_new: Tensor) -> None:
        """Append row `index[i]`'s `num_new` positions to its slot's buffer (it has room: `observe` made it)."""
        assert state.token_ids is not None and state.features is not None
        device = rows.device
        at = torch.tensor(index, device=device)
        slots, counts = rows[at], num_new[at]
        width = int(counts.max())
        offsets = torch.arange(width, device=device)
        valid = offsets[None, :] < counts[:, None]  # [P, width]
        starts = torch.tensor([state.count[r] for r in slots.tolist()], device=device)
        slot = slots[:, None].expand(-1, width)[valid]
        pos = (starts[:, None] + offsets[None, :])[valid]
        state.token_ids[slot, pos] = token_ids[at, :width][valid]
        state.features[slot, pos] = features[at, :width][valid]
        for r, n in zip(slots.tolist(), counts.tolist()):
            state.count[r] += n
