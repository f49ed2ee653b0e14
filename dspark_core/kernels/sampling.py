"""Triton building blocks shared by the kernels: inverse-CDF sampling exactly as the torch twin, and rounding.

Twin: `distributions.sample_from_probs` — cdf = probs.cumsum(-1), threshold = u · cdf[-1], index = the
number of cdf entries <= threshold (searchsorted, right=True), clamped to vocab − 1. On CPU torch
accumulates a float32 cumsum in float64 and rounds every entry to float32; these helpers do the same
(a float64 scan per block plus a float64 carry, each entry rounded to float32), so kernel and twin pick
the same token unless u · total falls within a float64 rounding error of a cdf step.

A row is walked twice: once for the total (in the caller's loop, which also writes the probabilities:
`cdf = tl.cumsum(p.to(tl.float64)) + carry; carry = tl.max(cdf)` per block), once to count
(`inverse_cdf_count`, reading them back). Both walks compute identical cdf values: same blocks, same
operations. (Written out at each call site rather than as a helper: the interpreter re-patches
triton.language on every nested jit call, which inside a vocabulary loop costs more than the kernel.)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def inverse_cdf_count(
    probs_ptr,  # [vocab] fp32 row (written by the caller's first walk)
    vocab,
    threshold,  # fp32: u · cdf[-1]
    BLOCK_V: tl.constexpr,
):
    """Token index sampled from the row: #{v : cdf[v] <= threshold}, clamped to vocab − 1."""
    carry = tl.full([], 0.0, tl.float64)
    count = tl.zeros([], tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        mask = cols < vocab
        p = tl.load(probs_ptr + cols, mask=mask, other=0.0)
        cdf = tl.cumsum(p.to(tl.float64), axis=0) + carry  # exactly as the caller's first walk
        carry = tl.max(cdf, axis=0)  # p >= 0: the running max is the last entry
        count += tl.sum((mask & (cdf.to(tl.float32) <= threshold)).to(tl.int32), axis=0)
    return tl.minimum(count, vocab - 1)


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """fp32 x rounded to DTYPE (round to nearest even, as torch's casts), returned as fp32.

    bf16 is rounded by hand on the bits: Triton's interpreter truncates fp32 → bf16 casts, the GPU rounds
    to nearest even, and the twins (nn.Linear in bf16) round to nearest even.
    """
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x
