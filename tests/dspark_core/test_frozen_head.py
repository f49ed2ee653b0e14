"""The frozen LM head in bf16 while a draft trains: its products, its gradient, and the module swapped back."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dspark_core.frozen_head import Bf16FrozenLinear, lm_head_dtype
from dspark_core.training import TrainConfig, train_draft
from fixtures_training import new_draft, toy_cache


def _frozen_linear(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(48, 96, bias=False)
    linear.weight.requires_grad_(False)
    return linear


def test_the_product_and_its_gradient_are_bf16_operands_with_fp32_results():
    linear = _frozen_linear()
    head = Bf16FrozenLinear(linear)
    x = torch.randn(5, 3, 48, requires_grad=True)
    out = head(x)
    assert out.dtype == torch.float32 and out.shape == (5, 3, 96)
    w = linear.weight.to(torch.bfloat16)
    assert torch.equal(out, F.linear(x.detach().to(torch.bfloat16), w).float())
    grad = torch.randn(5, 3, 96)
    out.backward(grad)
    assert x.grad is not None and x.grad.dtype == torch.float32
    assert torch.equal(x.grad, (grad.to(torch.bfloat16) @ w).float())
    exact = grad @ linear.weight  # the fp32 gradient it stands for, within bf16's rounding
    assert torch.allclose(x.grad, exact, rtol=0.02, atol=0.02 * float(exact.abs().max()))
    assert not [p for p in head.parameters()]  # nothing to train, nothing saved with the model
    assert "weight" not in head.state_dict()


def test_only_a_frozen_bias_free_linear_is_taken():
    with pytest.raises(ValueError, match="frozen"):
        Bf16FrozenLinear(nn.Linear(4, 4, bias=False))
    biased = nn.Linear(4, 4)
    biased.requires_grad_(False)
    with pytest.raises(ValueError, match="bias-free"):
        Bf16FrozenLinear(biased)


def test_the_models_own_head_is_back_after_the_block_whatever_happens():
    model = new_draft("dspark")
    head = model.lm_head
    with lm_head_dtype(model, "bfloat16"):
        assert isinstance(model.lm_head, Bf16FrozenLinear)
    assert model.lm_head is head
    with pytest.raises(RuntimeError, match="inside"), lm_head_dtype(model, "bfloat16"):
        raise RuntimeError("inside")
    assert model.lm_head is head
    with lm_head_dtype(model, "float32"):
        assert model.lm_head is head
    with pytest.raises(ValueError, match="valid are float32, bfloat16"), lm_head_dtype(model, "float16"):
        pass


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_a_draft_trains_as_well_with_its_head_in_bf16(method):
    """Same seed, data and steps: the bf16 head's run ends within a few percent of the fp32 run's loss, and both
    fall; the frozen head itself is untouched."""
    config = TrainConfig(steps=40, lr=6e-3, batch_size=8, anchors_per_sequence=16, seed=3)
    runs = {}
    for dtype in ("float32", "bfloat16"):
        model = new_draft(method, "markov" if method == "dspark" else "none")
        head = model.lm_head.weight.clone()
        result = train_draft(toy_cache(), model, TrainConfig(**{**config.__dict__, "lm_head_dtype": dtype}))
        assert torch.equal(model.lm_head.weight, head) and isinstance(model.lm_head, nn.Linear)
        assert all(math.isfinite(x) for x in result.losses)
        runs[dtype] = result.losses
    for losses in runs.values():
        assert sum(losses[-5:]) < 0.85 * sum(losses[:5])
    assert runs["bfloat16"] != runs["float32"]  # the head really ran in bf16
    assert sum(runs["bfloat16"][-5:]) == pytest.approx(sum(runs["float32"][-5:]), rel=0.05)
