"""Triton: the hardware-aware prefix scheduler (paper Algorithm 1) on device, with no host sync.

Torch twin: `scheduler.schedule_prefix` (and, for `schedule_prefix_from_logits`, `_Calibrated.survival`
before it). Candidates (r, j) are numbered position-major (flat index j·R + r, as `rank_candidates`),
ordered by survival descending with ties to the lower flat index (the twin's stable sort); then
Θ_k = (R + Σ_{i≤k} a_(i)) · SPS(R + k), and the number admitted K is the first k whose candidate lowers Θ
or has zero survival; request r verifies the leading run of its positions ranked below K.

Launches (all sizes come from tensor shapes, never from tensor values):
  1. `survival_kernel` (from logits only), grid (row blocks): σ, running product and running minimum
     along j in float64 — the twin's sigmoid / cumprod / cummin — zero past `num_valid`;
  2. `candidate_rank_kernel`, grid (candidate blocks): each candidate's place in the order by counting
     the candidates ahead of it (O(N²) comparisons, N = R·γ, spread over the grid; exact and stable
     without a sort), and the survival scattered into that place;
  3. `prefix_scan_kernel`, grid (1): the float64 prefix sum and Θ curve (SPS looked up from a table on
     device), the early stop, and the verify lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dspark_core.kernels import interpreting


@triton.jit
def survival_kernel(
    logits_ptr,  # [R, γ] calibrated confidence logits c / T
    num_valid_ptr,  # [R] long (unused without HAS_NUM_VALID)
    survival_ptr,  # [γ·R] fp64 out, position-major (index j·R + r)
    num_rows,
    gamma,
    stride_r,
    HAS_NUM_VALID: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < num_rows
    if HAS_NUM_VALID:
        num_valid = tl.load(num_valid_ptr + rows, mask=row_mask, other=0)
    else:
        num_valid = tl.full([BLOCK_R], gamma, tl.int64)
    prod = tl.full([BLOCK_R], 1.0, tl.float64)
    run_min = tl.full([BLOCK_R], 1.0, tl.float64)
    for j in range(0, gamma):
        x = tl.load(logits_ptr + rows * stride_r + j, mask=row_mask, other=0.0).to(tl.float64)
        prod = prod * (1.0 / (1.0 + tl.exp(-x)))
        run_min = tl.where(j == 0, prod, tl.minimum(run_min, prod))
        tl.store(survival_ptr + j * num_rows + rows, tl.where(j < num_valid, run_min, 0.0), mask=row_mask)


@triton.jit
def candidate_rank_kernel(
    survival_ptr,  # [N] fp64, position-major
    rank_ptr,  # [N] int32 out: place of each candidate in admission order
    sorted_ptr,  # [N] fp64 out: survival in admission order
    num_candidates,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = i < num_candidates
    a_i = tl.load(survival_ptr + i, mask=i_mask, other=0.0)
    rank = tl.zeros([BLOCK_I], tl.int32)
    for j0 in range(0, num_candidates, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_mask = j < num_candidates
        a_j = tl.load(survival_ptr + j, mask=j_mask, other=0.0)
        ahead = (a_j[None, :] > a_i[:, None]) | ((a_j[None, :] == a_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & j_mask[None, :]).to(tl.int32), axis=1)
    tl.store(rank_ptr + i, rank, mask=i_mask)
    tl.store(sorted_ptr + rank, a_i, mask=i_mask)


@triton.jit
def prefix_scan_kernel(
    sorted_ptr,  # [N] fp64 survival in admission order
    sps_ptr,  # [N + 1] fp64: SPS(R + k), k = 0 … N
    theta_ptr,  # [N + 1] fp64 scratch: Θ_k
    survival_ptr,  # [N] fp64, position-major
    rank_ptr,  # [N] int32
    lengths_ptr,  # [R] long out: verify lengths
    num_rows,
    gamma,
    num_candidates,
    BLOCK: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    base = num_rows + tl.zeros([], tl.float64)  # not num_rows.to(): an argument equal to 1 arrives as a constexpr
    tl.store(theta_ptr, base * tl.load(sps_ptr))
    carry = tl.full([], 0.0, tl.float64)
    for k0 in range(0, num_candidates, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        mask = k < num_candidates
        a = tl.load(sorted_ptr + k, mask=mask, other=0.0)
        cum = tl.cumsum(a, axis=0) + carry
        carry = tl.max(tl.where(mask, cum, carry), axis=0)  # a >= 0: the last entry
        theta = (base + cum) * tl.load(sps_ptr + k + 1, mask=mask, other=0.0)
        tl.store(theta_ptr + k + 1, theta, mask=mask)
    tl.debug_barrier()  # the stop reads Θ written by other threads
    num_admitted = num_candidates
    for k0 in range(0, num_candidates, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        mask = k < num_candidates
        before = tl.load(theta_ptr + k, mask=mask, other=0.0)
        after = tl.load(theta_ptr + k + 1, mask=mask, other=0.0)
        a = tl.load(sorted_ptr + k, mask=mask, other=0.0)
        stop = mask & ~((after >= before) & (a > 0.0))  # the twin's `keeps`, negated (NaN stops too)
        num_admitted = tl.minimum(num_admitted, tl.min(tl.where(stop, k, num_candidates), axis=0))
    for r0 in range(0, num_rows, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        row_mask = rows < num_rows
        run = row_mask
        length = tl.zeros([BLOCK_R], tl.int64)
        for j in range(0, gamma):
            f = j * num_rows + rows
            admitted = (tl.load(rank_ptr + f, mask=row_mask, other=num_candidates) < num_admitted) & (
                tl.load(survival_ptr + f, mask=row_mask, other=0.0) > 0.0
            )
            run = run & admitted
            length += run.to(tl.int64)
        tl.store(lengths_ptr + rows, length, mask=row_mask)


def schedule_prefix_triton(
    survival: Tensor | None,  # [R, γ] (non-increasing in j), or None: computed from `calibrated_logits`
    calibrated_logits: Tensor | None,  # [R, γ] c / T (used when survival is None)
    num_valid: Tensor | None,  # [R] drafts proposed (with calibrated_logits; None: all γ)
    sps_range: Tensor,  # [R·γ + 1] fp64: SPS(B) for B = R … R + R·γ, on the device
) -> Tensor:
    """→ [R] long verify lengths, as `scheduler.schedule_prefix`."""
    source = survival if survival is not None else calibrated_logits
    if source is None:
        raise ValueError("schedule_prefix_triton needs survival or calibrated_logits")
    num_rows, gamma = source.shape
    n = num_rows * gamma
    device = source.device
    interp = interpreting()
    if survival is not None:
        flat = survival.t().reshape(-1).to(torch.float64)  # [γ·R], index j·R + r
    else:
        flat = torch.empty(n, dtype=torch.float64, device=device)
        logits = source if source.stride(-1) == 1 else source.contiguous()  # source is calibrated_logits here
        block_r = min(128, triton.next_power_of_2(num_rows))
        survival_kernel[(triton.cdiv(num_rows, block_r),)](
            logits, num_valid if num_valid is not None else logits, flat, num_rows, gamma, logits.stride(0),
            HAS_NUM_VALID=num_valid is not None, BLOCK_R=block_r, enable_fp_fusion=False,
        )
    rank = torch.empty(n, dtype=torch.int32, device=device)
    sorted_a = torch.empty(n, dtype=torch.float64, device=device)
    block = min(32 if interp else 128, triton.next_power_of_2(n))
    candidate_rank_kernel[(triton.cdiv(n, block),)](flat, rank, sorted_a, n, BLOCK_I=block, BLOCK_J=block)
    theta = torch.empty(n + 1, dtype=torch.float64, device=device)
    lengths = torch.empty(num_rows, dtype=torch.long, device=device)
    prefix_scan_kernel[(1,)](
        sorted_a, sps_range.to(device=device, dtype=torch.float64), theta, flat, rank, lengths, num_rows, gamma, n,
        BLOCK=min(32 if interp else 1024, triton.next_power_of_2(n)),
        BLOCK_R=min(1024, triton.next_power_of_2(num_rows)),
        enable_fp_fusion=False, num_warps=4,
    )
    return lengths
