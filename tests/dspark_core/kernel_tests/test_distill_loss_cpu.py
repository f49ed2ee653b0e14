"""The C++ distillation terms (`kernels/distill_loss.cpp`) against their twin in `losses.draft_loss`: the same
cross-entropy, L1 distance, α and total loss, and the same gradient, within fp32 summation order."""

from __future__ import annotations

import pytest
import torch

from dspark_core.kernels import distill_loss_cpu as dl
from dspark_core.losses import draft_loss

pytestmark = pytest.mark.skipif(dl.library("portable") is None, reason="no C++ compiler here")
VARIANTS = ["native", "portable"]


def _case(blocks=6, positions=7, vocab=300, seed=0, target_dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(blocks, positions, vocab, generator=g) * 3
    # the target's log-probs at the draft's tokens, normalised over a larger vocabulary: Σ p_t < 1
    full = torch.log_softmax(torch.randn(blocks, positions, vocab + 40, generator=g) * 3, -1)
    target = full[..., :vocab].to(target_dtype)
    labels = torch.randint(0, vocab, (blocks, positions), generator=g)
    labels[0, 1] = labels[-1, -1] = -1  # outside the draft vocabulary
    valid = torch.ones(blocks, positions, dtype=torch.bool)
    valid[-1, 4:] = False  # past a sequence's end
    confidence = torch.randn(blocks, positions, generator=g)
    return logits, target, labels, valid, confidence


def _loss_and_grads(monkeypatch, mode, logits, target, labels, valid, confidence, **kw):
    monkeypatch.setenv("DSPARK_KERNELS", mode)
    z = logits.clone().requires_grad_()
    c = confidence.clone().requires_grad_()
    loss = draft_loss(z, labels, valid, target, c, target_log_probs=True, **kw)
    loss.total.backward()
    return loss, z.grad, c.grad


@pytest.mark.parametrize("target_dtype", [torch.bfloat16, torch.float32])
def test_the_loss_and_its_gradient_are_the_twins(monkeypatch, target_dtype):
    case = _case(target_dtype=target_dtype)
    assert dl.ready(case[0], case[1])
    fused, gz, gc = _loss_and_grads(monkeypatch, "auto", *case)
    twin, tz, tc = _loss_and_grads(monkeypatch, "torch", *case)
    for name in ("ce", "l1", "bce", "acceptance", "confidence"):
        assert getattr(fused, name) == pytest.approx(getattr(twin, name), rel=1e-5, abs=1e-6), name
    assert float(fused.total.detach()) == pytest.approx(float(twin.total.detach()), rel=1e-5)
    assert fused.num_positions == twin.num_positions
    torch.testing.assert_close(gz, tz, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(gc, tc, rtol=1e-5, atol=1e-7)
    assert float(gz[-1, 5].abs().max()) == 0.0  # an invalid position has no gradient


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_terms_per_position(variant):
    logits, target, labels, _, _ = _case(blocks=3, positions=4, vocab=4096, seed=2)
    z, t, y = logits.reshape(-1, 4096), target.reshape(-1, 4096), labels.reshape(-1)
    ce, l1 = dl.distill_terms(z, t, y, variant=variant)
    p, pt = torch.softmax(z, -1), t.float().exp()
    expected_ce = torch.where(y >= 0, torch.logsumexp(z, -1) - z.gather(1, y.clamp(min=0)[:, None])[:, 0], 0.0)
    expected_l1 = (p - pt).abs().sum(-1) + (1 - pt.sum(-1)).clamp(min=0)
    torch.testing.assert_close(ce, expected_ce, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(l1, expected_l1, rtol=1e-5, atol=1e-6)
    assert float(ce[1]) == 0.0 and float(ce[0]) > 0 and float(l1.min()) > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_terms_gradient_alone(variant):
    """The gradient of a weighted sum of CE alone and of L1 alone, each against autograd through the twin's ops."""
    logits, target, labels, _, _ = _case(blocks=2, positions=3, vocab=512, seed=3, target_dtype=torch.float32)
    z0, t, y = logits.reshape(-1, 512), target.reshape(-1, 512), labels.reshape(-1)
    weights = torch.rand(z0.shape[0], generator=torch.Generator().manual_seed(4))
    for term in (0, 1):
        z = z0.clone().requires_grad_()
        (dl.distill_terms(z, t, y, variant=variant)[term] * weights).sum().backward()
        ref = z0.clone().requires_grad_()
        p = torch.softmax(ref, -1)
        if term == 0:
            value = torch.where(y >= 0, torch.logsumexp(ref, -1) - ref.gather(1, y.clamp(min=0)[:, None])[:, 0], 0.0)
        else:
            value = (p - t.exp()).abs().sum(-1)
        (value * weights).sum().backward()
        torch.testing.assert_close(z.grad, ref.grad, rtol=1e-4, atol=1e-7)


def test_what_the_kernel_does_not_take_runs_the_twin(monkeypatch):
    logits, target, *_ = _case()
    assert not dl.ready(logits.double(), target)
    assert not dl.ready(logits, target.half())
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    assert not dl.ready(logits, target)
