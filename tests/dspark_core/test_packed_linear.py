"""`PackedLinear`: an `nn.Linear` over oneDNN's prepacked weight without gradients, the same numbers to
rounding, a row's result independent of the rows beside it, repacked when its weight changes, and plain
`F.linear` wherever autograd needs it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dspark_core.packed_linear import PackedLinear, pack_linears, packable

pytestmark = pytest.mark.skipif(not packable(torch.zeros(1 << 17)), reason="no oneDNN fp32 linear on this build")


@pytest.fixture(autouse=True)
def pack_small_weights(monkeypatch):
    """These tests' layers are small; the size threshold is a speed choice, not part of what is tested here."""
    monkeypatch.setattr("dspark_core.packed_linear.MIN_PACKED_ELEMENTS", 0)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 96, bias=False))


def test_packed_linears_give_the_same_outputs_row_for_row():
    plain, model = _model(), _model()
    assert pack_linears(model) == 2 and all(isinstance(m, PackedLinear) for m in (model[0], model[2]))
    assert model.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(8, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        many, ref = model(x), plain(x)
        one = model(x[3:4])
    torch.testing.assert_close(many, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(one[0], many[3])  # a verify step's row equals a plain step's


def test_a_changed_weight_is_packed_again_and_autograd_takes_the_plain_path():
    model = _model()
    pack_linears(model)
    x = torch.randn(2, 24)
    with torch.no_grad():
        before = model(x)
        model[2].weight.mul_(2.0)  # in place: the packed copy is stale
        after = model(x)
    torch.testing.assert_close(after, 2 * before, atol=1e-5, rtol=1e-5)
    loss = model(x.requires_grad_()).sum()  # gradients: F.linear, so backward works
    loss.backward()
    assert model[0].weight.grad is not None and x.grad is not None


def test_only_packable_linears_are_swapped(monkeypatch):
    model = _model().double()
    assert pack_linears(model) == 0 and type(model[0]) is nn.Linear
    monkeypatch.setattr("dspark_core.packed_linear.MIN_PACKED_ELEMENTS", 1 << 17)
    assert not packable(torch.zeros(128, 768)) and packable(torch.zeros(576, 576))  # the embedded default's stay on MKL
    assert pack_linears(_model()) == 0
