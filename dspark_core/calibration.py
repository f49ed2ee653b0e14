"""Calibration of the confidence head: ECE, Brier, reliability tables, STS and STS with level offsets.

The scheduler ranks (request, length) candidates by predicted cumulative survival, so what matters is
that the *cumulative* prediction matches how often the first j drafts really all get accepted. Every
metric here is therefore stated on cumulative survival, never on the per-position conditional c_k.

Data convention (one row per verify cycle; other modules pass exactly these):

    conf_logits   # [num_cycles, gamma] float: raw confidence-head logit c_k of draft position k=1..gamma,
                  #   sigma(c_k) = P(draft k accepted | drafts < k accepted)
    num_verified  # [num_cycles] long in 0..gamma: draft positions sent to the target this cycle
    num_accepted  # [num_cycles] long in 0..num_verified: accepted drafts this cycle

    predicted survival   a_j = prod_{i<=j} sigmoid(c_i / T_i + b_i)    (T_i = 1, b_i = 0 for raw;
                                                                     b_i = 0 for STS alone)
    realised outcome     y_j = (num_accepted >= j)
    observed             j <= num_verified

Only observed positions count. After a rejection at position r < num_verified, positions r+1..num_verified
are observed with y = 0, which is fine: whether they were verified was decided before the outcome. A
position past num_verified is *not* counted even though an earlier rejection already fixes its y = 0:
counting it only when it is determined would select on the outcome and bias every metric downwards.

ECE conventions (DSPARK.md section 4):
- per position j: num_bins equal-width bins on [0, 1] over a_j, bin = min(floor(a_j * num_bins),
  num_bins - 1); ECE_j = sum_b (n_b / N_j) * |mean a_j in b - mean y_j in b|, N_j observed cycles at j.
- overall: count-weighted mean of ECE_j over positions, weights N_j (equivalently, pooled over all
  observed (cycle, position) pairs, each position keeping its own bins). Positions with N_j = 0 are NaN
  per position and weigh nothing overall.
- Brier: mean (a_j - y_j)^2 over observed cycles per position; overall with the same N_j weights.

All statistics are computed in float64 so that the STS fit and the report see identical numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

DEFAULT_NUM_BINS = 20


def default_sts_grid() -> Tensor:
    """Log-spaced temperatures over [0.05, 20] plus exactly 1.0, so "leave as is" is always a candidate."""
    grid = torch.exp(torch.linspace(math.log(0.05), math.log(20.0), 300, dtype=torch.float64))
    return torch.unique(torch.cat([grid, torch.ones(1, dtype=torch.float64)]))  # [301], sorted


def cumulative_survival(conf_logits: Tensor, temperatures: Tensor | None = None, offsets: Tensor | None = None) -> Tensor:
    """a_j = prod_{i<=j} sigmoid(c_i / T_i + b_i); non-increasing in j by construction, whatever the T_i > 0.

    `offsets` b_i (default 0) are `fit_sts_level`'s: what a temperature alone cannot do (module docstring)."""
    compute_dtype = torch.promote_types(conf_logits.dtype, torch.float32)
    logits = conf_logits.to(compute_dtype)  # [num_cycles, gamma]
    if temperatures is not None:
        logits = logits / temperatures.to(device=logits.device, dtype=compute_dtype)  # T: [gamma]
    if offsets is not None:
        logits = logits + offsets.to(device=logits.device, dtype=compute_dtype)  # b: [gamma]
    return torch.cumprod(torch.sigmoid(logits), dim=-1).to(conf_logits.dtype)  # [num_cycles, gamma]


def _observed_and_realised(
    num_verified: Tensor, num_accepted: Tensor, gamma: int
) -> tuple[Tensor, Tensor]:
    """Masks of observed positions and of realised survival, both [num_cycles, gamma] bool."""
    positions = torch.arange(1, gamma + 1, device=num_verified.device)  # [gamma], 1-indexed
    observed = positions[None, :] <= num_verified[:, None]
    realised = positions[None, :] <= num_accepted[:, None]
    return observed, realised


def _check_inputs(conf_logits: Tensor, num_verified: Tensor, num_accepted: Tensor) -> None:
    """Fail loudly on malformed cycles: a silent mismatch would corrupt every metric downstream."""
    if conf_logits.dim() != 2:
        raise ValueError(f"conf_logits must be [num_cycles, gamma], got shape {tuple(conf_logits.shape)}")
    num_cycles, gamma = conf_logits.shape
    for name, t in (("num_verified", num_verified), ("num_accepted", num_accepted)):
        if t.shape != (num_cycles,):
            raise ValueError(f"{name} must be [num_cycles]={num_cycles}, got shape {tuple(t.shape)}")
        if t.is_floating_point():
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    if num_cycles and (num_verified.min() < 0 or num_verified.max() > gamma):
        raise ValueError(f"num_verified must lie in 0..gamma={gamma}")
    if num_cycles and (num_accepted.min() < 0 or (num_accepted > num_verified).any()):
        raise ValueError("num_accepted must lie in 0..num_verified")


def _bin_sums(
    predicted: Tensor, realised: Tensor, group: Tensor, num_groups: int, num_bins: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Per (group, bin) count, sum of predictions and sum of outcomes, via one bincount each.

    predicted, realised, group: [num_items]; returns three [num_groups, num_bins] float64 tensors.
    """
    bins = torch.clamp(torch.floor(predicted * num_bins).long(), 0, num_bins - 1)  # [num_items]
    flat = group * num_bins + bins
    size = num_groups * num_bins
    counts = torch.bincount(flat, minlength=size).to(torch.float64)
    pred_sums = torch.bincount(flat, weights=predicted, minlength=size)
    real_sums = torch.bincount(flat, weights=realised, minlength=size)
    shape = (num_groups, num_bins)
    return counts.view(shape), pred_sums.view(shape), real_sums.view(shape)


def _as_double(values: Tensor | None) -> Tensor | None:
    return None if values is None else values.double()


@dataclass(frozen=True, eq=False)
class CalibrationReport:
    """Everything a dashboard or the store needs about one calibration, raw counts included.

    Per position j (index j-1): N_j, ECE_j, Brier_j; per (position, bin): count, mean predicted survival,
    mean realised survival (NaN where the bin is empty). Ratios are kept beside their counts so that
    reports over several runs can be pooled by re-weighting rather than averaged blindly.
    """

    num_bins: int
    num_observed: Tensor  # [gamma] long: N_j
    ece_per_position: Tensor  # [gamma] float64, NaN where N_j = 0
    brier_per_position: Tensor  # [gamma] float64, NaN where N_j = 0
    ece: float  # N_j-weighted mean of ece_per_position
    brier: float  # N_j-weighted mean of brier_per_position
    bin_counts: Tensor  # [gamma, num_bins] long
    bin_mean_predicted: Tensor  # [gamma, num_bins] float64, NaN where empty
    bin_mean_realised: Tensor  # [gamma, num_bins] float64, NaN where empty

    @property
    def gamma(self) -> int:
        return int(self.num_observed.numel())

    def reliability_rows(self, include_empty: bool = False) -> list[dict[str, float | int | None]]:
        """One plain dict per (position, bin), ready for a reliability diagram or an INSERT.

        position is 1-indexed as in the paper; bin_lo/bin_hi are the bin's edges; empty bins carry None
        means (not NaN, which most databases and JSON reject) and are skipped unless asked for.
        """
        rows: list[dict[str, float | int | None]] = []
        for j in range(self.gamma):
            for b in range(self.num_bins):
                count = int(self.bin_counts[j, b])
                if count == 0 and not include_empty:
                    continue
                rows.append(
                    {
                        "position": j + 1,
                        "bin": b,
                        "bin_lo": b / self.num_bins,
                        "bin_hi": (b + 1) / self.num_bins,
                        "count": count,
                        "mean_predicted": float(self.bin_mean_predicted[j, b]) if count else None,
                        "mean_realised": float(self.bin_mean_realised[j, b]) if count else None,
                    }
                )
        return rows

    def position_rows(self) -> list[dict[str, float | int | None]]:
        """One plain dict per position (1-indexed) with N_j, ECE_j and Brier_j; None where N_j = 0."""
        rows: list[dict[str, float | int | None]] = []
        for j in range(self.gamma):
            n = int(self.num_observed[j])
            rows.append(
                {
                    "position": j + 1,
                    "num_observed": n,
                    "ece": float(self.ece_per_position[j]) if n else None,
                    "brier": float(self.brier_per_position[j]) if n else None,
                }
            )
        return rows


def expected_calibration_error(
    conf_logits: Tensor,
    num_verified: Tensor,
    num_accepted: Tensor,
    temperatures: Tensor | None = None,
    num_bins: int = DEFAULT_NUM_BINS,
    offsets: Tensor | None = None,
) -> CalibrationReport:
    """ECE, Brier and reliability table of cumulative survival; conventions in the module docstring.

    Pass the STS temperatures (and level offsets, where the fit has them) to get the calibrated report,
    none for the raw one.
    """
    _check_inputs(conf_logits, num_verified, num_accepted)
    gamma = conf_logits.shape[1]
    survival = cumulative_survival(conf_logits.double(), _as_double(temperatures), _as_double(offsets))  # [num_cycles, gamma]
    observed, realised = _observed_and_realised(num_verified, num_accepted, gamma)

    # Flatten observed (cycle, position) pairs; each position is its own group with its own bins.
    cycle_idx, pos_idx = observed.nonzero(as_tuple=True)  # [num_items] each
    predicted = survival[cycle_idx, pos_idx]  # [num_items]
    outcome = realised[cycle_idx, pos_idx].double()  # [num_items]
    counts, pred_sums, real_sums = _bin_sums(predicted, outcome, pos_idx, gamma, num_bins)

    num_observed = observed.sum(dim=0)  # [gamma]
    n = num_observed.double()
    abs_gap = (pred_sums - real_sums).abs().sum(dim=1)  # [gamma]: sum_b n_b * |mean gap_b|
    sq_err = torch.zeros(gamma, dtype=torch.float64).index_add_(0, pos_idx, (predicted - outcome) ** 2)
    total = n.sum()
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    return CalibrationReport(
        num_bins=num_bins,
        num_observed=num_observed,
        ece_per_position=torch.where(n > 0, abs_gap / n.clamp(min=1), nan),
        brier_per_position=torch.where(n > 0, sq_err / n.clamp(min=1), nan),
        ece=float(abs_gap.sum() / total) if total > 0 else float("nan"),
        brier=float(sq_err.sum() / total) if total > 0 else float("nan"),
        bin_counts=counts.long(),
        bin_mean_predicted=torch.where(counts > 0, pred_sums / counts.clamp(min=1), nan),
        bin_mean_realised=torch.where(counts > 0, real_sums / counts.clamp(min=1), nan),
    )


def fit_sts(
    conf_logits: Tensor,
    num_verified: Tensor,
    num_accepted: Tensor,
    grid: Tensor | None = None,
    num_bins: int = DEFAULT_NUM_BINS,
    grid_chunk: int = 64,
) -> Tensor:
    """Sequential temperature scaling: one T_j per position, fitted left to right by grid search.

    Left to right because a_j depends on T_1..T_j: once T_1..T_{j-1} are fixed, the ECE of a_j is a 1-D
    function of T_j, which a grid search minimises exactly (ECE is piecewise and non-smooth, so gradient
    methods would not). Positive T keeps the order of logits within a position and keeps a_j
    non-increasing in j. Ties (e.g. a flat ECE) go to the T closest to 1 in log distance, so a position
    that carries no signal is left alone; positions never observed keep T = 1.

    Returns temperatures [gamma] float64 (CPU) for `cumulative_survival` / `expected_calibration_error`.
    """
    return _fit_sequential(conf_logits, num_verified, num_accepted, grid, num_bins, grid_chunk, match_level=False)[0]


MAX_LEVEL_OFFSET = 8.0  # |b_j| bound of `fit_sts_level`: σ(±8) ≈ 0.9997 / 0.0003, past any useful confidence


def fit_sts_level(
    conf_logits: Tensor,
    num_verified: Tensor,
    num_accepted: Tensor,
    grid: Tensor | None = None,
    num_bins: int = DEFAULT_NUM_BINS,
    grid_chunk: int = 64,
) -> tuple[Tensor, Tensor]:
    """STS with a level offset per position: a_j = a_{j-1} · σ(c_j / T_j + b_j), fitted left to right.

    Why: a temperature sharpens or flattens the confidences about ½, so it lowers those on one side only
    by raising those on the other; it cannot remove a level shift, the miscalibration a draft's
    generalisation gap gives (its confidence head learned the acceptance of its training answers, where the
    draft is better than on new text: every held-out position then promises too much). Here, for each T_j
    of the grid, b_j is the offset that makes the fitted set's mean predicted survival at j equal its
    observed survival rate (Σ a_j = Σ y_j over the observed cycles; bisection, |b_j| ≤ MAX_LEVEL_OFFSET),
    and T_j is the grid's temperature whose matched curve has the least ECE, ties to the T closest to 1 as
    in `fit_sts`. The mean match is one smooth equation per candidate, so the fit adds a parameter without
    adding a second non-smooth search. Order within a position is kept (T_j > 0) and a_j stays non-increasing.

    Returns (temperatures [gamma], offsets [gamma]) float64 (CPU); positions never observed keep (1, 0).
    """
    return _fit_sequential(conf_logits, num_verified, num_accepted, grid, num_bins, grid_chunk, match_level=True)


def _fit_sequential(conf_logits: Tensor, num_verified: Tensor, num_accepted: Tensor, grid: Tensor | None,
                    num_bins: int, grid_chunk: int, *, match_level: bool) -> tuple[Tensor, Tensor]:
    """`fit_sts` (offsets stay 0) and `fit_sts_level` (each candidate T with its matched offset): (T, b) [gamma]."""
    _check_inputs(conf_logits, num_verified, num_accepted)
    grid = default_sts_grid() if grid is None else grid.double().cpu()
    if grid.dim() != 1 or grid.numel() == 0 or (grid <= 0).any():
        raise ValueError("grid must be a non-empty 1-D tensor of positive temperatures")
    # Preference order for ties: closest to 1 first; a stable argmin over this order breaks ties.
    grid = grid[torch.argsort(grid.log().abs(), stable=True)]  # [num_grid]

    logits = conf_logits.detach().double().cpu()  # [num_cycles, gamma]
    num_cycles, gamma = logits.shape
    observed, realised = _observed_and_realised(num_verified.cpu(), num_accepted.cpu(), gamma)
    temperatures = torch.ones(gamma, dtype=torch.float64)
    offsets = torch.zeros(gamma, dtype=torch.float64)
    prefix = torch.ones(num_cycles, dtype=torch.float64)  # [num_cycles]: a_{j-1} with the fitted (T, b)
    for j in range(gamma):
        rows = observed[:, j].nonzero(as_tuple=True)[0]  # [N_j]
        if rows.numel() > 0:
            outcome = realised[rows, j].double()  # [N_j]
            matched = None
            if match_level:
                matched = torch.cat([  # [num_grid]: each temperature's offset
                    _matching_offsets(logits[rows, j][None, :] / grid[start : start + grid_chunk, None], prefix[rows],
                                      float(outcome.sum()))
                    for start in range(0, grid.numel(), grid_chunk)
                ])
            ece = _grid_ece(logits[rows, j], prefix[rows], outcome, grid, num_bins, grid_chunk, offsets=matched)
            # First (closest to 1) within 1e-12 of the minimum, so float noise cannot beat the tie-break.
            best = int((ece <= ece.min() + 1e-12).nonzero()[0])
            temperatures[j] = grid[best]
            if matched is not None:
                offsets[j] = matched[best]
        # Same operations as cumulative_survival, so the report reproduces the fitted ECE bit for bit.
        prefix = prefix * torch.sigmoid(logits[:, j] / temperatures[j] + offsets[j])  # b_j = 0.0 adds nothing
    return temperatures, offsets


def _matching_offsets(scaled: Tensor, prefix: Tensor, target: float, iterations: int = 60) -> Tensor:
    """Per row of `scaled` [G, N], the b with Σ prefix · σ(scaled + b) = target, by bisection on
    [−MAX_LEVEL_OFFSET, MAX_LEVEL_OFFSET] (the sum rises with b; a target outside its range gets the bound)."""
    lo = torch.full((scaled.shape[0],), -MAX_LEVEL_OFFSET, dtype=torch.float64)
    hi = torch.full((scaled.shape[0],), MAX_LEVEL_OFFSET, dtype=torch.float64)
    for _ in range(iterations):  # 16 / 2^60: exact to float64
        mid = (lo + hi) / 2
        above = (prefix[None, :] * torch.sigmoid(scaled + mid[:, None])).sum(dim=1) > target
        hi = torch.where(above, mid, hi)
        lo = torch.where(above, lo, mid)
    return (lo + hi) / 2


def _grid_ece(
    logits: Tensor, prefix: Tensor, outcome: Tensor, grid: Tensor, num_bins: int, grid_chunk: int,
    offsets: Tensor | None = None,
) -> Tensor:
    """ECE of prefix * sigmoid(logits / T + b) for every T in grid (b: its entry of `offsets`, else 0); chunked
    to bound memory.

    logits, prefix, outcome: [N]; grid, offsets: [num_grid]; returns [num_grid] float64.
    """
    n = logits.numel()
    out = torch.empty(grid.numel(), dtype=torch.float64)
    for start in range(0, grid.numel(), grid_chunk):
        temps = grid[start : start + grid_chunk]  # [G]
        num_g = temps.numel()
        scaled = logits[None, :] / temps[:, None]  # [G, N]
        if offsets is not None:
            scaled = scaled + offsets[start : start + num_g, None]
        predicted = prefix[None, :] * torch.sigmoid(scaled)  # [G, N]
        group = torch.arange(num_g).repeat_interleave(n)  # [G * N]
        _, pred_sums, real_sums = _bin_sums(
            predicted.reshape(-1), outcome.repeat(num_g), group, num_g, num_bins
        )
        out[start : start + num_g] = (pred_sums - real_sums).abs().sum(dim=1) / n
    return out


class OnlineCalibrator:
    """STS kept up to date from the acceptances observed while serving.

    Holds the most recent `window` cycles in a ring buffer (old traffic stops counting, so the fit follows
    drift in the prompt mix) and refits STS from scratch on that buffer: first as soon as it holds
    `min_cycles`, then every `refit_every` observed cycles. The refit is the offline `fit_sts` on the
    buffer in arrival order, so it is deterministic and equal to an offline fit of the same cycles.
    Until the first fit the temperatures are 1 (raw confidences), never a fit on too little data.
    """

    def __init__(
        self,
        gamma: int,
        window: int = 4096,
        refit_every: int = 256,
        min_cycles: int = 512,
        grid: Tensor | None = None,
        num_bins: int = DEFAULT_NUM_BINS,
    ) -> None:
        if gamma < 1 or window < 1 or refit_every < 1 or not 1 <= min_cycles <= window:
            raise ValueError("need gamma, window, refit_every >= 1 and 1 <= min_cycles <= window")
        self.gamma = gamma
        self.window = window
        self.refit_every = refit_every
        self.min_cycles = min_cycles
        self.num_bins = num_bins
        self._grid = default_sts_grid() if grid is None else grid.double().cpu()
        self._conf_logits = torch.zeros(window, gamma, dtype=torch.float64)  # ring buffer
        self._num_verified = torch.zeros(window, dtype=torch.long)
        self._num_accepted = torch.zeros(window, dtype=torch.long)
        self._next = 0  # ring write position
        self.num_buffered = 0
        self.num_seen = 0  # cycles ever observed
        self.num_fits = 0
        self._seen_at_last_fit = 0
        self._temperatures = torch.ones(gamma, dtype=torch.float64)

    @property
    def temperatures(self) -> Tensor:
        """Current T [gamma] float64; a copy, so callers cannot edit the calibrator's state."""
        return self._temperatures.clone()

    def observe(self, conf_logits: Tensor, num_verified: Tensor, num_accepted: Tensor) -> bool:
        """Add finished cycles (same convention as the module docstring); returns True if it refitted."""
        _check_inputs(conf_logits, num_verified, num_accepted)
        if conf_logits.shape[1] != self.gamma:
            raise ValueError(f"expected gamma={self.gamma}, got {conf_logits.shape[1]}")
        num_new = conf_logits.shape[0]
        keep = min(num_new, self.window)  # a batch larger than the window only keeps its tail
        slots = (self._next + torch.arange(keep)) % self.window  # [keep]
        self._conf_logits[slots] = conf_logits[num_new - keep :].detach().double().cpu()
        self._num_verified[slots] = num_verified[num_new - keep :].cpu().long()
        self._num_accepted[slots] = num_accepted[num_new - keep :].cpu().long()
        self._next = (self._next + keep) % self.window
        self.num_buffered = min(self.num_buffered + keep, self.window)
        self.num_seen += num_new

        due = self.num_fits == 0 or self.num_seen - self._seen_at_last_fit >= self.refit_every
        if self.num_buffered < self.min_cycles or not due:
            return False
        self.refit()
        return True

    def refit(self) -> None:
        """Fit STS on the buffer now, oldest cycle first."""
        order = (self._next - self.num_buffered + torch.arange(self.num_buffered)) % self.window
        self._temperatures = fit_sts(
            self._conf_logits[order],
            self._num_verified[order],
            self._num_accepted[order],
            grid=self._grid,
            num_bins=self.num_bins,
        )
        self.num_fits += 1
        self._seen_at_last_fit = self.num_seen

    def calibrate(self, conf_logits: Tensor) -> Tensor:
        """Calibrated logits c / T ([..., gamma], input dtype and device): feed them to the scheduler."""
        temps = self._temperatures.to(device=conf_logits.device, dtype=conf_logits.dtype)
        return conf_logits / temps
