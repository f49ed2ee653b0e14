"""The lean Llama-family forward (`decoder_forward.py`) gives Hugging Face's numbers, bit for bit where the layout
is the same (every row as long: batch-1 decoding, the path `generate` comparisons take), and its stacked
projections are views that follow the model's weights."""

from __future__ import annotations

import copy

import pytest
import torch

from dspark_core import decoder_forward
from dspark_core.packed_linear import packable
from dspark_core.target import TargetModel


def _pair(model, pack_weights: bool = False) -> tuple[TargetModel, TargetModel]:
    """The lean forward (without prepacked weights unless asked: oneDNN's matmul rounds otherwise) and HF's."""
    lean, hf = TargetModel(model, layer_ids=(-1, 0, 1)), TargetModel(model, layer_ids=(-1, 0, 1))
    lean.pack_weights = pack_weights
    hf.lean = False
    return lean, hf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_same_length_rows_are_bit_identical_to_hugging_face(family, dtype, qwen3_target, llama_target):
    """In bf16 too: the fused RMSNorm rounds where Hugging Face's module does. (A bf16 decode step's attention
    as fp32 products is another rounding, checked in test_decode_attention.py; here SDPA throughout.)"""
    model = (qwen3_target if family == "qwen3" else llama_target).model
    if dtype != torch.float32:
        model = copy.deepcopy(model).to(dtype)
    lean, hf = _pair(model)
    lean.decode_products = False
    assert lean.lean
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, lean.vocab_size, (2, 7), generator=gen)
    caches = [t.new_cache(2, 24) for t in (lean, hf)]
    rows = torch.arange(2)
    outs = [t.forward(c, rows, prompt, torch.tensor([7, 7])) for t, c in zip((lean, hf), caches)]
    for _ in range(4):  # decode steps, then a verify-shaped chunk, a rollback and a decode step after it
        assert torch.equal(outs[0].logits, outs[1].logits) and torch.equal(outs[0].features, outs[1].features)
        step = outs[0].logits[:, -1].argmax(-1, keepdim=True)
        outs = [t.forward(c, rows, step, torch.ones(2, dtype=torch.long)) for t, c in zip((lean, hf), caches)]
    chunk = torch.randint(0, lean.vocab_size, (2, 4), generator=gen)
    outs = [t.forward(c, rows, chunk, torch.tensor([4, 4])) for t, c in zip((lean, hf), caches)]
    assert torch.equal(outs[0].logits, outs[1].logits)
    for c in caches:
        c.rollback(rows, c.lengths - 2)
    outs = [t.forward(c, rows, chunk[:, :1], torch.ones(2, dtype=torch.long)) for t, c in zip((lean, hf), caches)]
    assert torch.equal(outs[0].logits, outs[1].logits) and torch.equal(outs[0].features, outs[1].features)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [14, 14]
    for a, b in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
        assert torch.equal(a[:, :, :14], b[:, :, :14])


def test_logits_at_keeps_the_lean_forward_exact(llama_target):
    lean, hf = _pair(llama_target.model)
    prompt = torch.randint(0, lean.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))
    at = torch.tensor([[5, 2]])
    a = lean.forward(lean.new_cache(1, 8), torch.tensor([0]), prompt, torch.tensor([6]), logits_at=at)
    b = hf.forward(hf.new_cache(1, 8), torch.tensor([0]), prompt, torch.tensor([6]), logits_at=at)
    assert a.logits.shape == (1, 2, lean.vocab_size) and torch.equal(a.logits, b.logits)


@pytest.fixture
def pack_small_weights(monkeypatch):
    """The fixtures' models are small; the size threshold is a speed choice (dspark_core.packed_linear)."""
    monkeypatch.setattr("dspark_core.packed_linear.MIN_PACKED_ELEMENTS", 0)


def test_packed_weights_give_the_same_logits_at_any_batch(llama_target, pack_small_weights):
    """oneDNN's prepacked projections and head: Hugging Face's logits to rounding, and one row's logits and
    features do not depend on the rows beside it. How many positions a row runs at once may change the
    rounding: oneDNN picks its GEMM blocking by row count, and on an AVX512/AMX CPU three positions of six
    differed from the same six run together by 2.4e-7 (on the CPUs earlier CI runs had, they were equal)."""
    lean, hf = _pair(llama_target.model, pack_weights=True)
    prompt = torch.randint(0, lean.vocab_size, (3, 6), generator=torch.Generator().manual_seed(4))
    n = torch.full((3,), 6)
    a = lean.forward(lean.new_cache(3, 8), torch.arange(3), prompt, n)
    assert lean._fused.head.packed and all(p.packed for layer in lean._fused.layers for p in layer)
    b = hf.forward(hf.new_cache(3, 8), torch.arange(3), prompt, n)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-5)
    one = lean.forward(lean.new_cache(1, 8), torch.arange(1), prompt[:1], n[:1])
    assert torch.equal(one.logits[0], a.logits[0]) and torch.equal(one.features[0], a.features[0])
    first = lean.forward(lean.new_cache(1, 8), torch.arange(1), prompt[:1, :3], torch.tensor([3]))
    torch.testing.assert_close(first.logits[0], a.logits[0, :3], atol=1e-6, rtol=1e-6)  # three positions of six


def test_stacked_projections_are_views_and_follow_the_weights(llama_target):
    model = copy.deepcopy(llama_target.model)
    fused = decoder_forward.fused_for(model, None, pack=False)
    assert not fused.head.packed
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    stacks = fused.layers[1]
    assert attn.k_proj.weight.data_ptr() == stacks.qkv.weight[attn.q_proj.weight.shape[0]:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == stacks.gate_up.weight[mlp.gate_proj.weight.shape[0]:].data_ptr()
    assert decoder_forward.fused_for(model, fused, pack=False) is fused
    with torch.no_grad():
        attn.v_proj.weight.add_(1.0)  # an in-place change reaches the stack: it is the same memory
    assert torch.equal(stacks.qkv.weight[-attn.v_proj.weight.shape[0]:], attn.v_proj.weight)
    model.double()  # new tensors: the stack is rebuilt
    again = decoder_forward.fused_for(model, fused, pack=False)
    assert again is not fused and again.layers[0].qkv.weight.dtype == torch.float64


def test_packed_copies_follow_every_weight_they_were_packed_from(llama_target, pack_small_weights):
    model = copy.deepcopy(llama_target.model)
    fused = decoder_forward.fused_for(model, None)
    assert fused.head.packed and fused.layers[0].down.packed
    assert decoder_forward.fused_for(model, fused) is fused
    for weight in (model.lm_head.weight, model.model.layers[1].self_attn.v_proj.weight, model.model.layers[0].mlp.down_proj.weight):
        with torch.no_grad():
            weight.mul_(1.0)  # written in place: a packed copy would be stale, so everything is packed again
        repacked = decoder_forward.fused_for(model, fused)
        assert repacked is not fused
        fused = repacked
    model.double()  # fp64: nothing to pack
    again = decoder_forward.fused_for(model, fused)
    assert not again.head.packed and not again.layers[0].qkv.packed and again.layers[0].qkv.weight.dtype == torch.float64


def test_other_models_keep_hugging_faces_forward(qwen3_target):
    model = copy.deepcopy(qwen3_target.model)
    model.config._attn_implementation = "eager"
    assert not decoder_forward.supports(model) and not TargetModel(model).lean


def test_a_target_loaded_under_inference_mode_runs_the_lean_forward():
    """The GPU check builds its target inside `torch.inference_mode`: inference tensors keep no version
    counter, and the packed-head key must not ask them for one."""
    from tests.conftest import tiny_llama

    with torch.inference_mode():
        model = tiny_llama()
        target = TargetModel(model)
        prompt = torch.randint(0, target.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
        first = target.forward(target.new_cache(2, 8), torch.arange(2), prompt, torch.full((2,), 5))
        fused = target._fused
        again = target.forward(target.new_cache(2, 8), torch.arange(2), prompt, torch.full((2,), 5))
    assert target._fused is fused  # reused, not rebuilt each step
    assert torch.equal(first.logits, again.logits)


@pytest.mark.skipif(not packable(torch.zeros(1 << 17, dtype=torch.bfloat16)), reason="no native bf16 oneDNN linear here")
def test_packed_bf16_weights_give_the_same_logits_at_any_batch(llama_target, pack_small_weights):
    """On a CPU with native bf16 the bf16 projections and head are prepacked as well (1.4–1.6× faster products,
    dspark_core.packed_linear): Hugging Face's logits to bf16 rounding, and a row's logits independent of the rows
    beside it."""
    model = copy.deepcopy(llama_target.model).to(torch.bfloat16)
    lean, hf = _pair(model, pack_weights=True)
    prompt = torch.randint(0, lean.vocab_size, (3, 6), generator=torch.Generator().manual_seed(4))
    n = torch.full((3,), 6)
    a = lean.forward(lean.new_cache(3, 8), torch.arange(3), prompt, n)
    assert lean._fused.head.packed and all(p.packed for layer in lean._fused.layers for p in layer)
    b = hf.forward(hf.new_cache(3, 8), torch.arange(3), prompt, n)
    torch.testing.assert_close(a.logits.float(), b.logits.float(), atol=0.05, rtol=0.02)
    one = lean.forward(lean.new_cache(1, 8), torch.arange(1), prompt[:1], n[:1])
    assert torch.equal(one.logits[0], a.logits[0]) and torch.equal(one.features[0], a.features[0])
