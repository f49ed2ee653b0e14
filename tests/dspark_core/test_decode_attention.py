"""A bf16 decode or verify step's attention (`decode_attention.py`): the torch twin (fp32 products) and the dispatch
that runs the C++ kernel where it builds give SDPA's result with grouped heads, each query's visible prefix and row
chunks, at least as exact as SDPA against an fp32 reference, and are taken only where they pay. The kernel against the twin, case by case:
kernel_tests/test_decode_attention_cpu.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from dspark_core import decode_attention as da
from dspark_core.target import TargetModel


def _case(rows: int, total: int, heads: int = 9, kv_heads: int = 3, dim: int = 32, dtype=torch.bfloat16, seed: int = 0,
          width: int = 1):
    """`width` queries per row; query w of row r sees the first seen[r] − width + 1 + w keys, a causal verify step
    behind a ragged past (rows of other lengths), as `decoder_forward` hands it over."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(rows, heads, width, dim, generator=gen) * 2).to(dtype)
    k = (torch.randn(rows, kv_heads, total, dim, generator=gen) * 2).to(dtype)
    v = torch.randn(rows, kv_heads, total, dim, generator=gen).to(dtype)
    last = torch.randint(width, total + 1, (rows,), generator=gen)
    visible = last[:, None] - width + 1 + torch.arange(width)[None, :]  # [R, W]
    return q, k, v, visible


def _mask(visible, total, dtype=torch.float32):
    """The additive mask [R, 1, W, T] SDPA takes for these visible prefixes."""
    mask = torch.zeros(*visible.shape, total, dtype=dtype)
    mask.masked_fill_(torch.arange(total)[None, None, :] >= visible[:, :, None], torch.finfo(dtype).min)
    return mask[:, None]


def _reference(q, k, v, visible, scale):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=_mask(visible, k.shape[2]),
                                          scale=scale, enable_gqa=True)


@pytest.mark.parametrize("impl", ["twin", "dispatch"])
@pytest.mark.parametrize("rows,total,width", [(1, 7, 1), (5, 40, 1), (16, 136, 1), (1, 30, 8), (4, 57, 8)])
def test_products_are_sdpa_and_as_exact(rows, total, width, impl):
    q, k, v, visible = _case(rows, total, width=width)
    mask = _mask(visible, total, torch.bfloat16)
    scale = q.shape[-1] ** -0.5
    got = (da.decode_attention_torch if impl == "twin" else da.decode_attention)(q, k, v, visible, scale)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    ref = _reference(q, k, v, visible, scale)
    assert got.shape == sdpa.shape and got.dtype == torch.bfloat16
    err, sdpa_err = (got.float() - ref).abs().max(), (sdpa.float() - ref).abs().max()
    # fp32 products rounded once to bf16: within one bf16 rounding of the exact value, no worse than SDPA's
    assert err <= ref.abs().max() * 2**-8 and err <= sdpa_err * 1.5 + 1e-6


@pytest.mark.parametrize("impl", ["twin", "dispatch"])
def test_each_kv_head_serves_its_own_query_group(impl):
    """Grouped heads as `enable_gqa`: query head h reads KV head h // (heads / kv_heads), not h % kv_heads."""
    q, k, v, _ = _case(2, 12, heads=6, kv_heads=2)
    v[:, 1] += 10  # KV head 1's values stand out: query heads 3–5 must see them, 0–2 must not
    out = (da.decode_attention_torch if impl == "twin" else da.decode_attention)(q, k, v, None, 0.5).float()
    ref = _reference(q, k, v, torch.full((2, 1), 12), 0.5)
    torch.testing.assert_close(out, ref, atol=0.05, rtol=0.02)
    assert (out[:, 3:].mean() - out[:, :3].mean()) > 5


def test_chunks_of_rows_give_the_unchunked_result(monkeypatch):
    q, k, v, visible = _case(7, 30, width=3)
    whole = da.decode_attention_torch(q, k, v, visible, 0.25)
    monkeypatch.setattr(da, "CHUNK_ELEMENTS", 3 * 30 * 32 * 2)  # two rows per chunk: 4 chunks, the last of one row
    chunked = da.decode_attention_torch(q, k, v, visible, 0.25)
    torch.testing.assert_close(chunked.float(), whole.float(), atol=2**-7, rtol=0)
    assert chunked.shape == whole.shape


def test_taken_only_for_a_reduced_precision_decode_or_verify_step_on_the_cpu():
    cpu = torch.device("cpu")
    assert da.takes(1, torch.bfloat16, cpu) and da.takes(1, torch.float16, cpu)
    assert da.takes(8, torch.bfloat16, cpu) and da.takes(da.MAX_QUERIES, torch.bfloat16, cpu)  # a verify step
    assert not da.takes(1, torch.float32, cpu)  # fp32: SDPA is as fast and the forward stays bit-identical to Hugging Face
    assert not da.takes(da.MAX_QUERIES + 1, torch.bfloat16, cpu)  # a prefill keeps SDPA
    assert not da.takes(1, torch.bfloat16, torch.device("cuda"))


def test_bf16_forward_with_products_keeps_hugging_faces_logits(llama_target, monkeypatch):
    """Through the lean forward: decode and verify steps of a ragged bf16 batch as Hugging Face computes them, to bf16
    rounding; a prefill longer than `MAX_QUERIES` and the forward with the products off never take them."""
    from dspark_core import decoder_forward

    calls = []
    real = decoder_forward.decode_attention
    monkeypatch.setattr(decoder_forward, "decode_attention", lambda *a: calls.append(a[0].shape) or real(*a))
    model = copy.deepcopy(llama_target.model).to(torch.bfloat16)
    lean, sdpa, hf = (TargetModel(model) for _ in range(3))
    for t in (lean, sdpa):
        t.pack_weights = False
    sdpa.decode_products, hf.lean = False, False
    assert lean.lean and lean.decode_products
    prompt = torch.randint(0, lean.vocab_size, (3, 20), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([20, 17, 18])  # ragged: the shorter rows' tails are masked
    caches = [t.new_cache(3, 32) for t in (lean, sdpa, hf)]
    rows = torch.arange(3)
    outs = [t.forward(c, rows, prompt, lengths) for t, c in zip((lean, sdpa, hf), caches)]
    assert not calls
    step = torch.randint(0, lean.vocab_size, (3, 1), generator=torch.Generator().manual_seed(2))
    for _ in range(3):
        outs = [t.forward(c, rows, step, torch.ones(3, dtype=torch.long)) for t, c in zip((lean, sdpa, hf), caches)]
        torch.testing.assert_close(outs[0].logits, outs[2].logits, atol=0.05, rtol=0.02)
        torch.testing.assert_close(outs[1].logits, outs[2].logits, atol=0.05, rtol=0.02)
        step = outs[2].logits[:, -1:].argmax(-1)
    assert len(calls) == 3 * model.config.num_hidden_layers  # every layer of every decode step, the lean one only
    block = torch.cat([step, step, step], 1)  # a verify step: 3 positions per row
    outs = [t.forward(c, rows, block, torch.full((3,), 3)) for t, c in zip((lean, sdpa, hf), caches)]
    torch.testing.assert_close(outs[0].logits, outs[2].logits, atol=0.05, rtol=0.02)
    assert len(calls) == 4 * model.config.num_hidden_layers and calls[-1][2] == 3


def test_path_names_what_a_decode_step_runs(monkeypatch):
    """The name a cell's provenance records: None where this module is not asked (fp32, CUDA), else which
    implementation ran."""
    from dspark_core.kernels.decode_attention_cpu import library

    cpu = torch.device("cpu")
    assert da.path(torch.float32, cpu) is None and da.path(torch.bfloat16, torch.device("cuda")) is None
    assert da.path(torch.bfloat16, cpu, products=False) == "sdpa"
    assert da.path(torch.float16, cpu) == "torch products"  # the kernel is bf16 only
    lib = library()
    native = lib is not None and lib.dspark_decode_attention_native()
    assert da.path(torch.bfloat16, cpu) == ("c++ kernel" if native else "torch products")
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    assert da.path(torch.bfloat16, cpu) == "torch products"
