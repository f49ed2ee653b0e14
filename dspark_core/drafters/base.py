"""The one interface every drafter implements, and the plain-decoding drafter.

The generation loop owns the committed tokens of every request slot; a drafter owns whatever it
derives from them (context features, its own KV cache). The loop tells a drafter about new
committed positions with `observe` (with the target's features of those positions), and asks for
drafts with `propose`. A proposal carries, per draft position, the token, the draft distribution
that exact rejection sampling needs (None when drafting is deterministic, i.e. one-hot), and the
confidence logit where the drafter has a confidence head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass
class DraftStep:
    """What the loop hands a drafter each step, for the active slots `rows` only."""

    rows: Tensor  # [R] slot index of each active request
    token_ids: Tensor  # [num_slots, capacity] committed tokens; the anchor is the last one
    num_tokens: Tensor  # [num_slots] committed count (features exist for positions < num_tokens − 1)
    num_drafts: int  # γ drafted for every row this step (a policy may verify fewer)
    temperatures: Tensor  # [R] (< GREEDY_TEMPERATURE: greedy)
    generators: list[torch.Generator]  # [R] one stream per request

    @property
    def anchor_ids(self) -> Tensor:
        return self.token_ids[self.rows, self.num_tokens[self.rows] - 1]

    @property
    def anchor_positions(self) -> Tensor:
        return self.num_tokens[self.rows] - 1


@dataclass
class DraftProposal:
    token_ids: Tensor  # [R, num_drafts] long
    draft_probs: Tensor | None  # [R, num_drafts, vocab] fp32; None: deterministic (one-hot) drafts
    confidence_logits: Tensor | None  # [R, num_drafts] fp32 logit of P(accepted | prefix accepted)
    num_valid: Tensor | None = None  # [R] drafts actually proposed (n-gram may find fewer); None: all


@runtime_checkable
class Drafter(Protocol):
    name: str
    target_layer_ids: tuple[int, ...]  # target layers it reads; () for none

    def start(self, num_slots: int, capacity: int) -> Any:
        """Allocate per-slot state for a batch of `num_slots` requests."""

    def reset(self, state: Any, rows: Tensor) -> None:
        """Forget slots `rows` (a new request will use them)."""

    def observe(self, state: Any, rows: Tensor, token_ids: Tensor, features: Tensor, num_new: Tensor) -> None:
        """Append `num_new` committed positions per row: their tokens [R, max_new] and target features
        [R, max_new, F] (the target's forward over them has run)."""

    def propose(self, state: Any, step: DraftStep) -> DraftProposal:
        """Draft `step.num_drafts` tokens after each row's anchor."""


class StatelessDrafter:
    """Base of drafters that keep no per-slot state and read no target features."""

    target_layer_ids: tuple[int, ...] = ()

    def start(self, num_slots: int, capacity: int) -> None:
        return None

    def reset(self, state: None, rows: Tensor) -> None:
        pass

    def observe(self, state: None, rows: Tensor, token_ids: Tensor, features: Tensor, num_new: Tensor) -> None:
        pass


class NoDrafter(StatelessDrafter):
    """`none`: plain decoding. Proposes nothing, so each step emits exactly the target's next token."""

    name = "none"

    def propose(self, state: None, step: DraftStep) -> DraftProposal:
        empty = torch.empty(len(step.rows), 0, dtype=torch.long, device=step.token_ids.device)
        return DraftProposal(token_ids=empty, draft_probs=None, confidence_logits=None)
