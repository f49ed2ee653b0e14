"""The draft training loss (DeepSpec recipe, spec §3), per block position k (0-indexed):

    0.1·CE(p_d, x_true) + 0.9·‖p_d − p_t‖₁ + 1.0·BCE(σ(c_k), α_k),   α_k = clamp(1 − ½‖p_d − p_t‖₁, 0, 1)

- p_d = softmax(draft logits) and p_t = softmax(target logits), both at temperature 1, in fp32. The
  draft logits are the head-corrected ones (U_k + B_k(x_{k−1}), teacher-forced), so CE trains the
  same distribution that inference samples from.
- α_k is the analytic acceptance probability of position k at temperature 1 (Σ min(p_d, p_t)),
  a soft label for the confidence head; it is detached: the BCE term trains the confidence head
  only, never pushes p_d.
- Each term is a weighted mean over (block, position) with weights w_k = exp(−k/decay) times the
  validity mask (label inside the sequence, block not padding), normalised by Σw.
- DFlash and the Eagle3-style baseline train with CE only (`CE_ONLY`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class LossWeights:
    ce: float = 0.1
    l1: float = 0.9
    bce: float = 1.0  # only where the draft has a confidence head


DSPARK_WEIGHTS = LossWeights()
CE_ONLY = LossWeights(ce=1.0, l1=0.0, bce=0.0)


@dataclass
class DraftLoss:
    total: Tensor  # scalar with grad: Σ weight·term over the terms with a nonzero weight
    ce: float  # weighted-mean cross-entropy against the true next token
    l1: float  # weighted-mean ‖p_d − p_t‖₁ (nan without target logits)
    bce: float  # weighted-mean BCE of the confidence head against α (nan without confidences)
    acceptance: float  # weighted-mean α: expected T=1 acceptance of a position whose prefix was accepted
    num_positions: int  # valid (block, position) pairs


def position_weights(num_positions: int, decay: float, device: torch.device | str = "cpu") -> Tensor:
    """w_k = exp(−k/decay), k = 0 … num_positions−1  # [num_positions] fp32"""
    return torch.exp(-torch.arange(num_positions, device=device, dtype=torch.float32) / float(decay))


def acceptance_probability(draft_probs: Tensor, target_probs: Tensor) -> tuple[Tensor, Tensor]:
    """→ (‖p_d − p_t‖₁ [...], α = clamp(1 − ½‖·‖₁, 0, 1) [...]) over the last (vocab) axis."""
    l1 = (draft_probs - target_probs).abs().sum(-1)
    return l1, (1.0 - 0.5 * l1).clamp(0.0, 1.0)


def draft_loss(
    logits: Tensor,  # [N, K, V] draft logits (head-corrected)
    labels: Tensor,  # [N, K] long: true next token of each position (any value where invalid)
    valid: Tensor,  # [N, K] bool
    target_logits: Tensor | None = None,  # [N, K, V] the target's logits at the same positions
    confidence_logits: Tensor | None = None,  # [N, K] c_k before the sigmoid
    *,
    weights: LossWeights = DSPARK_WEIGHTS,
    decay: float = 4.0,
) -> DraftLoss:
    num_blocks, num_pos, vocab = logits.shape
    w = position_weights(num_pos, decay, logits.device)[None, :] * valid.float()  # [N, K]
    w_sum = w.sum().clamp(min=1e-12)

    def wmean(x: Tensor) -> Tensor:
        return (x * w).sum() / w_sum

    logits = logits.float()
    safe_labels = torch.where(valid, labels, torch.zeros_like(labels))
    ce = F.cross_entropy(logits.reshape(-1, vocab), safe_labels.reshape(-1), reduction="none").view(num_blocks, num_pos)
    ce_mean = wmean(ce)
    total = weights.ce * ce_mean
    nan = float("nan")
    l1_mean = bce_mean = acc_mean = None
    if target_logits is not None:
        l1, alpha = acceptance_probability(torch.softmax(logits, -1), torch.softmax(target_logits.float(), -1))
        l1_mean, acc_mean = wmean(l1), wmean(alpha.detach())
        if weights.l1:
            total = total + weights.l1 * l1_mean
        if confidence_logits is not None:
            bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), alpha.detach(), reduction="none")
            bce_mean = wmean(bce)
            if weights.bce:
                total = total + weights.bce * bce_mean
    elif weights.l1 or (weights.bce and confidence_logits is not None):
        raise ValueError("the L1 and BCE terms need the target's logits")
    return DraftLoss(
        total=total,
        ce=float(ce_mean.detach()),
        l1=float(l1_mean.detach()) if l1_mean is not None else nan,
        bce=float(bce_mean.detach()) if bce_mean is not None else nan,
        acceptance=float(acc_mean) if acc_mean is not None else nan,
        num_positions=int(valid.sum()),
    )
