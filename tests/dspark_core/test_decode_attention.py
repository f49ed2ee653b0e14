"""A bf16 decode step's attention (`decode_attention.py`): the torch twin (fp32 products) and the dispatch that runs
the C++ kernel where it builds give SDPA's result with grouped heads, masks and row chunks, at least as exact as
SDPA against an fp32 reference, and are taken only where they pay. The kernel against the twin, case by case:
kernel_tests/test_decode_attention_cpu.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from dspark_core import decode_attention as da
from dspark_core.target import TargetModel


def _case(rows: int, total: int, heads: int = 9, kv_heads: int = 3, dim: int = 32, dtype=torch.bfloat16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(rows, heads, 1, dim, generator=gen) * 2).to(dtype)
    k = (torch.randn(rows, kv_heads, total, dim, generator=gen) * 2).to(dtype)
    v = torch.randn(rows, kv_heads, total, dim, generator=gen).to(dtype)
    # each row sees its own prefix (a ragged batch): the rest hidden as `decoder_forward.additive_mask` hides it
    seen = torch.randint(1, total + 1, (rows,), generator=gen)
    mask = torch.zeros(rows, 1, 1, total, dtype=dtype)
    mask.masked_fill_(torch.arange(total)[None, None, None, :] >= seen[:, None, None, None], torch.finfo(dtype).min)
    return q, k, v, mask


def _reference(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(), scale=scale,
                                          enable_gqa=True)


@pytest.mark.parametrize("impl", ["twin", "dispatch"])
@pytest.mark.parametrize("rows,total", [(1, 7), (5, 40), (16, 136)])
def test_products_are_sdpa_and_as_exact(rows, total, impl):
    q, k, v, mask = _case(rows, total)
    scale = q.shape[-1] ** -0.5
    got = (da.decode_attention_torch if impl == "twin" else da.decode_attention)(q, k, v, mask, scale)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    ref = _reference(q, k, v, mask, scale)
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
    ref = _reference(q, k, v, torch.zeros(2, 1, 1, 12), 0.5)
    torch.testing.assert_close(out, ref, atol=0.05, rtol=0.02)
    assert (out[:, 3:].mean() - out[:, :3].mean()) > 5


def test_chunks_of_rows_give_the_unchunked_result(monkeypatch):
    q, k, v, mask = _case(7, 30)
    whole = da.decode_attention_torch(q, k, v, mask, 0.25)
    monkeypatch.setattr(da, "CHUNK_ELEMENTS", 3 * 30 * 32 * 2)  # two rows per chunk: 4 chunks, the last of one row
    chunked = da.decode_attention_torch(q, k, v, mask, 0.25)
    torch.testing.assert_close(chunked.float(), whole.float(), atol=2**-7, rtol=0)
    assert chunked.shape == whole.shape


def test_taken_only_for_a_reduced_precision_decode_step_on_the_cpu():
    one = torch.zeros(2, 9, 1, 64, dtype=torch.bfloat16)
    assert da.takes(one) and da.takes(one.half())
    assert not da.takes(one.float())  # fp32: SDPA is as fast and the forward stays bit-identical to Hugging Face
    assert not da.takes(torch.zeros(2, 9, 8, 64, dtype=torch.bfloat16))  # a verify step keeps SDPA


def test_bf16_forward_with_products_keeps_hugging_faces_logits(llama_target, monkeypatch):
    """Through the lean forward: decode steps of a ragged bf16 batch as Hugging Face computes them, to bf16
    rounding; the prefill (several queries per row) and the forward with the products off never take them."""
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
    prompt = torch.randint(0, lean.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([9, 4, 6])  # ragged: the shorter rows' tails are masked
    caches = [t.new_cache(3, 16) for t in (lean, sdpa, hf)]
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
