"""What the generation loop asks a verification policy, and when (DSPARK.md §2, §4c).

One speculative step asks three things of its policy, in this order:
- `plan(step)`: how many tokens to draft for every row, 0 … γ, *before* the draft forward (0: the step
  skips it and is a plain decoding step). No draft of the step exists yet, so the plan cannot depend on them.
- `choose(proposal, step)`: [R] how many of each row's drafts to verify, after the drafts, before
  verification. Lossless only if position j's choice never depends on draft token j or later (the policies in
  `scheduler.py` say how each keeps that rule).
- `observe(outcome, seconds)`: after the step, what it verified and accepted, and the wall time the engine's
  clock measured for it (None where the loop keeps no clock, as `generate` does).

`VerifyAll` answers all three trivially (draft γ, verify every draft, learn nothing): plain and static
policies extend it and override only `choose`. A policy that may plan fewer than γ drafts sets
`may_skip_drafts`, and the loop then wraps the drafter in `drafters.DeferredObservations`, so steps without
drafts do not pay the drafter's observe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from dspark_core.drafters.base import DraftProposal, DraftStep


@dataclass(frozen=True)
class StepOutcome:
    """One speculative step, per row r of its rows (host values: the step's one device sync made them)."""

    emitted: list[list[int]]  # [R][1 + accepted]: accepted drafts, then the recovered or bonus token
    num_verified: list[int]  # [R] drafts verified
    num_accepted: list[int]  # [R] drafts accepted (a prefix of the verified ones)
    confidences: list[list[float]] | None  # [R][verified] confidence logits; None: the drafter has no head
    draft_length: int  # tokens drafted per row (0: no draft forward ran)
    width: int  # the verify block's width: 1 + the longest verify length


class Policy(Protocol):
    may_skip_drafts: bool  # whether `plan` may answer fewer than γ (then observations are deferred)

    def plan(self, step: DraftStep) -> int:
        """Tokens to draft for every row, 0 … step.num_drafts; `step` holds committed tokens only."""

    def choose(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        """[R] long: drafts of each row to verify (the loop caps it to what was drafted)."""

    def observe(self, outcome: StepOutcome, seconds: float | None) -> None:
        """The step's outcome and its wall time on the engine's clock (None: not timed)."""


class VerifyAll:
    """The trivial policy and the base of the others: draft γ, verify every draft, learn nothing."""

    may_skip_drafts = False

    def plan(self, step: DraftStep) -> int:
        return step.num_drafts

    def choose(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        num_rows, gamma = proposal.token_ids.shape
        drafted = torch.full((num_rows,), gamma, dtype=torch.long, device=proposal.token_ids.device)
        return drafted if proposal.num_valid is None else torch.minimum(drafted, proposal.num_valid)

    def observe(self, outcome: StepOutcome, seconds: float | None) -> None:
        pass


VERIFY_ALL = VerifyAll()  # stateless: the loops' default policy
