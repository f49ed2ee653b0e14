"""Variable-length verification attention in plain torch (the twin of `attention.py`), and the glue
that runs it — or the kernel — inside a Hugging Face model.

The layout (DSPARK.md §2, "variable-length verification without padding"): the new query tokens of all
requests are flattened into one [total_q, heads, head_dim] tensor, request r's at rows
cu_seqlens_q[r] … cu_seqlens_q[r+1] − 1. Keys and values stay where `KVSlots` keeps them, one layer's
[num_slots, kv_heads, capacity, head_dim], request r in slot `slot_ids[r]`: its `past_lens[r]` cached
positions at 0 … past − 1, its new ones (already written by the layer) at `new_starts[r]` onwards.
`new_starts = past_lens` is the KVSlots layout after `append`; target.py's attention buffers put every
row's new keys at the longest row's past instead (the gap in between is masked). Query i of request r
(absolute position past + i) attends every cached position and new positions 0 … i: causal within the
verify segment, no padding anywhere. GQA: query head h reads kv head h // (heads / kv_heads).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dspark_core.kernels import use_triton

ATTN_IMPLEMENTATION = "dspark_varlen"


def varlen_attention_torch(
    q: Tensor,  # [total_q, num_heads, head_dim]
    k_cache: Tensor,  # [num_slots, kv_heads, capacity, head_dim]
    v_cache: Tensor,  # [num_slots, kv_heads, capacity, head_dim]
    cu_seqlens_q: Tensor,  # [R + 1]
    past_lens: Tensor,  # [R]
    sm_scale: float,
    new_starts: Tensor | None = None,  # [R] (None: = past_lens)
    slot_ids: Tensor | None = None,  # [R] (None: request r in slot r)
) -> Tensor:
    """softmax(q·kᵀ · sm_scale) · v per request, in fp32, returned in q's dtype: [total_q, num_heads, head_dim]."""
    num_heads, kv_heads = q.shape[1], k_cache.shape[1]
    group = num_heads // kv_heads
    out = torch.zeros_like(q)
    cu = cu_seqlens_q.tolist()
    past = past_lens.tolist()
    starts = new_starts.tolist() if new_starts is not None else past
    slots = slot_ids.tolist() if slot_ids is not None else list(range(len(past)))
    for r, (slot, p, s) in enumerate(zip(slots, past, starts)):
        n = cu[r + 1] - cu[r]
        if n == 0:
            continue
        keys = torch.cat([k_cache[slot, :, :p], k_cache[slot, :, s : s + n]], dim=1).float()  # [kv_heads, p + n, D]
        values = torch.cat([v_cache[slot, :, :p], v_cache[slot, :, s : s + n]], dim=1).float()
        keys, values = keys.repeat_interleave(group, dim=0), values.repeat_interleave(group, dim=0)  # [H, p + n, D]
        queries = q[cu[r] : cu[r + 1]].float().transpose(0, 1)  # [H, n, D]
        scores = queries @ keys.transpose(1, 2) * sm_scale  # [H, n, p + n]
        key_pos = torch.arange(p + n, device=q.device)
        allowed = key_pos[None, :] < p + 1 + torch.arange(n, device=q.device)[:, None]  # [n, p + n]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[cu[r] : cu[r + 1]] = (torch.softmax(scores, dim=-1) @ values).transpose(0, 1).to(q.dtype)
    return out


# --------------------------------------------------------------------------- Hugging Face glue


def hf_varlen_attention(
    module: torch.nn.Module,
    query: Tensor,  # [R, heads, max_new, head_dim]
    key: Tensor,  # [R, kv_heads, max_past + max_new, head_dim] (target.py's attention buffers)
    value: Tensor,
    attention_mask: Tensor | None,  # [R, max_past + max_new] bool: each row's valid cached then new positions
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """A Hugging Face attention function (registered as "dspark_varlen") over `varlen_attention`.

    Hugging Face hands every layer padded queries: [R, max_new] with each row's new keys at
    max_past … max_past + max_new − 1 of its buffer, and (through `hf_padding_mask`) target.py's 2-D mask
    [valid cached ; valid new]. That is the varlen layout with cu_seqlens_q = r · max_new,
    past_lens = the valid cached count and new_starts = max_past: a padded query only produces a row
    the caller ignores, and a valid one never sees a padded key. No 4-D mask is built, nothing is synced.
    """
    if dropout:
        raise NotImplementedError("dspark_varlen attention is for inference (dropout 0)")
    if sliding_window is not None:
        raise NotImplementedError("dspark_varlen attention has no sliding window")
    num_rows, num_heads, max_new, head_dim = query.shape
    max_past = key.shape[2] - max_new
    device = query.device
    if attention_mask is not None:
        past_lens = attention_mask[:, :max_past].sum(-1)
    else:
        past_lens = torch.full((num_rows,), max_past, dtype=torch.long, device=device)
    q = query.transpose(1, 2).reshape(num_rows * max_new, num_heads, head_dim)  # [R·max_new, H, D]
    cu = torch.arange(num_rows + 1, device=device) * max_new
    starts = torch.full((num_rows,), max_past, dtype=torch.long, device=device)
    scale = scaling if scaling is not None else head_dim**-0.5
    out = varlen_attention(q, key, value, cu, past_lens, scale, new_starts=starts, max_seqlen_q=max_new)
    return out.view(num_rows, max_new, num_heads, head_dim), None


def hf_padding_mask(*args, attention_mask: Tensor | None = None, **kwargs) -> Tensor | None:
    """The mask function for "dspark_varlen": the 2-D padding mask as given (no 4-D expansion)."""
    return attention_mask


def install_varlen_attention(model: torch.nn.Module) -> None:
    """Register "dspark_varlen" with Hugging Face and switch `model` to it (transformers >= 4.56)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, hf_varlen_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, hf_padding_mask)
    hf_model: Any = model  # a transformers PreTrainedModel: its attention switch is not on nn.Module
    if hasattr(hf_model, "set_attn_implementation"):
        hf_model.set_attn_implementation(ATTN_IMPLEMENTATION)
    else:  # pragma: no cover - older transformers
        hf_model.config._attn_implementation = ATTN_IMPLEMENTATION


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
    """Verification attention over flattened variable-length queries: [total_q, H, D]. The dispatch of
    `attention.varlen_attention_triton` beside its twin `varlen_attention_torch`."""
    if q.shape[0] == 0 or not use_triton(q.device):
        return varlen_attention_torch(q, k_cache, v_cache, cu_seqlens_q, past_lens, sm_scale, new_starts, slot_ids)
    from dspark_core.kernels.attention import varlen_attention_triton

    return varlen_attention_triton(
        q, k_cache, v_cache, cu_seqlens_q, past_lens, sm_scale, new_starts, slot_ids, max_seqlen_q
    )


def use_varlen_attention(model: torch.nn.Module) -> bool:
    """Switch a Hugging Face model to "dspark_varlen" attention (`hf_varlen_attention`, which runs
    `varlen_attention`) when its parameters sit where the Triton path runs; True if switched. The one line
    `TargetModel.__init__` needs."""
    if not use_triton(next(model.parameters()).device):
        return False
    install_varlen_attention(model)
    return True
