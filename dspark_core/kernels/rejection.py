"""Triton: lossless rejection sampling over a flattened variable-length batch.

Torch twin: `verification.rejection_sample` (its docstring defines accepted, recovered and bonus tokens
and the layout: request r verifies n_r drafts, `cu_num_drafts` [R+1]; draft rows [total_drafts, ...];
target rows [total_drafts + R, ...], request r's starting at cu_num_drafts[r] + r). Same arguments,
same results: token ids and accepted counts exactly (up to float rounding landing on a decision
boundary), with the uniforms passed in.

Launches (no host sync):
  1. `target_row_stats_kernel`, grid (target rows): per row the softmax statistics of logits / T
     (max, Σexp) and the argmax of the logits — p_t(v) = exp(logit_v / T − max) / Σexp is then one
     load away for any v, so no [rows, V] probability tensor is ever written;
  2. `rejection_sample_kernel`, grid (requests): the acceptance run u·p_d(x) < p_t(x) (q >= p: always
     accept), then at the final row either the residual normalise(max(0, p_t − p_d)) (p_t if its mass is
     ≤ RESIDUAL_EPS) or the bonus p_t, written to a [R, V] scratch row and sampled by inverse CDF
     exactly as `sample_from_probs`.
Greedy rows (T < GREEDY_TEMPERATURE) use one-hot p_t, as the twin. The greedy variant
(`rejection_greedy_sample_triton`, twin `verification.rejection_sample_greedy`, for a batch known to be all
greedy) needs only the row argmaxes:
accept while the draft equals the target's argmax, then emit the argmax of the final row — what the
general rule reduces to with one-hot p_t, whatever p_d.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dspark_core.distributions import GREEDY_TEMPERATURE
from dspark_core.kernels import interpreting
from dspark_core.kernels.sampling import inverse_cdf_count


@triton.jit
def request_of_target_row(cu_num_drafts_ptr, t, num_requests, BLOCK_Q: tl.constexpr):
    """The request r whose target rows [cu[r] + r, cu[r+1] + r + 1) hold row t."""
    count = tl.zeros([], tl.int32)
    for q0 in range(1, num_requests, BLOCK_Q):
        qs = q0 + tl.arange(0, BLOCK_Q)
        q_mask = qs < num_requests
        starts = tl.load(cu_num_drafts_ptr + qs, mask=q_mask, other=0) + qs
        count += tl.sum((q_mask & (starts <= t)).to(tl.int32), axis=0)
    return count


@triton.jit
def target_row_stats_kernel(
    target_logits_ptr,  # [total_drafts + R, V]
    cu_num_drafts_ptr,  # [R + 1] long
    temperatures_ptr,  # [R]
    row_max_ptr,  # [total_drafts + R] fp32 out: max of logits / T
    row_sum_ptr,  # [total_drafts + R] fp32 out: Σ exp(logits / T − max)
    row_argmax_ptr,  # [total_drafts + R] int32 out: first argmax of the logits
    num_requests,
    vocab,
    greedy_temperature,
    stride_t,
    GREEDY_ONLY: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    row_ptr = target_logits_ptr + t * stride_t
    if GREEDY_ONLY:
        greedy = True
        scale = 1.0
    else:
        r = request_of_target_row(cu_num_drafts_ptr, t, num_requests, BLOCK_Q)
        temp = tl.load(temperatures_ptr + r).to(tl.float32)
        greedy = temp < greedy_temperature
        scale = tl.where(greedy, 1.0, temp)
    run_max = tl.full([BLOCK_V], float("-inf"), tl.float32)  # per lane, merged at the end
    run_sum = tl.zeros([BLOCK_V], tl.float32)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.zeros([], tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < vocab
        x = tl.load(row_ptr + cols, mask=mask, other=float("-inf")).to(tl.float32)
        block_max = tl.max(x, axis=0)
        block_idx = tl.argmax(x, axis=0) + v0
        best_idx = tl.where(block_max > best_val, block_idx, best_idx)  # strict: the first argmax wins ties
        best_val = tl.maximum(best_val, block_max)
        if not GREEDY_ONLY:
            s = x / scale
            new_max = tl.maximum(run_max, s)
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - safe) + tl.exp(s - safe)
            run_max = new_max
    tl.store(row_argmax_ptr + t, best_idx)
    if not GREEDY_ONLY:
        m = tl.max(run_max, axis=0)
        total = tl.sum(tl.where(run_max == float("-inf"), 0.0, run_sum * tl.exp(run_max - m)), axis=0)
        tl.store(row_max_ptr + t, m)
        tl.store(row_sum_ptr + t, total)


@triton.jit
def rejection_sample_kernel(
    target_logits_ptr,  # [total_drafts + R, V]
    draft_token_ids_ptr,  # [total_drafts] long
    cu_num_drafts_ptr,  # [R + 1] long
    draft_probs_ptr,  # [total_drafts, V] (unused without HAS_DRAFT_PROBS: one-hot drafts)
    temperatures_ptr,  # [R]
    accept_uniforms_ptr,  # [total_drafts]
    sample_uniforms_ptr,  # [R]
    row_max_ptr,  # [total_drafts + R] fp32
    row_sum_ptr,  # [total_drafts + R] fp32
    row_argmax_ptr,  # [total_drafts + R] int32
    final_probs_ptr,  # [R, V] fp32 scratch: the distribution the recovered/bonus token is drawn from
    num_accepted_ptr,  # [R] long out
    next_token_ids_ptr,  # [R] long out
    vocab,
    greedy_temperature,
    residual_eps,
    stride_t,
    stride_d,
    stride_f,
    HAS_DRAFT_PROBS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    d0 = tl.load(cu_num_drafts_ptr + r)
    num_drafts = tl.load(cu_num_drafts_ptr + r + 1) - d0
    t0 = d0 + r
    temp = tl.load(temperatures_ptr + r).to(tl.float32)
    greedy = temp < greedy_temperature
    scale = tl.where(greedy, 1.0, temp)
    # The acceptance run: drafts accepted from the first one up to the first rejection.
    num_accepted = tl.zeros([], tl.int64)
    alive = tl.full([], 1, tl.int1)
    for j in range(0, num_drafts):
        x = tl.load(draft_token_ids_ptr + d0 + j)
        t = t0 + j
        logit = tl.load(target_logits_ptr + t * stride_t + x).to(tl.float32)
        p_t = tl.where(greedy, (x == tl.load(row_argmax_ptr + t)).to(tl.float32),
                       tl.exp(logit / scale - tl.load(row_max_ptr + t)) * (1.0 / tl.load(row_sum_ptr + t)))
        if HAS_DRAFT_PROBS:
            p_d = tl.load(draft_probs_ptr + (d0 + j) * stride_d + x).to(tl.float32)
        else:
            p_d = 1.0
        u = tl.load(accept_uniforms_ptr + d0 + j).to(tl.float32)
        alive = alive & (u * p_d < p_t)
        num_accepted += alive.to(tl.int64)
    # The final row: residual after a rejection, p_t itself for the bonus.
    t = t0 + num_accepted
    rejected = num_accepted < num_drafts
    d = d0 + num_accepted  # the rejected draft's row (meaningless if none was rejected)
    row_ptr = target_logits_ptr + t * stride_t
    row_max = tl.load(row_max_ptr + t)
    inv_sum = 1.0 / tl.load(row_sum_ptr + t)
    argmax = tl.load(row_argmax_ptr + t)
    draft_x = tl.load(draft_token_ids_ptr + d, mask=rejected, other=0)
    mass = tl.zeros([], tl.float32)
    if rejected:
        acc = tl.zeros([BLOCK_V], tl.float32)
        for v0 in range(0, vocab, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            mask = cols < vocab
            logits = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            p_t = tl.where(greedy, (cols == argmax).to(tl.float32), tl.exp(logits / scale - row_max) * inv_sum)
            if HAS_DRAFT_PROBS:
                p_d = tl.load(draft_probs_ptr + d * stride_d + cols, mask=mask, other=0.0).to(tl.float32)
            else:
                p_d = (cols == draft_x).to(tl.float32)
            acc += tl.where(mask, tl.maximum(p_t - p_d, 0.0), 0.0)
        mass = tl.sum(acc, axis=0)
    use_residual = rejected & (mass > residual_eps)
    inv_mass = 1.0 / tl.maximum(mass, residual_eps)
    out_ptr = final_probs_ptr + r * stride_f
    carry = tl.full([], 0.0, tl.float64)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < vocab
        logits = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        p_t = tl.where(greedy, (cols == argmax).to(tl.float32), tl.exp(logits / scale - row_max) * inv_sum)
        q = p_t
        if use_residual:
            if HAS_DRAFT_PROBS:
                p_d = tl.load(draft_probs_ptr + d * stride_d + cols, mask=mask, other=0.0).to(tl.float32)
            else:
                p_d = (cols == draft_x).to(tl.float32)
            q = tl.maximum(p_t - p_d, 0.0) * inv_mass
        q = tl.where(mask, q, 0.0)
        tl.store(out_ptr + cols, q, mask=mask)
        carry = tl.max(tl.cumsum(q.to(tl.float64), axis=0) + carry, axis=0)  # the cdf walk (sampling.py)
    threshold = tl.load(sample_uniforms_ptr + r).to(tl.float32) * carry.to(tl.float32)
    tl.debug_barrier()  # the count reads back what the loop above wrote
    token = inverse_cdf_count(out_ptr, vocab, threshold, BLOCK_V)
    tl.store(num_accepted_ptr + r, num_accepted)
    tl.store(next_token_ids_ptr + r, token.to(tl.int64))


@triton.jit
def rejection_greedy_kernel(
    draft_token_ids_ptr,  # [total_drafts] long
    cu_num_drafts_ptr,  # [R + 1] long
    row_argmax_ptr,  # [total_drafts + R] int32
    num_accepted_ptr,  # [R] long out
    next_token_ids_ptr,  # [R] long out
):
    r = tl.program_id(0).to(tl.int64)
    d0 = tl.load(cu_num_drafts_ptr + r)
    num_drafts = tl.load(cu_num_drafts_ptr + r + 1) - d0
    num_accepted = tl.zeros([], tl.int64)
    alive = tl.full([], 1, tl.int1)
    for j in range(0, num_drafts):
        x = tl.load(draft_token_ids_ptr + d0 + j)
        alive = alive & (x == tl.load(row_argmax_ptr + d0 + r + j).to(tl.int64))
        num_accepted += alive.to(tl.int64)
    tl.store(num_accepted_ptr + r, num_accepted)
    tl.store(next_token_ids_ptr + r, tl.load(row_argmax_ptr + d0 + r + num_accepted).to(tl.int64))


def _block_sizes(vocab: int) -> tuple[int, int]:
    block_v = min(64 if interpreting() else 2048, triton.next_power_of_2(vocab))
    return block_v, (4 if block_v <= 256 else 8)


def _row_stats(
    target_logits: Tensor, cu_num_drafts: Tensor, temperatures: Tensor, greedy_only: bool, block_v: int | None
):
    num_target_rows, vocab = target_logits.shape
    device = target_logits.device
    bv, warps = _block_sizes(vocab)
    block_v = block_v or bv
    row_max = torch.empty(num_target_rows, dtype=torch.float32, device=device)
    row_sum = torch.empty_like(row_max)
    row_argmax = torch.empty(num_target_rows, dtype=torch.int32, device=device)
    num_requests = cu_num_drafts.numel() - 1
    if num_target_rows:
        target_row_stats_kernel[(num_target_rows,)](
            target_logits, cu_num_drafts, temperatures, row_max, row_sum, row_argmax,
            num_requests, vocab, GREEDY_TEMPERATURE, target_logits.stride(0),
            GREEDY_ONLY=greedy_only, BLOCK_V=block_v, BLOCK_Q=min(1024, triton.next_power_of_2(max(num_requests, 2))),
            num_warps=warps, enable_fp_fusion=False,
        )
    return row_max, row_sum, row_argmax, block_v, warps


def rejection_sample_triton(
    target_logits: Tensor,  # [total_drafts + R, V]
    draft_token_ids: Tensor,  # [total_drafts] long
    cu_num_drafts: Tensor,  # [R + 1] long
    draft_probs: Tensor | None,  # [total_drafts, V] or None
    temperatures: Tensor,  # [R]
    accept_uniforms: Tensor,  # [total_drafts]
    sample_uniforms: Tensor,  # [R]
    *,
    residual_eps: float,
    block_v: int | None = None,
) -> tuple[Tensor, Tensor]:
    """→ (num_accepted [R] long, next_token_ids [R] long), as `verification.rejection_sample`."""
    num_requests = cu_num_drafts.numel() - 1
    vocab = target_logits.shape[-1]
    device = target_logits.device
    num_accepted = torch.empty(num_requests, dtype=torch.long, device=device)
    next_ids = torch.empty(num_requests, dtype=torch.long, device=device)
    if num_requests == 0:
        return num_accepted, next_ids
    if target_logits.stride(-1) != 1:
        target_logits = target_logits.contiguous()
    if draft_probs is not None and draft_probs.stride(-1) != 1:
        draft_probs = draft_probs.contiguous()
    draft_token_ids, cu_num_drafts = draft_token_ids.contiguous(), cu_num_drafts.contiguous()
    temperatures, accept_uniforms, sample_uniforms = (
        temperatures.contiguous(), accept_uniforms.contiguous(), sample_uniforms.contiguous()
    )
    row_max, row_sum, row_argmax, block_v, warps = _row_stats(
        target_logits, cu_num_drafts, temperatures, False, block_v
    )
    final_probs = torch.empty(num_requests, vocab, dtype=torch.float32, device=device)
    probs_arg = draft_probs if draft_probs is not None else final_probs  # never read without draft probs
    rejection_sample_kernel[(num_requests,)](
        target_logits, draft_token_ids, cu_num_drafts, probs_arg, temperatures, accept_uniforms, sample_uniforms,
        row_max, row_sum, row_argmax, final_probs, num_accepted, next_ids,
        vocab, GREEDY_TEMPERATURE, residual_eps, target_logits.stride(0), probs_arg.stride(0), final_probs.stride(0),
        HAS_DRAFT_PROBS=draft_probs is not None, BLOCK_V=block_v, num_warps=warps, enable_fp_fusion=False,
    )
    return num_accepted, next_ids


def rejection_greedy_sample_triton(
    target_logits: Tensor,  # [total_drafts + R, V]
    draft_token_ids: Tensor,  # [total_drafts] long
    cu_num_drafts: Tensor,  # [R + 1] long
    *,
    block_v: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The all-greedy batch: → (num_accepted [R] long, next_token_ids [R] long) from row argmaxes alone."""
    num_requests = cu_num_drafts.numel() - 1
    device = target_logits.device
    num_accepted = torch.empty(num_requests, dtype=torch.long, device=device)
    next_ids = torch.empty(num_requests, dtype=torch.long, device=device)
    if num_requests == 0:
        return num_accepted, next_ids
    if target_logits.stride(-1) != 1:
        target_logits = target_logits.contiguous()
    draft_token_ids, cu_num_drafts = draft_token_ids.contiguous(), cu_num_drafts.contiguous()
    _, _, row_argmax, _, _ = _row_stats(target_logits, cu_num_drafts, cu_num_drafts, True, block_v)
    rejection_greedy_kernel[(num_requests,)](draft_token_ids, cu_num_drafts, row_argmax, num_accepted, next_ids)
    return num_accepted, next_ids
