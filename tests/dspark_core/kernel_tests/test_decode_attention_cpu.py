"""The C++ decode-attention kernel (`kernels/decode_attention.cpp`) against its torch twin
(`decode_attention.decode_attention_torch`), both builds: `native` (AVX512-BF16 paths where this CPU has them)
and `portable` (the plain loops, which the native build also runs for head sizes its vector paths skip); and a
verify step's queries the bits of decode steps' at their positions."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from dspark_core import decode_attention as da
from dspark_core.kernels import decode_attention_cpu as kernel

pytestmark = pytest.mark.skipif(kernel.library("portable") is None, reason="no C++ compiler here")
VARIANTS = ["native", "portable"]


def _case(rows, total, heads, kv_heads, dim, seed=0, capacity=None, width=1):
    """Keys and values as the lean forward hands them over: views of KV slots longer than the window; `width`
    queries per row, query w seeing the first last_r − width + 1 + w keys (a causal step behind a ragged past)."""
    gen = torch.Generator().manual_seed(seed)
    capacity = capacity or total + 5
    q = (torch.randn(rows, heads, width, dim, generator=gen) * 2).bfloat16()
    k_slots = (torch.randn(rows, kv_heads, capacity, dim, generator=gen) * 2).bfloat16()
    v_slots = torch.randn(rows, kv_heads, capacity, dim, generator=gen).bfloat16()
    last = torch.randint(width, total + 1, (rows,), generator=gen)  # a ragged batch: each row its own prefix
    visible = last[:, None] - width + 1 + torch.arange(width)[None, :]
    return q, k_slots[:, :, :total], v_slots[:, :, :total], visible


def _mask(visible, total):
    mask = torch.zeros(*visible.shape, total, dtype=torch.float64)
    mask.masked_fill_(torch.arange(total)[None, None, :] >= visible[:, :, None], float("-inf"))
    return mask[:, None]


def _kernel(variant, *args):
    out = kernel.decode_attention_cpu(*args, variant=variant)
    if out is None:
        pytest.skip(f"the {variant} build has no vector paths on this CPU")
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows,total,heads,kv_heads,dim,width", [
    (1, 1, 9, 3, 64, 1),      # one key: the softmax of a single score
    (3, 40, 9, 3, 64, 1),     # SmolLM2's grouping (3 query heads per KV head), its head size
    (3, 40, 9, 3, 64, 8),     # a verify step of γ 7
    (5, 137, 8, 2, 64, 5),    # 4 per group, an odd length
    (2, 33, 4, 4, 32, 2),     # no grouping; a head size the dot product covers but the value path does not
    (4, 20, 6, 3, 48, 3),     # a head size neither vector path covers: the plain loops
])
def test_kernel_is_its_twin(variant, rows, total, heads, kv_heads, dim, width):
    q, k, v, visible = _case(rows, total, heads, kv_heads, dim, width=width)
    scale = dim ** -0.5
    got = _kernel(variant, q, k, v, visible, scale)
    twin = da.decode_attention_torch(q, k, v, visible, scale)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=_mask(visible, total),
                                         scale=scale, enable_gqa=True)
    assert got.shape == twin.shape and got.dtype == torch.bfloat16
    # the same exact products summed in another order: at most one bf16 rounding apart, and as exact
    torch.testing.assert_close(got.float(), twin.float(), atol=2**-7 * ref.abs().max().item(), rtol=0)
    err, twin_err = (got.double() - ref).abs().max(), (twin.double() - ref).abs().max()
    assert err <= twin_err * 1.25 + 1e-6


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_maps_query_groups_and_reads_only_the_visible_keys(variant):
    """Query head h reads KV head h // group; a key past a query's visible prefix is never read, whatever it holds."""
    q, k, v, _ = _case(2, 12, 6, 2, 64, seed=3)
    v[:, 1] += 10  # KV head 1 stands out: query heads 3–5 see it, 0–2 do not
    v[:, :, -1] = 1e4  # past the prefix: must not leak
    out = _kernel(variant, q, k, v, torch.full((2, 1), 11), 0.5).float()
    assert (out[:, 3:].mean() - out[:, :3].mean()) > 5 and out.abs().max() < 100
    everything = _kernel(variant, q, k, v, None, 0.5).float()
    assert everything.abs().max() > 100  # with every key visible the last one does count


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dim", [64, 48])
def test_a_verify_steps_query_gives_the_bits_of_a_decode_step_at_its_position(variant, dim):
    """Query w of a γ 7 verify step (8 queries per row, the window 7 keys longer) equals the single query of a decode
    step at that position, bit for bit: each query reads its own prefix and nothing else, in the same order."""
    q, k, v, visible = _case(3, 60, 9, 3, dim, seed=7, width=8)
    verify = _kernel(variant, q, k, v, visible, 0.125)
    for w in range(8):
        last = int(visible[:, w].max())
        decode = _kernel(variant, q[:, :, w : w + 1], k[:, :, :last], v[:, :, :last], visible[:, w : w + 1], 0.125)
        assert torch.equal(verify[:, :, w : w + 1], decode)


def test_dispatch_runs_the_kernel_unless_told_torch(monkeypatch):
    q, k, v, visible = _case(4, 50, 9, 3, 64, seed=5, width=2)
    native = kernel.decode_attention_cpu(q, k, v, visible, 0.125)
    if native is None:
        pytest.skip("no AVX512-BF16 here: the dispatch runs the twin")
    assert torch.equal(da.decode_attention(q, k, v, visible, 0.125), native)
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    twin = da.decode_attention_torch(q, k, v, visible, 0.125)
    assert torch.equal(da.decode_attention(q, k, v, visible, 0.125), twin)


def test_kernel_covers_only_bf16_on_the_cpu():
    q, k, _, _ = _case(2, 8, 9, 3, 64, width=4)
    assert kernel.covers(q, k)
    assert not kernel.covers(q.half(), k.half()) and not kernel.covers(q.float(), k.float())


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
        q, k, v, visible = _case(2, 8, 9, 3, 64)
        twin = da.decode_attention_torch(q, k, v, visible, 0.125)
        assert torch.equal(da.decode_attention(q, k, v, visible, 0.125), twin)  # the dispatch runs the twin
    finally:
        cpu_build.load.cache_clear()
