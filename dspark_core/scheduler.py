"""Verification policies: how many of each request's drafts to verify this step (DSPARK.md §2, §4c).

Every policy implements `dspark_core.policy.Policy`; its `choose(proposal, step) -> [R] long` is the number of
drafts of row r to send to the target, 0 … γ (the loop caps it by the drafts actually proposed). All but
`CostAwareScheduler` draft γ every step and learn nothing from outcomes (`VerifyAll`'s `plan` and `observe`).

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
- `CostAwareScheduler` (the in-house engine): how many tokens to draft (0: no draft forward at all) is
  planned from the acceptance of *earlier* steps and a measured step-cost table, and asked for before the
  draft forward runs (`plan`), so this step's drafts cannot influence it. The verify width is then
  chosen layer by layer (position j of every request at once) with Algorithm 1's early stop: layer j is
  admitted from the survivals of positions ≤ j, and a_{r,j} depends on request r's x_1 … x_{j−1} only.

Survival is computed with the STS temperatures (a [γ] tensor, with the level offsets fitted beside them
where the draft has them: `calibration.fit_sts_level`) or an `OnlineCalibrator` (its current
temperatures, via `calibrate`), never both; a calibration fitted on past cycles is past information.

Tie-breaking: candidates are sorted by survival, descending and stable over a position-major layout
(all requests' position 1, then position 2, …), so equal survival goes to the earlier position, then the
lower row. Survival is also made non-increasing along j (a running minimum, a no-op for real
confidences), so the sorted order can never place (r, j) before (r, j−1), and the returned lengths are
counted as the run of admitted positions from j = 1: prefix-ness is enforced, not assumed.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

import torch
from torch import Tensor

from dspark_core.kernels import use_triton
from dspark_core.drafters.base import DraftProposal, DraftStep
from dspark_core.costs import SPSTable, StepCostTable
from dspark_core.policy import StepOutcome, VerifyAll


class Calibrator(Protocol):
    """What a policy needs from `dspark_core.calibration.OnlineCalibrator`."""

    gamma: int

    def calibrate(self, conf_logits: Tensor) -> Tensor: ...


# --------------------------------------------------------------------------- confidences → survival


class _Calibrated(VerifyAll):
    """Shared by the confidence-based policies: calibrated logits and survival of a proposal."""

    def __init__(self, temperatures: Tensor | None = None, calibrator: Calibrator | None = None, *,
                 offsets: Tensor | None = None) -> None:
        if temperatures is not None and calibrator is not None:
            raise ValueError("pass STS temperatures or an online calibrator, not both")
        if temperatures is not None:
            temperatures = torch.as_tensor(temperatures, dtype=torch.float64)
            if temperatures.dim() != 1 or temperatures.numel() == 0 or not bool((temperatures > 0).all()):
                raise ValueError("temperatures must be a non-empty 1-D tensor [γ] of positive values")
        if offsets is not None:
            if temperatures is None:
                raise ValueError("level offsets come with the STS temperatures they were fitted with")
            offsets = torch.as_tensor(offsets, dtype=torch.float64)
            if offsets.shape != temperatures.shape:
                raise ValueError(f"offsets must match the temperatures' shape {tuple(temperatures.shape)}, "
                                 f"got {tuple(offsets.shape)}")
        self.temperatures = temperatures
        self.offsets = offsets
        self.calibrator = calibrator

    def calibrated_logits(self, proposal: DraftProposal) -> Tensor:
        """[R, γ] float64 c / T + b of every drafted position (b = 0 without level offsets)."""
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
            scaled = conf.double() / self.temperatures[:gamma].to(conf.device)
            return scaled if self.offsets is None else scaled + self.offsets[:gamma].to(conf.device)
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


class StaticLength(VerifyAll):
    """Verify min(γ', drafted) drafts of every request."""

    def __init__(self, num_verify: int) -> None:
        if num_verify < 0:
            raise ValueError(f"num_verify must be >= 0, got {num_verify}")
        self.num_verify = num_verify

    def choose(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        return super().choose(proposal, step).clamp(max=self.num_verify)  # of what was drafted


class ConfidenceThreshold(_Calibrated):
    """Verify up to (not including) the first position whose calibrated σ(c_k / T_k + b_k) < threshold."""

    def __init__(
        self, threshold: float, temperatures: Tensor | None = None, calibrator: Calibrator | None = None, *,
        offsets: Tensor | None = None,
    ) -> None:
        super().__init__(temperatures, calibrator, offsets=offsets)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {threshold}")
        self.threshold = threshold

    def choose(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
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


def dispatch_schedule_prefix(survival: Tensor, sps: SPSTable) -> Tensor:
    """`schedule_prefix` on the Triton kernel where it runs (kernels/prefix_scheduler.py, no host sync):
    survival [R, γ] (non-increasing in j) → [R] long verify lengths."""
    num_rows, gamma = survival.shape
    if num_rows == 0 or gamma == 0 or not use_triton(survival.device):
        return schedule_prefix(survival, sps)
    from dspark_core.kernels.prefix_scheduler import schedule_prefix_triton

    sps_range = sps.lookup_range(num_rows, num_rows * (gamma + 1) + 1, survival.device)  # SPS(R … R + R·γ)
    return schedule_prefix_triton(survival, None, None, sps_range)


def dispatch_schedule_prefix_from_logits(
    calibrated_logits: Tensor, sps: SPSTable, num_valid: Tensor | None = None
) -> Tensor:
    """Survival a_{r,j} = running-min of Π_{i≤j} σ(c_i/T_i) (0 past `num_valid`), then Algorithm 1, in one
    go: calibrated_logits [R, γ] (c/T) → [R] long. Twin: `calibrated_survival` then `schedule_prefix`."""
    num_rows, gamma = calibrated_logits.shape
    if num_rows == 0 or gamma == 0 or not use_triton(calibrated_logits.device):
        return schedule_prefix(calibrated_survival(calibrated_logits, num_valid), sps)
    from dspark_core.kernels.prefix_scheduler import schedule_prefix_triton

    sps_range = sps.lookup_range(num_rows, num_rows * (gamma + 1) + 1, calibrated_logits.device)
    return schedule_prefix_triton(None, calibrated_logits, num_valid, sps_range)


def calibrated_survival(calibrated_logits: Tensor, num_valid: Tensor | None = None) -> Tensor:
    """`_Calibrated.survival` on calibrated logits rather than on a proposal: [R, γ] float64."""
    empty = torch.empty(calibrated_logits.shape, dtype=torch.long, device=calibrated_logits.device)
    return _Calibrated().survival(DraftProposal(empty, None, calibrated_logits, num_valid))


class PrefixScheduler(_Calibrated):
    """The hardware-aware prefix scheduler (paper Algorithm 1): long verification on an idle GPU, short
    on a busy one. `sps` is the SPS table of the hardware it runs on."""

    def __init__(self, sps: SPSTable, temperatures: Tensor | None = None, calibrator: Calibrator | None = None, *,
                 offsets: Tensor | None = None) -> None:
        super().__init__(temperatures, calibrator, offsets=offsets)
        self.sps = sps

    def num_admitted(self, theta: Tensor, sorted_survival: Tensor) -> Tensor | int:
        """How many of the sorted candidates to admit, from Θ_0 … Θ_N (the early stop)."""
        return first_drop(theta, sorted_survival)

    def choose(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        a = self.survival(proposal)  # [R, γ]
        num_rows = a.shape[0]
        if num_rows == 0 or a.shape[1] == 0:
            return torch.zeros(num_rows, dtype=torch.long, device=a.device)
        if type(self) is PrefixScheduler:  # Algorithm 1 as is: the on-device kernel where it runs (no host sync)
            return dispatch_schedule_prefix(a, self.sps)
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
        *,
        offsets: Tensor | None = None,
    ) -> None:
        super().__init__(sps, temperatures, calibrator, offsets=offsets)
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

    def num_admitted(self, theta: Tensor, sorted_survival: Tensor) -> Tensor | int:
        planned = int(first_drop(theta, sorted_survival))  # what Algorithm 1 would admit now
        if self.delay == 0:
            return planned
        if len(self._planned) == self.delay:
            budget = self._planned[0]
        else:
            budget = planned if self.initial_budget is None else self.initial_budget
        self._planned.append(planned)
        return budget


# --------------------------------------------------------------------------- drafting only when it pays


class CostAwareScheduler(_Calibrated):
    """Drafts only when drafting pays for itself, on the engine's measured step costs.

    A step over R requests that drafts g tokens each and verifies a [R, W] block costs
    `costs.draft_seconds(R, g) + costs.verify_seconds(R, W)` (the in-house engine pads the verify block to
    its longest row, so W = 1 + the longest verify length, not R + K, sets the price; g = 0 skips the draft
    forward and is a plain decoding step).

    Plan (`plan`, asked before the draft forward): from the outcomes of earlier steps
    (`observe_outcomes`: drafts verified and accepted per request) it keeps, per draft position j, how
    often verification reached j (all drafts before it accepted) and how often j was then accepted; the
    counts decay by 1 − 1/`window` every step, drafted or not, so old evidence fades. With the acceptance
    rate q_j = (accepted + w·q_{j−1}) / (reached + w) (w = `prior_weight`, q_0 = ½: a rarely reached deep
    position borrows the estimate of the one before it), drafting g tokens and verifying them all is
    expected to emit R·(1 + Σ_{j≤g} Π_{i≤j} q_i) tokens in draft_seconds(R, g) + verify_seconds(R, g + 1); g = 0 is plain
    decoding, R tokens in verify_seconds(R, 1). The plan is the g of highest expected tokens per second,
    ties to the smaller g, and drafting must beat plain decoding by `margin` (a fraction): the largest of
    several noisy estimates is optimistic, and near break-even a wrong "draft" costs more than a wrong
    "plain". Realised acceptance, not confidences, drives the plan: it needs no calibration and works for
    drafters without a confidence head.
    Exploration: estimates of positions that are not drafted never move, so on the first step, on steps 1,
    2, 4, … (the first `cold_explorations` powers of two: a cold start's first outcomes are few and often
    untypical, the first tokens of an answer) and every `explore_every` steps the plan is made with
    optimistic rates (accepted + o) / (reached + 1), o = `optimism`: as if the next trial succeeded with a high but plausible acceptance (an unseen position
    counts as o). It must beat plain decoding by the margin too: a later plan needs that margin on rates
    no higher than these, so a trial below it could not change a plan. Where drafting could not pay even
    then (a large batch, or a tie), the optimistic plan drafts nothing, so exploring costs nothing there;
    after a long stretch without drafts the decayed counts make it try again.

    Fill (`choose`, after the drafts): every drafted token is verified (the plan already sized the draft
    to what pays), unless `early_stop`: then, the draft forward being paid, position layers j = 1 … g are
    admitted in order while Θ_w = (R + Σ_r Σ_{j≤w} a_{r,j}) / (draft_seconds(R, g) + verify_seconds(R, w + 1))
    does not drop (Algorithm 1's early stop, per layer; a_{r,j} the calibrated survival), and every request
    verifies w (in a padded block the shorter rows' extra positions cost nothing). That uses this step's
    confidences, so it only helps where they are calibrated; on the embedded default they underestimate
    acceptance and cutting on them loses tokens, hence off by default.

    Learned prices (`observe_step_seconds`, on by default): the engine reports each step's wall time on its clock
    and the scheduler keeps, for plain steps and for drafting steps apart, the factor by which the table is
    off (a geometric mean over about the last `cost_window` steps of that kind, each observation clipped to
    ×/÷ 4 so a stall does not swing it). It is a decayed mean, not an average pulled from 1: drafting steps
    are rare under load, and one that cost 1.4× its price must not be read as 1.02× for the next dozen
    (on the embedded default at c = 64 that made the scheduler draft at 0.8× plain throughput). A table
    measured under other load, threads or context lengths is thus corrected by the steps it prices; only the
    ratio of the two factors changes a plan.

    Losslessness: the plan is a function of the step counter, R, the cost table, the wall times and outcomes
    of earlier steps, all fixed before this step's drafts are sampled (the causal barrier of `AsyncBudgetScheduler`'s
    two-step-old budget). With `early_stop` the fill admits layer j from the survivals of positions ≤ j
    of every request; request r's a_{r,j} depends on its own x_1 … x_{j−1}, and the other requests'
    drafts are independent of r's, so whether x_{r,j} is verified never depends on x_{r,j} or later.
    This step's outcomes reach the estimates only after its verification, for later plans.
    """

    may_skip_drafts = True

    def __init__(
        self,
        costs: StepCostTable,
        temperatures: Tensor | None = None,
        calibrator: Calibrator | None = None,
        window: float = 64.0,
        explore_every: int = 16,
        margin: float = 0.05,
        optimism: float = 0.9,
        early_stop: bool = False,
        learn_costs: bool = True,
        cost_window: float = 16.0,
        prior_weight: float = 2.0,
        cold_explorations: int = 4,
        offsets: Tensor | None = None,
    ) -> None:
        super().__init__(temperatures, calibrator, offsets=offsets)
        if window < 1 or explore_every < 1 or margin < 0 or not 0 < optimism <= 1 or cost_window < 1:
            raise ValueError(f"need window >= 1, explore_every >= 1, margin >= 0, 0 < optimism <= 1, "
                             f"cost_window >= 1, got {window}, {explore_every}, {margin}, {optimism}, {cost_window}")
        self.costs, self.window, self.explore_every = costs, float(window), explore_every
        self.margin, self.optimism, self.early_stop = margin, optimism, early_stop
        self.learn_costs, self.cost_window = learn_costs, float(cost_window)
        if prior_weight <= 0:
            raise ValueError(f"need prior_weight > 0, got {prior_weight}")
        self.prior_weight = float(prior_weight)
        self._cold_explorations = frozenset(1 << k for k in range(max(cold_explorations, 0)))
        self.reset()

    def reset(self) -> None:
        """Forget the estimates (between independent runs)."""
        self.trials: list[float] = []  # [j] decayed count of verifications that reached draft position j + 1
        self.accepts: list[float] = []  # [j] … of which accepted it
        self.num_plans = 0
        self.cost_factors = [1.0, 1.0]  # measured / table seconds: [plain steps, drafting steps]
        self._log_ratio_sum = [0.0, 0.0]  # decayed Σ log(measured / table) per kind, and its decayed count:
        self._ratio_weight = [0.0, 0.0]  # their ratio is a mean, so the first step observed counts in full

    def observe_step_seconds(self, num_rows: int, draft_length: int, width: int, seconds: float) -> None:
        """A step this scheduler planned took `seconds`: R rows, g tokens drafted each, a verify block W wide."""
        if not self.learn_costs or num_rows < 1 or width < 1 or not math.isfinite(seconds) or seconds <= 0:
            return
        priced = self.costs.verify_seconds(num_rows, width) + self.costs.draft_seconds(num_rows, draft_length)
        ratio = min(max(seconds / priced, 0.25), 4.0)
        kind = int(draft_length > 0)
        keep = 1.0 - 1.0 / self.cost_window
        self._log_ratio_sum[kind] = keep * self._log_ratio_sum[kind] + math.log(ratio)
        self._ratio_weight[kind] = keep * self._ratio_weight[kind] + 1.0
        self.cost_factors[kind] = math.exp(self._log_ratio_sum[kind] / self._ratio_weight[kind])

    def acceptance_rates(self, num_drafts: int, optimistic: bool = False) -> list[float]:
        """q_j, j = 1 … num_drafts: P(draft j accepted | drafts 1 … j−1 accepted). Each position's counts are
        shrunk toward the estimate of the position before it (½ for the first), with the weight of
        `prior_weight` trials: deep positions are reached rarely, and one early rejection there must not
        read as "never accepted" (acceptance changes slowly with depth, so the shallower estimate is the
        natural guess). With `optimistic`, the prior is `optimism` with the weight of one trial, as if the
        next trial succeeded with that probability."""
        rates, prior = [], 0.5
        for j in range(num_drafts):
            trials, accepts = (self.trials[j], self.accepts[j]) if j < len(self.trials) else (0.0, 0.0)
            if optimistic:
                q = (accepts + self.optimism) / (trials + 1.0)
            else:
                q = (accepts + self.prior_weight * prior) / (trials + self.prior_weight)
                prior = q
            rates.append(q)
        return rates

    def expected_throughput(self, num_rows: int, num_drafts: int, optimistic: bool = False) -> list[float]:
        """Planned tokens per second for drafting g = 0 … num_drafts tokens and verifying them all."""
        verify, draft = self.costs.curves(num_rows, num_drafts)
        out, gain, survive = [], 0.0, 1.0
        for g, q in enumerate([1.0] + self.acceptance_rates(num_drafts, optimistic)):
            if g > 0:
                survive *= q
                gain += survive
            out.append(num_rows * (1.0 + gain) / ((draft[g] + verify[g + 1]) * self.cost_factors[int(g > 0)]))
        return out

    def plan(self, step: DraftStep) -> int:
        gamma, num_rows = step.num_drafts, len(step.rows)
        n = self.num_plans
        explore = n % self.explore_every == 0 or n in self._cold_explorations
        g = 0
        if num_rows > 0 and gamma > 0:
            theta = self.expected_throughput(num_rows, gamma, optimistic=explore)
            g = max(range(1, gamma + 1), key=lambda i: (theta[i], -i))
            # The margin applies to exploring too: a later plan drafts only past the margin, on rates no higher
            # than the optimistic ones, so a trial that could not reach it would teach nothing worth its price.
            if theta[g] <= theta[0] * (1.0 + self.margin):
                g = 0
        keep = 1.0 - 1.0 / self.window  # one step older, drafted or not
        self.trials = [keep * n for n in self.trials]
        self.accepts = [keep * a for a in self.accepts]
        self.num_plans += 1
        return g

    def observe(self, outcome: StepOutcome, seconds: float | None) -> None:
        """A step's outcomes (if it drafted) and its wall time (if the loop timed it) teach the next plans."""
        if outcome.draft_length > 0:
            self.observe_outcomes(torch.tensor(outcome.num_verified), torch.tensor(outcome.num_accepted))
        if seconds is not None:
            self.observe_step_seconds(len(outcome.num_verified), outcome.draft_length, outcome.width, seconds)

    def observe_outcomes(self, num_verified: Tensor, num_accepted: Tensor) -> None:
        """Add one step's outcomes ([R] drafts verified, [R] accepted) to the per-position counts."""
        longest = int(num_verified.max()) if num_verified.numel() else 0
        if longest == 0:
            return
        while len(self.trials) < longest:
            self.trials.append(0.0)
            self.accepts.append(0.0)
        positions = torch.arange(longest, device=num_verified.device)[:, None]  # [γ', 1]: position j − 1
        reached = (num_verified[None, :] > positions) & (num_accepted[None, :] >= positions)  # [γ', R]
        accepted = num_accepted[None, :] > positions
        for j, (n, a) in enumerate(zip(reached.sum(1).tolist(), (reached & accepted).sum(1).tolist())):
            self.trials[j] += n
            self.accepts[j] += a

    def choose(self, proposal: DraftProposal, step: DraftStep) -> Tensor:
        num_rows, g = proposal.token_ids.shape
        if num_rows == 0 or g == 0 or not self.early_stop or proposal.confidence_logits is None:
            return super().choose(proposal, step)  # every drafted token
        a = self.survival(proposal)  # [R, g]
        verify, draft = self.costs.curves(num_rows, g)
        layer_gain = a.sum(dim=0)  # [g] expected accepted drafts of position layer j
        tau = torch.cat([layer_gain.new_zeros(1), layer_gain.cumsum(0)]) + num_rows  # [g + 1]
        seconds = torch.tensor([draft[g] + verify[w + 1] for w in range(g + 1)], dtype=torch.float64)
        width = self.admitted_layers(tau / seconds.to(tau.device), layer_gain)
        lengths = torch.full((num_rows,), int(width), dtype=torch.long, device=a.device)
        return lengths if proposal.num_valid is None else torch.minimum(lengths, proposal.num_valid)

    def admitted_layers(self, theta: Tensor, layer_gain: Tensor) -> Tensor:
        """How many position layers to verify, from Θ_0 … Θ_g (Algorithm 1's early stop, per layer)."""
        return first_drop(theta, layer_gain)
