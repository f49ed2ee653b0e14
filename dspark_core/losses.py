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
- A draft with a reduced vocabulary (`DraftConfig.draft_vocab_size`) has logits over its own tokens only and
  proposes nothing else: p_d is 0 outside them. The caller then passes the target's log-probabilities at the
  draft's tokens (`target_log_probs`, normalised over the whole target vocabulary), so ‖p_d − p_t‖₁ gains the
  target mass outside the draft vocabulary and α stays Σ min(p_d, p_t) over the whole vocabulary; labels
  outside the draft vocabulary (−1) leave the CE term, which has nothing to push there, but not L1 or BCE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dspark_core.kernels import distill_loss_cpu as distill


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
    # weighted-mean σ(c_k) with α's weights (nan without confidences): the head's promise beside `acceptance`,
    # so on held-out sequences confidence − acceptance is the level shift a temperature per position barely moves
    confidence: float = float("nan")


def position_weights(num_positions: int, decay: float, device: torch.device | str = "cpu") -> Tensor:
    """w_k = exp(−k/decay), k = 0 … num_positions−1  # [num_positions] fp32"""
    return torch.exp(-torch.arange(num_positions, device=device, dtype=torch.float32) / float(decay))


def acceptance_probability(draft_probs: Tensor, target_probs: Tensor, *, partial: bool = False) -> tuple[Tensor, Tensor]:
    """→ (‖p_d − p_t‖₁ [...], α = clamp(1 − ½‖·‖₁, 0, 1) [...]) over the last (vocab) axis. `partial`: the
    vocabulary axis is the draft's reduced one (p_d is 0 elsewhere), so the target's mass outside it, 1 − Σ p_t,
    is part of the distance."""
    l1 = (draft_probs - target_probs).abs().sum(-1)
    if partial:
        l1 = l1 + (1.0 - target_probs.sum(-1)).clamp(min=0.0)
    return l1, (1.0 - 0.5 * l1).clamp(0.0, 1.0)


def draft_loss(
    logits: Tensor,  # [N, K, V] draft logits (head-corrected), V the draft vocabulary
    labels: Tensor,  # [N, K] long: true next token of each position as a draft index (any value where invalid; −1: outside the draft vocabulary)
    valid: Tensor,  # [N, K] bool
    target_logits: Tensor | None = None,  # [N, K, V] the target's logits at the same positions (or log-probs: below)
    confidence_logits: Tensor | None = None,  # [N, K] c_k before the sigmoid
    *,
    weights: LossWeights = DSPARK_WEIGHTS,
    decay: float = 4.0,
    target_log_probs: bool = False,  # target_logits are log p_t at a reduced draft vocabulary's tokens
) -> DraftLoss:
    num_blocks, num_pos, vocab = logits.shape
    w = position_weights(num_pos, decay, logits.device)[None, :] * valid.float()  # [N, K]
    w_sum = w.sum().clamp(min=1e-12)

    def wmean(x: Tensor) -> Tensor:
        return (x * w).sum() / w_sum

    logits = logits.float()
    in_vocab = labels >= 0
    l1 = alpha = None
    if target_logits is not None and target_log_probs and distill.ready(logits, target_logits):
        # One C++ pass per row for both terms and their gradient (kernels/distill_loss_cpu.py); the torch ops below
        # are its twin.
        ce, l1 = distill.distill_terms(logits.reshape(-1, vocab), target_logits.reshape(-1, vocab),
                                       torch.where(valid & in_vocab, labels, -1).reshape(-1))
        ce, l1 = ce.view(num_blocks, num_pos), l1.view(num_blocks, num_pos)
        alpha = (1.0 - 0.5 * l1).clamp(0.0, 1.0)
    else:
        safe_labels = torch.where(valid & in_vocab, labels, torch.zeros_like(labels))
        ce = F.cross_entropy(logits.reshape(-1, vocab), safe_labels.reshape(-1), reduction="none").view(num_blocks, num_pos)
        if target_logits is not None:
            target_probs = target_logits.float().exp() if target_log_probs else torch.softmax(target_logits.float(), -1)
            l1, alpha = acceptance_probability(torch.softmax(logits, -1), target_probs, partial=target_log_probs)
    w_ce = w * in_vocab.float()
    ce_mean = (ce * w_ce).sum() / w_ce.sum().clamp(min=1e-12)
    total = weights.ce * ce_mean
    nan = float("nan")
    l1_mean = bce_mean = acc_mean = conf_mean = None
    if l1 is not None and alpha is not None:
        l1_mean, acc_mean = wmean(l1), wmean(alpha.detach())
        if weights.l1:
            total = total + weights.l1 * l1_mean
        if confidence_logits is not None:
            bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), alpha.detach(), reduction="none")
            bce_mean = wmean(bce)
            conf_mean = wmean(torch.sigmoid(confidence_logits.detach().float()))
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
        confidence=float(conf_mean) if conf_mean is not None else nan,
    )
