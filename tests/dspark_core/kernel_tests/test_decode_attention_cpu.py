"""The C++ decode-attention kernel (`kernels/decode_attention.cpp`) against its torch twin
(`decode_attention.decode_attention_torch`), both builds: `native` (AVX512-BF16 paths where this CPU has them)
and `portable` (the plain loops, which the native build also runs for head sizes its vector paths skip)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from dspark_core import decode_attention as da
from dspark_core.kernels import decode_attention_cpu as kernel

pytestmark = pytest.mark.skipif(kernel.library("portable") is None, reason="no C++ compiler here")
VARIANTS = ["native", "portable"]


def _case(rows, total, heads, kv_heads, dim, seed=0, capacity=None):
    """Keys and values as the lean forward hands them over: views of KV slots longer than the window."""
    gen = torch.Generator().manual_seed(seed)
    capacity = capacity or total + 5
    q = (torch.randn(rows, heads, 1, dim, generator=gen) * 2).bfloat16()
    k_slots = (torch.randn(rows, kv_heads, capacity, dim, generator=gen) * 2).bfloat16()
    v_slots = torch.randn(rows, kv_heads, capacity, dim, generator=gen).bfloat16()
    seen = torch.randint(1, total + 1, (rows,), generator=gen)  # a ragged batch: each row its own prefix
    mask = torch.zeros(rows, 1, 1, total, dtype=torch.bfloat16)
    mask.masked_fill_(torch.arange(total)[None, None, None, :] >= seen[:, None, None, None],
                      torch.finfo(torch.bfloat16).min)
    return q, k_slots[:, :, :total], v_slots[:, :, :total], mask


def _kernel(variant, *args):
    out = kernel.decode_attention_cpu(*args, variant=variant)
    if out is None:
        pytest.skip(f"the {variant} build has no vector paths on this CPU")
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows,total,heads,kv_heads,dim", [
    (1, 1, 9, 3, 64),      # one key: the softmax of a single score
    (3, 40, 9, 3, 64),     # SmolLM2's grouping (3 query heads per KV head), its head size
    (5, 137, 8, 2, 64),    # 4 per group, an odd length
    (2, 33, 4, 4, 32),     # no grouping; a head size the dot product covers but the value path does not
    (4, 20, 6, 3, 48),     # a head size neither vector path covers: the plain loops
])
def test_kernel_is_its_twin(variant, rows, total, heads, kv_heads, dim):
    q, k, v, mask = _case(rows, total, heads, kv_heads, dim)
    scale = dim ** -0.5
    got = _kernel(variant, q, k, v, mask, scale)
    twin = da.decode_attention_torch(q, k, v, mask, scale)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double(), scale=scale,
                                         enable_gqa=True)
    assert got.shape == twin.shape and got.dtype == torch.bfloat16
    # the same exact products summed in another order: at most one bf16 rounding apart, and as exact
    torch.testing.assert_close(got.float(), twin.float(), atol=2**-7 * ref.abs().max().item(), rtol=0)
    err, twin_err = (got.double() - ref).abs().max(), (twin.double() - ref).abs().max()
    assert err <= twin_err * 1.25 + 1e-6


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_maps_query_groups_and_masks_like_sdpa(variant):
    """Query head h reads KV head h // group; a masked key is never read, whatever it holds."""
    q, k, v, mask = _case(2, 12, 6, 2, 64, seed=3)
    v[:, 1] += 10  # KV head 1 stands out: query heads 3–5 see it, 0–2 do not
    mask[:, :, :, -1] = torch.finfo(torch.bfloat16).min
    v[:, :, -1] = 1e4  # behind the mask: must not leak
    out = _kernel(variant, q, k, v, mask, 0.5).float()
    assert (out[:, 3:].mean() - out[:, :3].mean()) > 5 and out.abs().max() < 100
    no_mask = _kernel(variant, q, k, v, None, 0.5).float()
    assert no_mask.abs().max() > 100  # without the mask the last key does count


def test_dispatch_runs_the_kernel_unless_told_torch(monkeypatch):
    q, k, v, mask = _case(4, 50, 9, 3, 64, seed=5)
    native = kernel.decode_attention_cpu(q, k, v, mask, 0.125)
    if native is None:
        pytest.skip("no AVX512-BF16 here: the dispatch runs the twin")
    assert torch.equal(da.decode_attention(q, k, v, mask, 0.125), native)
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    assert torch.equal(da.decode_attention(q, k, v, mask, 0.125), da.decode_attention_torch(q, k, v, mask, 0.125))


def test_kernel_covers_only_bf16_single_queries_on_the_cpu():
    q, k, _, _ = _case(2, 8, 9, 3, 64)
    assert kernel.covers(q, k)
    assert not kernel.covers(q.half(), k.half()) and not kernel.covers(q.float(), k.float())
    assert not kernel.covers(q.expand(2, 9, 4, 64), k)  # a verify step: several queries per row


def test_build_is_cached_and_a_missing_compiler_falls_back_with_a_warning(tmp_path, monkeypatch):
    from dspark_core.kernels import cpu_build

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    first = cpu_build.build(kernel.NAME, "portable")
    mtime = first.stat().st_mtime_ns
    assert first.parent == tmp_path / "kernels" and cpu_build.build(kernel.NAME, "portable") == first
    assert first.stat().st_mtime_ns == mtime  # reused, not rebuilt
    monkeypatch.setattr(cpu_build, "_compiler", lambda: None)
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "empty"))
    cpu_build.load.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert kernel.library("native") is None
        assert any("no C++ compiler" in str(w.message) for w in caught)
        q, k, v, mask = _case(2, 8, 9, 3, 64)
        twin = da.decode_attention_torch(q, k, v, mask, 0.125)
        assert torch.equal(da.decode_attention(q, k, v, mask, 0.125), twin)  # the dispatch runs the twin
    finally:
        cpu_build.load.cache_clear()
