"""Attention of a decode or verify step (a few new queries per row) as fp32 products, for bf16/fp16 models on the CPU.

Torch's CPU SDPA (its flash kernel) is slow at one query per row in bf16: about 8 µs per (row, head) plus a cost
that grows with the keys, 4–6× its own fp32 time (torch 2.13, AMD EPYC Zen 4 with AVX512-BF16 and no AMX). At
SmolLM2-135M's shape (9 heads over 3 KV heads, 30 layers) that was 62% of a 16-row decode step: 1.2 ms per layer
at 16 rows × 136 keys, 3.4 ms at 400. Written as q·kᵀ, softmax and p·v in fp32, with the grouped heads read in
place (each KV head's query group as the rows of one product), the same layer costs 0.23 ms and 0.52 ms, and its
error against an fp32 reference is SDPA's own (the products accumulate and round in fp32, as the flash kernel
does; Hugging Face's eager bf16 attention rounds the scores to bf16 and is 2–4× less exact).

Steps of at most `MAX_QUERIES` new positions per row take it (a decode step's one, a verify step's γ + 1); a
prefill keeps SDPA, whose GEMMs suit many queries. Each query attends to exactly its row's first `visible` keys,
so with the kernel a verify step's query gives the bits a decode step at the same position gives (torch's SDPA at
8 queries does not: its blocking differs from the single query's), which keeps greedy speculative decoding token
for token plain decoding in bf16; the twin is exact to rounding, not to the bit. The keys and values are widened to fp32 a chunk of rows at a time, so the widened copies stay
within the last-level cache (64 rows × 1,000 keys at once ran slower than SDPA; in chunks, 7× faster).
`python3 -m benchmarks.target_forward --against sdpa` measures it paired against SDPA on the whole forward.

The products are the twin and spec (`decode_attention_torch`) of a C++ kernel that `decode_attention` runs for bf16
where it builds (`kernels/decode_attention_cpu.py`; `DSPARK_KERNELS=torch` keeps the twin): the same exact
products in fp32, the keys and values read once from the slots, never widened into copies. Per layer at 16 rows
it is 2.7–3.3× the twin (0.08 ms at 136 keys, 0.18 ms at 400), and a 16-row step 0.49× SDPA's at 128 tokens of
context (0.57× with the twin), 0.28× at 400 (0.35×).
"""

from __future__ import annotations

import torch
from torch import Tensor

REDUCED = (torch.bfloat16, torch.float16)
CHUNK_ELEMENTS = 1 << 21  # widened keys per chunk of rows: 8 MiB of fp32, keys and values together within 32 MiB
MAX_QUERIES = 16  # new positions per row up to which a step takes this path: a verify step of γ ≤ 15


def takes(num_queries: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `decode_attention` runs a step of `num_queries` new positions per row of `dtype` on `device`."""
    return num_queries <= MAX_QUERIES and dtype in REDUCED and device.type == "cpu"


def path(dtype: torch.dtype, device: torch.device, products: bool = True) -> str | None:
    """Which attention a lean forward's decode steps run for a model of `dtype` on `device` (a cell's provenance
    records it): "c++ kernel", "torch products" (the twin), "sdpa", or None where this module is not asked."""
    from dspark_core.kernels.decode_attention_cpu import ready

    if dtype not in REDUCED or device.type != "cpu":
        return None
    if not products:
        return "sdpa"
    return "c++ kernel" if dtype == torch.bfloat16 and ready() else "torch products"


def decode_attention(query: Tensor, keys: Tensor, values: Tensor, visible: Tensor | None, scale: float) -> Tensor:
    """SDPA's result [R, heads, W, head_dim]: the C++ kernel (`kernels/decode_attention_cpu.py`) for bf16 where it
    builds and `DSPARK_KERNELS` is not `torch`, else the twin below (same arguments)."""
    from dspark_core.kernels import kernel_mode
    from dspark_core.kernels.decode_attention_cpu import covers, decode_attention_cpu

    if kernel_mode() != "torch" and covers(query, keys):
        out = decode_attention_cpu(query, keys, values, visible, scale)
        if out is not None:
            return out
    return decode_attention_torch(query, keys, values, visible, scale)


def decode_attention_torch(query: Tensor, keys: Tensor, values: Tensor, visible: Tensor | None, scale: float) -> Tensor:
    """SDPA's result [R, heads, W, head_dim] in the query's dtype: `query` [R, heads, W, d], `keys`/`values`
    [R, kv_heads, T, d] (heads a multiple of kv_heads, each KV head serving a contiguous group of query heads as
    in `enable_gqa`), `visible` [R, W]: query w of row r attends to keys 0 … visible − 1 (None: all T)."""
    rows, heads, width, dim = query.shape
    kv_heads, total = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    mask = None
    if visible is not None:  # additive [R, 1, 1, W, T], over the KV heads and their query groups
        hidden = torch.arange(total, device=keys.device)[None, None, :] >= visible.clamp(min=1)[:, :, None]
        mask = torch.zeros(hidden.shape, dtype=torch.float32, device=keys.device).masked_fill_(hidden, float("-inf"))
        mask = mask[:, None, None]
    chunk = max(1, CHUNK_ELEMENTS // max(1, kv_heads * total * dim))
    if rows <= chunk:
        return _products(query, keys, values, mask, scale, group)
    parts = [_products(query[i : i + chunk], keys[i : i + chunk], values[i : i + chunk],
                       None if mask is None else mask[i : i + chunk], scale, group)
             for i in range(0, rows, chunk)]
    return torch.cat(parts)


def _products(query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float, group: int) -> Tensor:
    rows, heads, width, dim = query.shape
    kv_heads = keys.shape[1]
    q = query.reshape(rows, kv_heads, group * width, dim).float()
    scores = torch.matmul(q, keys.float().transpose(-1, -2)).mul_(scale)  # [R, kv_heads, group · W, T]
    if mask is not None:
        scores = scores.view(rows, kv_heads, group, width, -1).add_(mask).view(rows, kv_heads, group * width, -1)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, values.float())  # [R, kv_heads, group · W, d]
    return out.reshape(rows, heads, width, dim).to(query.dtype)
