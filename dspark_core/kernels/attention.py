"""Triton: variable-length verification attention reading each request's KV slot directly.

Torch twin: `attention_ref.varlen_attention_torch` (the layout is defined there; the twin is checked
against Hugging Face's own attention on a tiny model in the tests).

Grid (requests, kv heads, query blocks). A program takes one kv head of one request and packs every
query head of its GQA group with every query token into the M dimension (row m = query m // GROUP,
head kv_head·GROUP + m % GROUP): a verify segment is only γ + 1 ≤ 8 tokens, so one [BLOCK_M ≤ 64] tile
usually covers the whole request for that kv head and its keys/values are read from the slot once.
One loop of flash-attention online softmax (fp32 statistics) over the cached positions 0 … past − 1, then
the request's new keys at new_start … new_start + n − 1 under the causal mask t ≤ i. Nothing is padded:
the programs of a short request see a shorter loop, and no mask tensor exists.

Not done here (for long contexts at low batch): splitting the cached loop across programs (flash-decoding)
— with R·kv_heads programs, one request at 32k context keeps only kv_heads SMs busy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dspark_core.kernels import interpreting
from dspark_core.kernels.sampling import round_to


@triton.jit
def varlen_attention_kernel(
    q_ptr,  # [total_q, num_heads, head_dim]
    k_cache_ptr,  # [num_slots, kv_heads, capacity, head_dim]
    v_cache_ptr,  # [num_slots, kv_heads, capacity, head_dim]
    out_ptr,  # [total_q, num_heads, head_dim] out
    cu_seqlens_q_ptr,  # [R + 1] long
    past_lens_ptr,  # [R] long
    new_starts_ptr,  # [R] long
    slot_ids_ptr,  # [R] long
    sm_scale,
    head_dim,
    stride_qt, stride_qh,
    stride_ks, stride_kh, stride_kt,
    stride_vs, stride_vh, stride_vt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    r = tl.program_id(0)
    kv_head = tl.program_id(1)
    m_block = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + r)
    num_q = tl.load(cu_seqlens_q_ptr + r + 1) - q_start
    if m_block * BLOCK_M < num_q * GROUP:
        past = tl.load(past_lens_ptr + r)
        new_start = tl.load(new_starts_ptr + r)
        slot = tl.load(slot_ids_ptr + r).to(tl.int64)
        ms = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        qi = ms // GROUP  # query token within the request
        heads = kv_head * GROUP + ms % GROUP
        m_valid = qi < num_q
        ds = tl.arange(0, BLOCK_D)
        d_mask = ds < head_dim
        q_rows = (q_start + qi).to(tl.int64)
        q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + ds[None, :],
                    mask=m_valid[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        k_base = k_cache_ptr + slot * stride_ks + kv_head * stride_kh
        v_base = v_cache_ptr + slot * stride_vs + kv_head * stride_vh
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # Keys in one index space: x < past is cached position x; x = past + t is new key t, at new_start + t.
        last_q = tl.minimum(num_q, (m_block * BLOCK_M + BLOCK_M - 1) // GROUP + 1)  # new keys this block can see
        for n0 in range(0, past + last_q, BLOCK_N):
            x = n0 + tl.arange(0, BLOCK_N)
            t = x - past
            is_new = t >= 0
            valid = x < past + num_q
            pos = tl.where(is_new, new_start + t, x).to(tl.int64)
            k = tl.load(k_base + pos[None, :] * stride_kt + ds[:, None], mask=d_mask[:, None] & valid[None, :],
                        other=0.0)  # [BLOCK_D, BLOCK_N]
            v = tl.load(v_base + pos[:, None] * stride_vt + ds[None, :], mask=valid[:, None] & d_mask[None, :],
                        other=0.0)  # [BLOCK_N, BLOCK_D]
            if DOT_FP32:
                s = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
            else:
                s = tl.dot(q, k)
            allowed = valid[None, :] & m_valid[:, None] & (~is_new[None, :] | (t[None, :] <= qi[:, None]))  # causal
            s = tl.where(allowed, s * sm_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if DOT_FP32:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        out = round_to(out, out_ptr.dtype.element_ty).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + ds[None, :], out,
                 mask=m_valid[:, None] & d_mask[None, :])


def varlen_attention_triton(
    q: Tensor,  # [total_q, num_heads, head_dim]
    k_cache: Tensor,  # [num_slots, kv_heads, capacity, head_dim]
    v_cache: Tensor,
    cu_seqlens_q: Tensor,  # [R + 1]
    past_lens: Tensor,  # [R]
    sm_scale: float,
    new_starts: Tensor | None = None,  # [R] (None: = past_lens)
    slot_ids: Tensor | None = None,  # [R] (None: request r in slot r)
    max_seqlen_q: int | None = None,  # longest verify segment if the caller knows it (else total_q bounds it)
    *,
    block_n: int | None = None,
) -> Tensor:
    """→ out [total_q, num_heads, head_dim] in q's dtype."""
    total_q, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {kv_heads} kv heads")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the KV cache must be contiguous in head_dim")
    num_requests = cu_seqlens_q.numel() - 1
    device = q.device
    out = torch.empty_like(q)
    if num_requests == 0 or total_q == 0:
        return out
    group = num_heads // kv_heads
    past_lens = past_lens.to(torch.long).contiguous()
    new_starts = past_lens if new_starts is None else new_starts.to(torch.long).contiguous()
    if slot_ids is None:
        slot_ids = torch.arange(num_requests, device=device)
    interp = interpreting()
    max_rows = (max_seqlen_q if max_seqlen_q is not None else total_q) * group
    block_m = max(16, min(64, triton.next_power_of_2(max_rows)))
    block_n = block_n or (16 if interp else 64)
    block_d = max(16, triton.next_power_of_2(head_dim))
    grid = (num_requests, kv_heads, triton.cdiv(max_rows, block_m))
    varlen_attention_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q.contiguous(), past_lens, new_starts,
        slot_ids.to(torch.long).contiguous(),
        sm_scale, head_dim,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_FP32=interp or q.dtype == torch.float32, num_warps=4,
    )
    return out
