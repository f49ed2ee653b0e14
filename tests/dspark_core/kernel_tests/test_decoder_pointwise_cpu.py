"""The C++ elementwise steps of a bf16 decoder layer (`kernels/decoder_pointwise.cpp`) against their eager twins in
`decoder_forward` (Hugging Face's roundings): the residual add and the rotary bit for bit, RMSNorm and SiLU·up
within one bf16 rounding; and the lean forward that calls them against the one that does not."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from dspark_core import decoder_forward as df
from dspark_core.kernels import decoder_pointwise_cpu as pw
from dspark_core.target import TargetModel

pytestmark = pytest.mark.skipif(pw.library("portable") is None, reason="no C++ compiler here")
VARIANTS = ["native", "portable"]
ULP = 2**-7  # one bf16 rounding, relative


def _bf16(*shape, seed=0, scale=2.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


class _Norm(torch.nn.Module):  # what `_rms_norm` reads of a Llama RMSNorm
    def __init__(self, weight, eps):
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(weight), eps


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(1, 1, 576), (16, 1, 576), (3, 40, 64)])
def test_add_rms_norm_is_the_eager_add_and_norm(variant, shape):
    x, delta = _bf16(*shape, seed=1), _bf16(*shape, seed=2, scale=0.5)
    weight = (torch.rand(shape[-1], generator=torch.Generator().manual_seed(3)) + 0.5).bfloat16()
    norm = _Norm(weight, 1e-5)
    total, normed = pw.add_rms_norm(x, delta, weight, 1e-5, variant=variant)
    assert torch.equal(total, x + delta)  # the residual add: one rounding, as torch's
    eager = df._rms_norm(norm, x + delta)
    torch.testing.assert_close(normed.float(), eager.float(), atol=0, rtol=ULP)
    assert (normed != eager).float().mean() <= 1e-3  # the mean of squares summed in another order: rarely a rounding
    same, alone = pw.add_rms_norm(x, None, weight, 1e-5, variant=variant)
    assert same is x
    torch.testing.assert_close(alone.float(), df._rms_norm(norm, x).float(), atol=0, rtol=ULP)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("rows,steps,heads,kv_heads,dim", [(1, 1, 9, 3, 64), (2, 5, 4, 2, 32), (16, 1, 9, 3, 64)])
def test_rope_is_hugging_faces_rotary_bit_for_bit(variant, rows, steps, heads, kv_heads, dim):
    qkv = _bf16(rows, steps, heads + 2 * kv_heads, dim, seed=4)
    angles = torch.rand(rows, steps, dim, generator=torch.Generator().manual_seed(5)) * 6
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    got = pw.rope(qkv, heads + kv_heads, cos, sin, variant=variant)
    eager = df._rope(qkv[:, :, : heads + kv_heads].transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1))
    assert got.shape == (rows, heads + kv_heads, steps, dim) and torch.equal(got, eager)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(1, 1, 3072), (16, 1, 3072), (2, 30, 256)])
def test_silu_mul_is_the_eager_mlp_activation(variant, shape):
    gate_up = _bf16(*shape, seed=6)
    gate, up = gate_up.chunk(2, -1)
    eager = F.silu(gate) * up
    got = pw.silu_mul(gate_up, variant=variant)
    assert got.shape == eager.shape
    # another exp, an ulp apart in fp32: rarely silu's bf16 rounding, then the product's (two roundings at most)
    torch.testing.assert_close(got.float(), eager.float(), atol=1e-6, rtol=2 * ULP)
    assert (got != eager).float().mean() <= 1e-3


def test_bf16_forward_with_the_kernels_keeps_the_eager_forwards_tokens(llama_target, monkeypatch):
    """Through the lean forward: every layer's elementwise steps go through the kernels (a spy counts them), the
    logits stay within bf16 rounding of the eager lean forward's and of Hugging Face's, and DSPARK_KERNELS=torch
    turns them off."""
    calls = {"norm": 0, "rope": 0, "act": 0}
    real = (pw.add_rms_norm, pw.rope, pw.silu_mul)
    monkeypatch.setattr(pw, "add_rms_norm", lambda *a, **k: calls.__setitem__("norm", calls["norm"] + 1) or real[0](*a, **k))
    monkeypatch.setattr(pw, "rope", lambda *a, **k: calls.__setitem__("rope", calls["rope"] + 1) or real[1](*a, **k))
    monkeypatch.setattr(pw, "silu_mul", lambda *a, **k: calls.__setitem__("act", calls["act"] + 1) or real[2](*a, **k))
    model = copy.deepcopy(llama_target.model).to(torch.bfloat16)
    fast, eager, hf = (TargetModel(model) for _ in range(3))
    eager.fused_pointwise, hf.lean = False, False
    prompt = torch.randint(0, fast.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    lengths, rows = torch.tensor([9, 4, 6]), torch.arange(3)
    caches = [t.new_cache(3, 16) for t in (fast, eager, hf)]
    outs = [t.forward(c, rows, prompt, lengths) for t, c in zip((fast, eager, hf), caches)]
    layers = model.config.num_hidden_layers
    assert calls == {"norm": 2 * layers + 1, "rope": layers, "act": layers}
    for r, n in enumerate(lengths.tolist()):  # a ragged prefill: padded positions hold garbage, compared nowhere
        torch.testing.assert_close(outs[0].logits[r, :n], outs[1].logits[r, :n], atol=0.05, rtol=0.02)
        torch.testing.assert_close(outs[0].logits[r, :n], outs[2].logits[r, :n], atol=0.05, rtol=0.02)
    step = torch.stack([outs[1].logits[r, n - 1].argmax(-1) for r, n in enumerate(lengths.tolist())])[:, None]
    for _ in range(3):
        outs = [t.forward(c, rows, step, torch.ones(3, dtype=torch.long)) for t, c in zip((fast, eager, hf), caches)]
        torch.testing.assert_close(outs[0].logits, outs[1].logits, atol=0.05, rtol=0.02)
        torch.testing.assert_close(outs[0].logits, outs[2].logits, atol=0.05, rtol=0.02)
        step = outs[1].logits[:, -1:].argmax(-1)
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    before = dict(calls)
    fast.forward(caches[0], rows, step, torch.ones(3, dtype=torch.long))
    assert calls == before


def test_pointwise_fits_only_bf16_llama_family_models_on_the_cpu(llama_target, qwen3_target, monkeypatch):
    cpu = torch.device("cpu")
    llama = copy.deepcopy(llama_target.model).to(torch.bfloat16)
    assert df.pointwise_fits(llama, torch.bfloat16, cpu)
    assert not df.pointwise_fits(llama_target.model, torch.float32, cpu)  # fp32 stays bit-identical, eager
    qwen3 = copy.deepcopy(qwen3_target.model).to(torch.bfloat16)
    assert not df.pointwise_fits(qwen3, torch.bfloat16, cpu)  # per-head q/k norms: not what the kernels do
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    assert not df.pointwise_fits(llama, torch.bfloat16, cpu)
