"""The C++ distillation terms of a draft's loss on the CPU (`distill_loss.cpp`): per position, the cross-entropy
against the true next token and ‖p_d − p_t‖₁, forward and gradient, over a reduced draft vocabulary.

Their twin is `dspark_core.losses.draft_loss`'s torch path with `target_log_probs` (F.cross_entropy, softmax, the
L1 sum, and autograd through them); `draft_loss` calls these where `ready()` says so (fp32 logits on the CPU, the
library built, `DSPARK_KERNELS` not `torch`). On a DSpark training step of SmolLM2-135M's draft (896 positions ×
8,192 tokens) the twin's dozen passes over a 29 MB tensor, forward and backward, are most of the loss's cost:
with the kernel a step took 283 and 288 ms against the twin's 314 and 297 (Zen 4, 2 threads, 40 steps a process,
alternated twice).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from dspark_core.kernels import cpu_build, kernel_mode

NAME = "distill_loss"
_DECLARED: list[ctypes.CDLL] = []  # libraries whose signatures are declared


def library(variant: str = "native") -> ctypes.CDLL | None:
    lib = cpu_build.load(NAME, variant)
    if lib is not None and not any(lib is seen for seen in _DECLARED):
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
        lib.dspark_distill_forward.argtypes = [p, p, i32, p, i64, i64, p, p, p, p]
        lib.dspark_distill_backward.argtypes = [p, p, i32, p, i64, i64, p, p, p, p, p]
        for fn in (lib.dspark_distill_forward, lib.dspark_distill_backward):
            fn.restype = None
        _DECLARED.append(lib)  # held, so no later library can take its place unseen
    return lib


def ready(logits: Tensor, target_log_probs: Tensor) -> bool:
    """Whether these logits and target log-probabilities may take the kernel."""
    return (logits.device.type == "cpu" and logits.dtype == torch.float32 and target_log_probs.device.type == "cpu"
            and target_log_probs.dtype in (torch.float32, torch.bfloat16) and kernel_mode() != "torch"
            and library() is not None)


class _DistillTerms(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, labels: Tensor, variant: str) -> tuple[Tensor, Tensor]:
        lib = library(variant)
        assert lib is not None
        rows, vocab = logits.shape
        lse, ce, l1, dot = (torch.empty(rows, dtype=torch.float32) for _ in range(4))
        lib.dspark_distill_forward(logits.data_ptr(), target.data_ptr(), int(target.dtype == torch.bfloat16),
                                   labels.data_ptr(), rows, vocab, lse.data_ptr(), ce.data_ptr(), l1.data_ptr(),
                                   dot.data_ptr())
        ctx.save_for_backward(logits, target, labels, lse, dot)
        ctx.variant = variant
        ctx.mark_non_differentiable(lse)
        return ce, l1

    @staticmethod
    def backward(ctx, grad_ce: Tensor | None, grad_l1: Tensor | None):
        logits, target, labels, lse, dot = ctx.saved_tensors
        rows, vocab = logits.shape
        zeros = torch.zeros(rows, dtype=torch.float32)
        g_ce = zeros if grad_ce is None else grad_ce.float().contiguous()
        g_l1 = zeros if grad_l1 is None else grad_l1.float().contiguous()
        grad = torch.empty_like(logits)
        lib = library(ctx.variant)
        assert lib is not None
        lib.dspark_distill_backward(logits.data_ptr(), target.data_ptr(), int(target.dtype == torch.bfloat16),
                                    labels.data_ptr(), rows, vocab, lse.data_ptr(), dot.data_ptr(), g_ce.data_ptr(),
                                    g_l1.data_ptr(), grad.data_ptr())
        return grad, None, None, None


def distill_terms(logits: Tensor, target_log_probs: Tensor, labels: Tensor,
                  variant: str = "native") -> tuple[Tensor, Tensor]:
    """logits [N, V] fp32 (the draft's, over its vocabulary), target_log_probs [N, V] fp32 or bf16 (log p_t at the
    same tokens, normalised over the target's whole vocabulary), labels [N] long (a draft index, or −1: no
    cross-entropy) → (ce [N], l1 [N]): CE(softmax(logits), label) (0 where the label is −1) and
    ‖softmax(logits) − p_t‖₁ + max(0, 1 − Σ p_t), both differentiable in `logits`."""
    return _DistillTerms.apply(logits.contiguous(), target_log_probs.contiguous(), labels.to(torch.int64).contiguous(),
                               variant)
