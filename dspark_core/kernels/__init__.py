"""Triton kernels for DSpark's hot paths, and the dispatch that picks them or their torch twins.

| dispatch                      | kernel module          | torch twin (the spec)                                 |
|-------------------------------|------------------------|-------------------------------------------------------|
| `draft_block`                 | `markov_draft.py`      | `DSparkModel.sample_block` (drafters/dspark.py)       |
| `rejection_sample`            | `rejection.py`         | `verification.rejection_sample`                       |
| `varlen_attention`            | `attention.py`         | `attention_ref.varlen_attention_torch`                |
| `schedule_prefix`             | `prefix_scheduler.py`  | `scheduler.schedule_prefix`                           |
| `schedule_prefix_from_logits` | `prefix_scheduler.py`  | `scheduler._Calibrated.survival` + `schedule_prefix`  |

Wired: `DSparkDrafter.propose` calls `draft_block`, `verification.verify` calls `rejection_sample`,
`PrefixScheduler.__call__` calls `schedule_prefix`, and `TargetModel.__init__` calls `use_varlen_attention`,
which switches the Hugging Face model to "dspark_varlen" attention where the Triton path runs (elsewhere
the model keeps its attention; on the CPU, `dspark_core.sdpa_gqa`).

This package is the only place that imports `triton`, and only lazily, inside a dispatch that chose
the Triton path: `import dspark_core` works without triton installed.

Which path runs is `DSPARK_KERNELS` (read at every call, so a test can switch it):
- `auto` (default): Triton for CUDA tensors when triton is importable, the twin otherwise;
- `triton`: Triton always — on CUDA, or on CPU tensors under the interpreter (`TRITON_INTERPRET=1`, read
  when the kernel modules are first imported, i.e. at the first Triton dispatch); anything else raises
  rather than silently running the twin;
- `torch`: the twin always.
A dispatch also runs the twin where its kernel does not cover the case (say, an RNN head).

Every dispatch is free of host syncs on the Triton path (no `.item()`, no data-dependent shapes; the
SPS table's dense device copy is built once, at its first use), so an engine can enqueue draft →
schedule → verify without waiting on the device.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from dspark_core.drafters.dspark import DSparkModel
    from dspark_core.sps import SPSTable
    from dspark_core.verification import VerifyOutput

MODES = ("auto", "triton", "torch")


def kernel_mode() -> str:
    mode = os.environ.get("DSPARK_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"DSPARK_KERNELS={mode!r}; valid: {', '.join(MODES)}")
    return mode


@lru_cache(maxsize=None)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton kernels run in the CPU interpreter (numpy) rather than compiled."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(device: torch.device | str) -> bool:
    """Whether a dispatch on tensors of `device` runs its Triton kernel (see the module docstring)."""
    mode = kernel_mode()
    if mode == "torch":
        return False
    on_cuda = torch.device(device).type == "cuda"
    if mode == "auto":
        return on_cuda and triton_available()
    if not triton_available():
        raise RuntimeError("DSPARK_KERNELS=triton but triton is not installed (pip install 'dspark-harness[kernels]')")
    if not (on_cuda or interpreting()):
        raise RuntimeError(
            f"DSPARK_KERNELS=triton on {torch.device(device).type} tensors needs TRITON_INTERPRET=1 "
            "(set before the first Triton dispatch imports the kernels)"
        )
    return True


# --------------------------------------------------------------------------- 1. Markov-head draft sampling


def draft_block(
    model: "DSparkModel", h: Tensor, anchor_ids: Tensor, temperatures: Tensor, uniforms: Tensor
) -> tuple[Tensor, Tensor, Tensor | None]:
    """DSpark's sequential head over a drafted block: h [R, n, hidden] (final-normed backbone output),
    anchor_ids [R], temperatures [R], uniforms [R, n] → token ids [R, n] long, draft probs [R, n, vocab]
    fp32, confidence logits [R, n] fp32 (None without a confidence head).

    Triton (`markov_draft.markov_draft`) for the Markov head and for no head (DFlash); the twin
    `model.sample_block` for gated/RNN heads and off CUDA.
    """
    from dspark_core.drafters.heads import MarkovHead

    head = model.markov_head
    if h.shape[0] == 0 or h.shape[1] == 0 or not (head is None or type(head) is MarkovHead) or not use_triton(h.device):
        return model.sample_block(h, anchor_ids, temperatures, uniforms)
    from dspark_core.kernels.markov_draft import markov_draft

    conf = model.confidence_head
    return markov_draft(
        model.lm_head(h), h, anchor_ids, temperatures, uniforms,
        w1=head.markov_w1.weight if head is not None else None,
        w2=head.markov_w2.weight if head is not None else None,
        conf_weight=conf.proj.weight if conf is not None else None,
        conf_bias=conf.proj.bias if conf is not None else None,
    )


# --------------------------------------------------------------------------- 2. rejection sampling


def rejection_sample(
    target_logits: Tensor,  # [total_drafts + R, vocab]
    draft_token_ids: Tensor,  # [total_drafts] long
    cu_num_drafts: Tensor,  # [R + 1] long
    draft_probs: Tensor | None,  # [total_drafts, vocab] fp32, or None (one-hot drafts)
    temperatures: Tensor,  # [R]
    accept_uniforms: Tensor,  # [total_drafts]
    sample_uniforms: Tensor,  # [R]
    *,
    all_greedy: bool = False,
) -> "VerifyOutput":
    """`verification.rejection_sample`, same arguments and result. `all_greedy=True` (the caller knows every
    temperature is below GREEDY_TEMPERATURE) takes the argmax-only kernel, or its twin
    `verification.rejection_sample_greedy`; the general paths are exact for greedy rows too."""
    from dspark_core import verification

    if not use_triton(target_logits.device):
        if all_greedy:
            return verification.rejection_sample_greedy(target_logits, draft_token_ids, cu_num_drafts)
        return verification.rejection_sample(
            target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures, accept_uniforms, sample_uniforms
        )
    from dspark_core.kernels.rejection import rejection_greedy_sample_triton, rejection_sample_triton

    if all_greedy:
        num_accepted, next_ids = rejection_greedy_sample_triton(target_logits, draft_token_ids, cu_num_drafts)
    else:
        num_accepted, next_ids = rejection_sample_triton(
            target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures,
            accept_uniforms, sample_uniforms, residual_eps=verification.RESIDUAL_EPS,
        )
    return verification.VerifyOutput(num_accepted=num_accepted, next_token_ids=next_ids)


# --------------------------------------------------------------------------- 3. variable-length attention


def varlen_attention(
    q: Tensor,  # [total_q, num_heads, head_dim]
    k_cache: Tensor,  # [num_slots, kv_heads, capacity, head_dim] (one layer of KVSlots)
    v_cache: Tensor,  # [num_slots, kv_heads, capacity, head_dim]
    cu_seqlens_q: Tensor,  # [R + 1] cumulative query counts
    past_lens: Tensor,  # [R] keys a request attends before its own new ones
    sm_scale: float,
    new_starts: Tensor | None = None,  # [R] slot position of its first new key (None: = past_lens)
    slot_ids: Tensor | None = None,  # [R] cache slot of each request (None: request r uses slot r)
    max_seqlen_q: int | None = None,  # longest segment, if the caller knows it (sizes the grid; else total_q)
) -> Tensor:
    """Verification attention over flattened variable-length queries (see `attention_ref`): [total_q, H, D]."""
    if q.shape[0] == 0 or not use_triton(q.device):
        from dspark_core.kernels.attention_ref import varlen_attention_torch

        return varlen_attention_torch(q, k_cache, v_cache, cu_seqlens_q, past_lens, sm_scale, new_starts, slot_ids)
    from dspark_core.kernels.attention import varlen_attention_triton

    return varlen_attention_triton(
        q, k_cache, v_cache, cu_seqlens_q, past_lens, sm_scale, new_starts, slot_ids, max_seqlen_q
    )


def use_varlen_attention(model: torch.nn.Module) -> bool:
    """Switch a Hugging Face model to "dspark_varlen" attention (`attention_ref.hf_varlen_attention`, which runs
    `varlen_attention`) when its parameters sit where the Triton path runs; True if switched. The one line
    `TargetModel.__init__` needs."""
    if not use_triton(next(model.parameters()).device):
        return False
    from dspark_core.kernels.attention_ref import install_varlen_attention

    install_varlen_attention(model)
    return True


# --------------------------------------------------------------------------- 4. prefix scheduler


def schedule_prefix(survival: Tensor, sps: "SPSTable") -> Tensor:
    """`scheduler.schedule_prefix`: survival [R, γ] (non-increasing in j) → [R] long verify lengths."""
    num_rows, gamma = survival.shape
    if num_rows == 0 or gamma == 0 or not use_triton(survival.device):
        from dspark_core.scheduler import schedule_prefix as twin

        return twin(survival, sps)
    from dspark_core.kernels.prefix_scheduler import schedule_prefix_triton

    sps_range = sps.lookup_range(num_rows, num_rows * (gamma + 1) + 1, survival.device)  # SPS(R … R + R·γ)
    return schedule_prefix_triton(survival, None, None, sps_range)


def schedule_prefix_from_logits(calibrated_logits: Tensor, sps: "SPSTable", num_valid: Tensor | None = None) -> Tensor:
    """Survival a_{r,j} = running-min of Π_{i≤j} σ(c_i/T_i) (0 past `num_valid`), then Algorithm 1, in one
    go: calibrated_logits [R, γ] (c/T) → [R] long. Twin: `_Calibrated.survival` then `schedule_prefix`."""
    num_rows, gamma = calibrated_logits.shape
    if num_rows == 0 or gamma == 0 or not use_triton(calibrated_logits.device):
        from dspark_core.scheduler import schedule_prefix as twin

        return twin(survival_torch(calibrated_logits, num_valid), sps)
    from dspark_core.kernels.prefix_scheduler import schedule_prefix_triton

    sps_range = sps.lookup_range(num_rows, num_rows * (gamma + 1) + 1, calibrated_logits.device)
    return schedule_prefix_triton(None, calibrated_logits, num_valid, sps_range)


def survival_torch(calibrated_logits: Tensor, num_valid: Tensor | None = None) -> Tensor:
    """`scheduler._Calibrated.survival` on calibrated logits rather than on a proposal: [R, γ] float64."""
    from dspark_core.drafters.base import DraftProposal
    from dspark_core.scheduler import _Calibrated

    empty = torch.empty(calibrated_logits.shape, dtype=torch.long, device=calibrated_logits.device)
    return _Calibrated().survival(DraftProposal(empty, None, calibrated_logits, num_valid))


__all__ = [
    "MODES", "draft_block", "interpreting", "kernel_mode", "rejection_sample", "schedule_prefix",
    "schedule_prefix_from_logits", "survival_torch", "triton_available", "use_triton", "use_varlen_attention",
    "varlen_attention",
]
