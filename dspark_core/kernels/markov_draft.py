"""Triton: DSpark's Markov-head draft sampling for a batch of requests and all γ block positions.

Torch twin: `DSparkModel.sample_block` (dspark_core/drafters/dspark.py), i.e. per position k

    logits = U_k + W2(W1[x_{k−1}])       (the bias in the head's dtype, then fp32)
    p_k    = logits_to_probs(logits, T)  (softmax(logits / T) in fp32; one-hot argmax when greedy)
    x_k    = sample_from_probs(p_k, u_k) (inverse CDF, right=True)
    c_k    = Linear([h_k ; W1[x_{k−1}]]) (the confidence logit, in the head's dtype, then fp32)

with x_0 the anchor. U = lm_head(h) for the whole block stays one cuBLAS GEMM in torch.

Launches: two per position, 2γ in all, queued back to back with no host sync (x_{k−1} is read on device
from the previous position's output). Why not one launch for all γ positions: the bias needs
W1[x_{k−1}]·W2 over the whole vocabulary, and x_{k−1} exists only after position k−1 has been sampled
over the whole vocabulary. A single launch would have to keep one program per request walking all of V
for every position, reading W2 (V·r: 77 MB in bf16 for Qwen3's vocabulary at r = 256) once per request
and position from a single SM — milliseconds. Splitting each position into
  1. `markov_logits_kernel`, grid (V blocks, request blocks): the bias as a [BLOCK_R, r]·[r, BLOCK_V]
     `tl.dot` (W2 read once per position and block of 16–64 requests, by every SM), plus U, divided by T,
     stored as fp32 scratch in the draft-probs output, with per-block (max, Σexp, argmax) partials;
  2. `markov_sample_kernel`, grid (requests): combines the partials into the softmax normaliser, turns
     the scratch row into probabilities in place, samples x_k by inverse CDF, writes the confidence logit;
keeps W2 traffic at γ·V·r per step, as a batched GEMM would, and the sequential dependency costs only
the launch gap between positions (CUDA graphs remove even that).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dspark_core.distributions import GREEDY_TEMPERATURE
from dspark_core.kernels import interpreting
from dspark_core.kernels.sampling import inverse_cdf_count, round_to


@triton.jit
def markov_logits_kernel(
    backbone_logits_ptr,  # [R, n, V] U (lm_head output, any float dtype)
    prev_ids_ptr,  # [R] long, x_{k−1} (anchor ids for k = 0, else the tokens of position k−1)
    w1_ptr,  # [V, rank] Markov W1 (embedding)
    w2_ptr,  # [V, rank] Markov W2 (nn.Linear(rank, V).weight)
    temperatures_ptr,  # [R]
    scaled_ptr,  # [R, n, V] fp32 out: logits / T of position k (scratch, becomes the draft probs)
    part_max_ptr,  # [R, num_parts] fp32 out: per V block, max of logits / T
    part_sum_ptr,  # [R, num_parts] fp32 out: per V block, Σ exp(logits / T − block max)
    part_idx_ptr,  # [R, num_parts] int32 out: per V block, first argmax
    position,
    num_rows,
    vocab,
    rank,
    num_parts,
    greedy_temperature,
    stride_ur, stride_uk, stride_prev, stride_w1, stride_w2, stride_sr, stride_sk,
    HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr,  # fp32 weights, or the interpreter (which mis-computes bf16 tl.dot)
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_v = tl.program_id(0)
    pid_r = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    row_mask = rows < num_rows
    col_mask = cols < vocab
    mask = row_mask[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)
    u_ptrs = backbone_logits_ptr + rows64[:, None] * stride_ur + position * stride_uk + cols[None, :]
    logits = tl.load(u_ptrs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_R, BLOCK_V]
    if HAS_BIAS:
        prev = tl.load(prev_ids_ptr + rows64 * stride_prev, mask=row_mask, other=0).to(tl.int64)
        acc = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
        for c0 in range(0, rank, BLOCK_K):
            ks = c0 + tl.arange(0, BLOCK_K)
            k_mask = ks < rank
            e = tl.load(w1_ptr + prev[:, None] * stride_w1 + ks[None, :],
                        mask=row_mask[:, None] & k_mask[None, :], other=0.0)  # [BLOCK_R, BLOCK_K]
            w = tl.load(w2_ptr + cols[None, :].to(tl.int64) * stride_w2 + ks[:, None],
                        mask=k_mask[:, None] & col_mask[None, :], other=0.0)  # [BLOCK_K, BLOCK_V]
            if DOT_FP32:
                acc += tl.dot(e.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(e, w)
        # The twin's bias is nn.Linear's output: rounded to the weights' dtype, then .float().
        logits += round_to(acc, w2_ptr.dtype.element_ty)
    temps = tl.load(temperatures_ptr + rows, mask=row_mask, other=1.0).to(tl.float32)
    scale = tl.where(temps < greedy_temperature, 1.0, temps)
    scaled = logits / scale[:, None]
    s_ptrs = scaled_ptr + rows64[:, None] * stride_sr + position * stride_sk + cols[None, :]
    tl.store(s_ptrs, scaled, mask=mask)
    masked = tl.where(mask, scaled, float("-inf"))
    block_max = tl.max(masked, axis=1)  # [BLOCK_R]
    block_arg = tl.argmax(masked, axis=1) + pid_v * BLOCK_V
    safe_max = tl.where(row_mask, block_max, 0.0)  # rows past the batch: no -inf − -inf
    block_sum = tl.sum(tl.where(mask, tl.exp(masked - safe_max[:, None]), 0.0), axis=1)
    part = rows64 * num_parts + pid_v
    tl.store(part_max_ptr + part, block_max, mask=row_mask)
    tl.store(part_sum_ptr + part, block_sum, mask=row_mask)
    tl.store(part_idx_ptr + part, block_arg.to(tl.int32), mask=row_mask)


@triton.jit
def markov_sample_kernel(
    probs_ptr,  # [R, n, V] fp32: in, logits / T of position k; out, its draft probs
    part_max_ptr,  # [R, num_parts] fp32
    part_sum_ptr,  # [R, num_parts] fp32
    part_idx_ptr,  # [R, num_parts] int32
    temperatures_ptr,  # [R]
    uniforms_ptr,  # [R, n]
    token_ids_ptr,  # [R, n] long out
    prev_ids_ptr,  # [R] long, x_{k−1}
    h_ptr,  # [R, n, hidden] final-normed backbone output
    w1_ptr,  # [V, rank]
    conf_w_ptr,  # [hidden + rank] confidence Linear weight (row 0)
    conf_b_ptr,  # [1] confidence Linear bias
    conf_ptr,  # [R, n] fp32 out: confidence logits
    position,
    vocab,
    num_parts,
    hidden,
    rank,
    greedy_temperature,
    stride_pr, stride_pk, stride_u, stride_tok, stride_prev, stride_hr, stride_hk, stride_w1, stride_conf,
    HAS_CONF: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    temp = tl.load(temperatures_ptr + r).to(tl.float32)
    greedy = temp < greedy_temperature
    # Softmax normaliser and greedy argmax from the per-block partials.
    parts = r * num_parts
    row_max = tl.full([], float("-inf"), tl.float32)
    for p0 in range(0, num_parts, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)
        pm = tl.load(part_max_ptr + parts + ps, mask=ps < num_parts, other=float("-inf"))
        row_max = tl.maximum(row_max, tl.max(pm, axis=0))
    row_sum = tl.zeros([], tl.float32)
    best_val = tl.full([], float("-inf"), tl.float32)
    best_idx = tl.zeros([], tl.int32)
    for p0 in range(0, num_parts, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)
        p_mask = ps < num_parts
        pm = tl.load(part_max_ptr + parts + ps, mask=p_mask, other=float("-inf"))
        psum = tl.load(part_sum_ptr + parts + ps, mask=p_mask, other=0.0)
        pidx = tl.load(part_idx_ptr + parts + ps, mask=p_mask, other=0)
        row_sum += tl.sum(tl.where(p_mask, psum * tl.exp(pm - row_max), 0.0), axis=0)
        chunk_max = tl.max(pm, axis=0)
        chunk_idx = tl.min(tl.where(p_mask & (pm == chunk_max), pidx, vocab), axis=0)
        best_idx = tl.where(chunk_max > best_val, chunk_idx, best_idx)  # strict: the first argmax wins ties
        best_val = tl.maximum(best_val, chunk_max)
    inv_sum = 1.0 / row_sum
    # Walk 1: probabilities in place of the scaled logits, and the cdf total.
    row_ptr = probs_ptr + r * stride_pr + position * stride_pk
    carry = tl.full([], 0.0, tl.float64)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < vocab
        x = tl.load(row_ptr + cols, mask=mask, other=float("-inf"))
        p = tl.where(greedy, (cols == best_idx).to(tl.float32), tl.exp(x - row_max) * inv_sum)
        p = tl.where(mask, p, 0.0)
        tl.store(row_ptr + cols, p, mask=mask)
        carry = tl.max(tl.cumsum(p.to(tl.float64), axis=0) + carry, axis=0)  # the cdf walk (sampling.py)
    u = tl.load(uniforms_ptr + r * stride_u + position).to(tl.float32)
    threshold = u * carry.to(tl.float32)
    tl.debug_barrier()  # walk 2 reads what walk 1 wrote
    token = inverse_cdf_count(row_ptr, vocab, threshold, BLOCK_V)
    tl.store(token_ids_ptr + r * stride_tok + position, token.to(tl.int64))
    if HAS_CONF:
        prev = tl.load(prev_ids_ptr + r * stride_prev).to(tl.int64)
        acc = tl.zeros([BLOCK_H], tl.float32)
        for c0 in range(0, hidden, BLOCK_H):
            cs = c0 + tl.arange(0, BLOCK_H)
            c_mask = cs < hidden
            hv = tl.load(h_ptr + r * stride_hr + position * stride_hk + cs, mask=c_mask, other=0.0).to(tl.float32)
            wv = tl.load(conf_w_ptr + cs, mask=c_mask, other=0.0).to(tl.float32)
            acc += hv * wv
        for c0 in range(0, rank, BLOCK_H):
            cs = c0 + tl.arange(0, BLOCK_H)
            c_mask = cs < rank
            ev = tl.load(w1_ptr + prev * stride_w1 + cs, mask=c_mask, other=0.0).to(tl.float32)
            wv = tl.load(conf_w_ptr + hidden + cs, mask=c_mask, other=0.0).to(tl.float32)
            acc += ev * wv
        logit = tl.sum(acc, axis=0) + tl.load(conf_b_ptr).to(tl.float32)
        tl.store(conf_ptr + r * stride_conf + position, round_to(logit, conf_w_ptr.dtype.element_ty))


def markov_draft(
    backbone_logits: Tensor,  # [R, n, V] U_k = lm_head(h_k)
    h: Tensor,  # [R, n, hidden]
    anchor_ids: Tensor,  # [R] long
    temperatures: Tensor,  # [R]
    uniforms: Tensor,  # [R, n]
    *,
    w1: Tensor | None,  # [V, rank] (None: no sequential head, DFlash)
    w2: Tensor | None,  # [V, rank]
    conf_weight: Tensor | None,  # [1, hidden + rank] (None: no confidence head)
    conf_bias: Tensor | None,  # [1]
    draft_to_target: Tensor | None = None,  # [V] long: a reduced draft vocabulary's target ids (None: the whole)
    w1_anchor_rows: Tensor | None = None,  # [R] long: W1 indexed by draft index (+ a shared row): the anchors' rows
    block_r: int | None = None,
    block_v: int | None = None,
    block_k: int | None = None,
    block_v_sample: int | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Launch the 2γ kernels: → token ids [R, n] long, draft probs [R, n, V] fp32, confidence logits [R, n] fp32.

    V is the draft vocabulary (the LM head's rows), and the probs are over it. With `draft_to_target`, the kernels
    sample indices into it; each is mapped to its target id on the device before the next position reads it as
    x_{k−1} (W1 and the confidence head are indexed by target ids), so the token ids returned are target ids.
    Scattering the probs into the target's vocabulary is the caller's (`TargetFedDraft.full_vocab_probs`).
    `w1_anchor_rows` (a draft with `markov_w1_rows` "draft", W1 [V + 1, rank]): position 0 reads these rows of W1
    and every later position the draft index sampled before it."""
    num_rows, n, vocab = backbone_logits.shape
    device = backbone_logits.device
    has_bias = w1 is not None
    has_conf = conf_weight is not None
    if has_conf and not has_bias:
        raise ValueError("the confidence head reads W1[x_{k−1}]: it needs the Markov head")
    if (w1 is None) != (w2 is None):
        raise ValueError("the Markov head needs both W1 and W2")
    if w1_anchor_rows is not None and draft_to_target is None:
        raise ValueError("W1 over the draft vocabulary (w1_anchor_rows) needs draft_to_target")
    backbone_logits = backbone_logits.contiguous()
    h = h.contiguous()
    uniforms = uniforms.contiguous()
    temperatures = temperatures.contiguous()
    if w1 is not None and w2 is not None:
        w1, w2 = w1.contiguous(), w2.contiguous()
        rank = w1.shape[1]
    else:
        w1 = w2 = backbone_logits  # never read
        rank = 1
    if conf_weight is not None:
        conf_w = conf_weight.reshape(-1).contiguous()
        conf_b = conf_bias.reshape(-1).contiguous() if conf_bias is not None else conf_w.new_zeros(1)
    else:
        conf_w = conf_b = backbone_logits  # never read
    interp = interpreting()
    block_r = block_r or max(16, min(64, triton.next_power_of_2(num_rows)))  # W2 is read once per row block
    block_v = block_v or (64 if interp else 128)
    block_k = block_k or max(16, min(64, triton.next_power_of_2(rank)))
    block_v_sample = block_v_sample or min(64 if interp else 1024, triton.next_power_of_2(vocab))
    num_parts = triton.cdiv(vocab, block_v)
    block_p = min(1024, triton.next_power_of_2(num_parts))
    hidden = h.shape[-1]
    block_h = min(1024, triton.next_power_of_2(max(hidden, rank)))
    dot_fp32 = interp or w1.dtype == torch.float32

    token_ids = torch.empty(num_rows, n, dtype=torch.long, device=device)
    probs = torch.empty(num_rows, n, vocab, dtype=torch.float32, device=device)
    confs = torch.empty(num_rows, n, dtype=torch.float32, device=device) if has_conf else None
    part_max = torch.empty(num_rows, num_parts, dtype=torch.float32, device=device)
    part_sum = torch.empty_like(part_max)
    part_idx = torch.empty(num_rows, num_parts, dtype=torch.int32, device=device)
    conf_out = confs if confs is not None else part_max  # never written without a confidence head
    grid_logits = (num_parts, triton.cdiv(num_rows, block_r))
    sampled = token_ids if draft_to_target is None else torch.empty_like(token_ids)  # draft indices
    for k in range(n):
        if w1_anchor_rows is not None:
            prev = w1_anchor_rows if k == 0 else sampled[:, k - 1]
        else:
            prev = anchor_ids if k == 0 else token_ids[:, k - 1]
        markov_logits_kernel[grid_logits](
            backbone_logits, prev, w1, w2, temperatures, probs, part_max, part_sum, part_idx,
            k, num_rows, vocab, rank, num_parts, GREEDY_TEMPERATURE,
            backbone_logits.stride(0), backbone_logits.stride(1), prev.stride(0), w1.stride(0), w2.stride(0),
            probs.stride(0), probs.stride(1),
            HAS_BIAS=has_bias, DOT_FP32=dot_fp32, BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_K=block_k,
            enable_fp_fusion=False, num_warps=4 if block_r <= 32 else 8,
        )
        markov_sample_kernel[(num_rows,)](
            probs, part_max, part_sum, part_idx, temperatures, uniforms, sampled, prev, h, w1, conf_w, conf_b,
            conf_out, k, vocab, num_parts, hidden, rank, GREEDY_TEMPERATURE,
            probs.stride(0), probs.stride(1), uniforms.stride(0), sampled.stride(0), prev.stride(0),
            h.stride(0), h.stride(1), w1.stride(0), conf_out.stride(0),
            HAS_CONF=has_conf, BLOCK_V=block_v_sample, BLOCK_P=block_p, BLOCK_H=block_h,
            enable_fp_fusion=False, num_warps=4,
        )
        if draft_to_target is not None:  # a device gather, no host sync: the next position's x_{k−1}
            token_ids[:, k] = draft_to_target[sampled[:, k]]
    return token_ids, probs, confs
