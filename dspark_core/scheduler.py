"""Verification policies: how many of each request's drafts to verify this step (DSPARK.md §2, §4c).

Every policy is a callable `policy(proposal, step) -> [R] long` (the loop's `VerifyPolicy`): the number of
drafts of row r to send to the target, 0 … γ. The loop caps it further by the token budget and by the
drafts actually proposed.

Losslessness (the one rule): the decision to verify draft position j of a request may depend on that
request's draft tokens before j, never on token j or later. The confidence logit c_j is computed from
x_{j-1} (DSpark's confidence head reads W1[x_{j-1}]), so it may be used for position j and after, and
the cumulative survival a_j = Π_{i≤j} σ(c_i / T_i) depends on x_1 … x_{j-1} only. Each policy below
keeps the rule as follows:
- `StaticLength`: decides before any token exists.
- `ConfidenceThreshold`: verifies j iff σ(c_i / T_i) ≥ threshold for every i ≤ j.
- `PrefixScheduler` (paper Algorithm 1): candidates in order of a, admitted one at a time, stopping at the
  first one that lowers Θ. Whether (r, j) is admitted depends only on the candidates ranked before it,
  and none of those is a later position of request r (its survival is ≤ a_{r,j}, and ties go to the
  earlier position). Without the early stop, a later candidate (r, j+1), whose survival depends on x_j,
  can decide whether (r, j) is verified: the paper's appendix shows a (0.7, 0.3) target turning into
  (0.85, 0.15) (tests/dspark_core/test_scheduler.py reproduces it).
- `AsyncBudgetScheduler` (production): the total number K of drafts to verify is fixed from the
  confidences of `delay` (= 2) steps back, as an engine that fixes batch sizes ahead of time must. K is
  past information, hence a constant for this step's drafts: the causal barrier. The step then verifies
  the top-K candidates by current survival; whether (r, j) is in the top K depends only on candidates
  ranked before it (as above), so each request's set is a prefix decided without looking at x_j.

Survival is computed with the STS temperatures (a [γ] tensor) or an `OnlineCalibrator` (its current
temperatures, via `calibrate`), never both; temperatures fitted on past cycles are past information.

Tie-breaking: candidates are sorted by survival, descending and stable over a position-major layout
(all requests' position 1, then position 2, …), so equal survival goes to the earlier position, then the
lower row. Survival is also made non-increasing along j (a running minimum, a no-op for real
confidences), so the sorted order can never place (r, j) before (r, j−1), and the returned lengths are
counted as the run of admitted positions from j = 1: prefix-ness is enforced, not assumed.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import torch
from torch import Tensor

from dspark_core.drafters.base import DraftProposal, DraftStep
from dspark_core.sps import SPSTable


class Calibrator(Protocol):
    """What a policy needs from `dspark_core.calibration.OnlineCalibrator`."""

    gamma: int

    def calibrate(self, conf_logits: Tensor) -> Tensor: ...


# --------------------------------------------------------------------------- confidences → survival


class _Calibrated:
    """Shared by the confidence-based policies: calibrated logits and survival of a proposal."""

    def __init__(self, temperatures: Tensor | None = None, calibrator: Calibrator | None = None) -> None:
        if temperatures is not None and calibrator is not None:
            raise ValueError("pass STS temperatures or an online calibrator, not both")
        if temperatures is not None:
            temperatures = torch.as_tensor(temperatures, dtype=torch.float64)
            if temperatures.dim() != 1 or temperatures.numel() == 0 or not bool((temperatures > 0).all()):
                raise ValueError("temperatures must be a non-empty 1-D tensor [γ] of positive values")
        self.temperatures = temperatures
        self.calibrator = calibrator

    def calibrated_logits(self, proposal: DraftProposal) -> Tensor:
        """[R, γ] float64 c / T of every drafted position."""
        conf = proposal.confidence_logits
        if conf is None:
            raise ValueError(
                f"{type(self).__name__} needs confidences: the drafter has no confidence head "
                "(use StaticLength, or a DSpark draft with confidence_head=True)"
            )
        gamma = conf.shape[1]
        if self.calibrator is not None:
            if self.calibrator.gamma != gamma:
                raise ValueError(f"calibrator is for γ={self.calibrator.gamma}, the proposal has γ={gamma}")
            return self.calibrator.calibrate(conf.double())
        if self.temperatures is not None:
            if self.temperatures.numel() < gamma:
                raise ValueError(f"{self.temperatures.numel()} temperatures for γ={gamma} draft positions")
            return conf.double() / self.temperatures[:gamma].to(conf.device)
        return conf.double()

    def survival(self, proposal: DraftProposal) -> Tensor:
        """[R, γ] float64 a_{r,j}, made non-increasing in j; 0 where no draft was proposed (num_valid)."""
        a = torch.cumprod(torch.sigmoid(self.calibrated_logits(proposal)), dim=1)
        a = torch.cummin(a, dim=1).values  # no-op for real cumprods; guarantees the prefix order
        if proposal.num_valid is not None:
            positions = torch.arange(a.shape[1], device=a.device)
            a = torch.where(positions[None, :] < proposal.num_valid[:, None], a, torch.zeros_like(a))
        return a


def _leading_run(mask: Tensor) -> Tensor:
    """[R, γ] bool → [R] long: admitted positions counted from j = 1 up to the first gap."""
    return mask.long().cumprod(dim=1).sum(dim=1)


# --------------------------------------------------------------------------- static policies


class StaticLength:
    """Verify min(γ', drafted) drafts of every request."""

    def __init__(self, num_verify: int) -> None:
        if num_verify < 0:
            raise ValueError(f"num_verify must be >= 0, got {num_verify}")
        self.num_verify = num_verify

    def __call__(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        num_rows, gamma = proposal.token_ids.shape
        drafted = proposal.num_valid if proposal.num_valid is not None else torch.full(
            (num_rows,), gamma, dtype=torch.long, device=proposal.token_ids.device
        )
        return drafted.clamp(max=self.num_verify)


class ConfidenceThreshold(_Calibrated):
    """Verify up to (not including) the first position whose σ(c_k / T_k) < threshold."""

    def __init__(
        self, threshold: float, temperatures: Tensor | None = None, calibrator: Calibrator | None = None
    ) -> None:
        super().__init__(temperatures, calibrator)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {threshold}")
        self.threshold = threshold

    def __call__(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        confident = torch.sigmoid(self.calibrated_logits(proposal)) >= self.threshold  # [R, γ]
        n = _leading_run(confident)
        return n if proposal.num_valid is None else torch.minimum(n, proposal.num_valid)


# --------------------------------------------------------------------------- hardware-aware prefix scheduler


def rank_candidates(survival: Tensor) -> tuple[Tensor, Tensor]:
    """Candidates (r, j) in admission order.

    survival [R, γ] (non-increasing in j) → (sorted survival [R·γ] descending, rank [R, γ] long: the
    0-based place of (r, j) in that order). Position-major layout + stable sort: ties go to the earlier
    position, then the lower row, so (r, j−1) always ranks before (r, j).
    """
    num_rows, gamma = survival.shape
    flat = survival.t().reshape(-1)  # [γ·R], index = j·R + r
    sorted_a, order = torch.sort(flat, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return sorted_a, rank.view(gamma, num_rows).t()


def throughput_curve(sorted_survival: Tensor, num_rows: int, sps: SPSTable) -> Tensor:
    """Θ_k = τ_k · SPS(R + k) after admitting the first k candidates, k = 0 … N: [N + 1] float64.

    τ_k = R + Σ_{i≤k} a_i: one guaranteed token per request (bonus or correction) plus the expected
    accepted drafts (a_{r,j} is the probability that draft j of request r is accepted).
    """
    n = sorted_survival.numel()
    tau = torch.empty(n + 1, dtype=torch.float64, device=sorted_survival.device)
    tau[0] = num_rows
    tau[1:] = num_rows + torch.cumsum(sorted_survival.double(), dim=0)
    return tau * sps.lookup_range(num_rows, num_rows + n + 1, sorted_survival.device)


def first_drop(theta: Tensor, sorted_survival: Tensor) -> Tensor:
    """Algorithm 1's stop: the number of candidates admitted before the first one that lowers Θ (0-dim long).

    Admitting candidate k keeps going iff Θ_k ≥ Θ_{k−1}; a candidate with zero survival (not drafted) can
    add nothing and ends the list.
    """
    keeps = (theta[1:] >= theta[:-1]) & (sorted_survival > 0)  # [N]
    return keeps.long().cumprod(dim=0).sum()


def admit_top(rank: Tensor, survival: Tensor, num_admitted: Tensor | int) -> Tensor:
    """[R] long verify lengths when the first `num_admitted` candidates (by rank) are admitted."""
    return _leading_run((rank < num_admitted) & (survival > 0))


def schedule_prefix(survival: Tensor, sps: SPSTable) -> Tensor:
    """Paper Algorithm 1 on survival [R, γ] (non-increasing in j): [R] long verify lengths.

    Start with B = R, τ = R, Θ = R·SPS(R); admit candidates in order of survival (B += 1, τ += a), keep
    going while Θ' = τ·SPS(B) ≥ Θ, stop at the first drop. Sort + cumsum + first-drop search: no loop.
    """
    num_rows = survival.shape[0]
    if num_rows == 0 or survival.shape[1] == 0:
        return torch.zeros(num_rows, dtype=torch.long, device=survival.device)
    sorted_a, rank = rank_candidates(survival)
    return admit_top(rank, survival, first_drop(throughput_curve(sorted_a, num_rows, sps), sorted_a))


class PrefixScheduler(_Calibrated):
    """The hardware-aware prefix scheduler (paper Algorithm 1): long verification on an idle GPU, short
    on a busy one. `sps` is the SPS table of the hardware it runs on."""

    def __init__(self, sps: SPSTable, temperatures: Tensor | None = None, calibrator: Calibrator | None = None) -> None:
        super().__init__(temperatures, calibrator)
        self.sps = sps

    def num_admitted(self, theta: Tensor, sorted_survival: Tensor) -> Tensor:
        """How many of the sorted candidates to admit, from Θ_0 … Θ_N (the early stop)."""
        return first_drop(theta, sorted_survival)

    def __call__(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        a = self.survival(proposal)  # [R, γ]
        num_rows = a.shape[0]
        if num_rows == 0 or a.shape[1] == 0:
            return torch.zeros(num_rows, dtype=torch.long, device=a.device)
        sorted_a, rank = rank_candidates(a)
        k = self.num_admitted(throughput_curve(sorted_a, num_rows, self.sps), sorted_a)
        return admit_top(rank, a, k)


class AsyncBudgetScheduler(PrefixScheduler):
    """The production variant: the total verify budget K comes from the confidences of `delay` steps back.

    Each call runs Algorithm 1 on the current confidences only to *plan* a budget (the number of drafts it
    would admit) and remembers it; the budget it *uses* is the one planned `delay` calls earlier, as in an
    engine that fixes the next batch size ahead of time (zero-overhead scheduling, CUDA-graph replay).
    Which drafts fill the budget is decided now: the top K by current survival, a prefix per request.
    Until `delay` plans exist (the first steps of a run) it uses `initial_budget`, or if that is None the
    current plan, which is Algorithm 1 itself. Call `reset()` between independent runs: the history
    belongs to the engine, not to a request.

    The causal barrier: K is fixed before this step's drafts are sampled, so it is a constant as far as
    they are concerned, and top-K by survival never lets x_j decide whether position j is verified.
    """

    def __init__(
        self,
        sps: SPSTable,
        delay: int = 2,
        initial_budget: int | None = None,
        temperatures: Tensor | None = None,
        calibrator: Calibrator | None = None,
    ) -> None:
        super().__init__(sps, temperatures, calibrator)
        if delay < 0 or (initial_budget is not None and initial_budget < 0):
            raise ValueError(f"need delay >= 0 and initial_budget >= 0, got {delay}, {initial_budget}")
        self.delay = delay
        self.initial_budget = initial_budget
        self._planned: deque[int] = deque(maxlen=max(delay, 1))

    @property
    def planned_budgets(self) -> tuple[int, ...]:
        """Budgets planned by the last `delay` calls, oldest first (the next call uses the first)."""
        return tuple(self._planned)

    def reset(self) -> None:
        self._planned.clear()

    def num_admitted(self, theta: Tensor, sorted_survival: Tensor) -> int:
        planned = int(first_drop(theta, sorted_survival))  # what Algorithm 1 would admit now
        if self.delay == 0:
            return planned
        if len(self._planned) == self.delay:
            budget = self._planned[0]
        else:
            budget = planned if self.initial_budget is None else self.initial_budget
        self._planned.append(planned)
        return budget
