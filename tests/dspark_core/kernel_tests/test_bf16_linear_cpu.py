"""The C++ bf16 linear (`kernels/bf16_linear.cpp`): within one bf16 rounding of the exact product (and of oneDNN's,
its twin), a row's result the same bits whatever rows run beside it, every tail of N, and the dispatch in
`packed_linear` that packs for it, runs it, and falls back to `F.linear` under DSPARK_KERNELS=torch; through the
lean forward, a verify step's logits equal a plain step's bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from dspark_core import packed_linear as pl
from dspark_core.kernels import bf16_linear_cpu as bl
from dspark_core.target import TargetModel

pytestmark = pytest.mark.skipif(bl.library("portable") is None, reason="no C++ compiler here")
VARIANTS = ["native", "portable"]  # the native build runs the portable loops too where the CPU lacks AVX512-BF16
ULP = 2.0**-8  # bf16's unit roundoff


def _bf16(*shape, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).bfloat16()


def _assert_exact_to_rounding(got, x, w, bias):
    """|got − x·wᵀ − b| within one bf16 rounding of the exact value plus fp32 accumulation over K."""
    xd, wd = x.double().reshape(-1, x.shape[-1]), w.double()
    exact = xd @ wd.T + (0 if bias is None else bias.double())
    magnitude = xd.abs() @ wd.abs().T  # Σ_k |x_k w_k|: what fp32 accumulation errs relative to
    bound = ULP * exact.abs() + x.shape[-1] * 2.0**-23 * magnitude + 1e-30
    err = (got.double().reshape(exact.shape) - exact).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n,k,m", [(576, 576, 1), (960, 576, 8), (100, 38, 7), (17, 2, 13), (64, 1536, 6)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_product_is_exact_to_one_bf16_rounding(variant, n, k, m, with_bias):
    w, x = _bf16(n, k, seed=1, scale=0.05), _bf16(2, m, k, seed=2)
    bias = _bf16(n, seed=3) if with_bias else None
    got = bl.linear(x, bl.pack(w, variant), bias, variant)
    assert got.shape == (2, m, n) and got.dtype == torch.bfloat16
    _assert_exact_to_rounding(got, x, w, bias)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(variant):
    """Every tile size (1–6 rows per pass) and a second pass: row i alone gives the same bits as row i of any batch,
    so a verify step's logits equal a plain step's."""
    w = _bf16(200, 96, seed=4, scale=0.1)
    packed = bl.pack(w, variant)
    x = _bf16(13, 96, seed=5)
    alone = torch.cat([bl.linear(x[i : i + 1], packed, None, variant) for i in range(13)])
    for m in (2, 5, 6, 7, 13):
        assert torch.equal(bl.linear(x[:m], packed, None, variant), alone[:m])


def test_native_and_portable_builds_agree_to_rounding():
    w, x = _bf16(300, 64, seed=6, scale=0.1), _bf16(9, 64, seed=7)
    native, portable = (bl.linear(x, bl.pack(w, v), None, v) for v in VARIANTS)
    torch.testing.assert_close(native.float(), portable.float(), atol=1e-6, rtol=2 * ULP)


def test_strided_rows_and_a_wrong_input_are_handled():
    w = _bf16(48, 32, seed=8)
    packed = bl.pack(w)
    x = _bf16(32, 5, seed=9).T  # [5, 32], non-unit stride over K: made contiguous
    assert torch.equal(bl.linear(x, packed, None), bl.linear(x.contiguous(), packed, None))
    with pytest.raises(ValueError, match="bf16_linear"):
        bl.linear(x.float(), packed, None)
    assert not bl.takes(_bf16(4, 3)) and not bl.takes(w.float()) and bl.takes(w)


def test_packed_linear_dispatches_to_the_kernel_and_back_to_f_linear(monkeypatch):
    monkeypatch.setattr(pl, "MIN_PACKED_ELEMENTS", 0)
    w, x = _bf16(96, 64, seed=10, scale=0.1), _bf16(3, 64, seed=11)
    packed = pl.pack(w)
    if not bl.ready():  # no AVX512-BF16 here (or AMX: oneDNN keeps it): oneDNN's packing, or none
        assert not isinstance(packed, bl.PairPacked)
        pytest.skip("the bf16 kernel does not run on this CPU")
    assert isinstance(packed, bl.PairPacked) and pl.path(torch.bfloat16, torch.device("cpu")) == "c++ kernel"
    assert torch.equal(pl.packed_linear(x, packed, None), bl.linear(x, packed, None))
    assert not isinstance(pl.pack(w, bf16_kernel=False), bl.PairPacked)
    assert pl.path(torch.bfloat16, torch.device("cpu"), bf16_kernel=False) == "onednn"
    monkeypatch.setenv("DSPARK_KERNELS", "torch")  # read at every call: the weight it was packed from, by F.linear
    assert torch.equal(pl.packed_linear(x, packed, None), F.linear(x, w))
    assert not bl.ready() and not isinstance(pl.pack(w), bl.PairPacked)


def test_the_lean_forward_over_the_kernel_keeps_oneDNNs_logits_and_a_verify_step_equals_plain_steps(
        llama_target, monkeypatch):
    """The tiny Llama in bf16 with every projection packed: the kernel's logits within bf16 rounding of oneDNN's,
    and a verify-shaped step (3 positions) gives its first position the bits a one-token step gives (with the
    decode-attention kernel, whose queries are row- and width-independent too)."""
    from dspark_core.kernels import decode_attention_cpu

    if not bl.ready() or not decode_attention_cpu.ready():
        pytest.skip("the bf16 kernels do not run on this CPU")
    monkeypatch.setattr(pl, "MIN_PACKED_ELEMENTS", 0)
    model = copy.deepcopy(llama_target.model).to(torch.bfloat16)
    kernel, onednn = TargetModel(model), TargetModel(copy.deepcopy(model))
    onednn.bf16_linear = False
    prompt = torch.randint(0, kernel.vocab_size, (2, 7), generator=torch.Generator().manual_seed(12))
    rows, lengths = torch.arange(2), torch.tensor([7, 5])
    caches = [t.new_cache(2, 20) for t in (kernel, onednn)]
    outs = [t.forward(c, rows, prompt, lengths) for t, c in zip((kernel, onednn), caches)]
    assert isinstance(kernel._fused.head.weight, bl.PairPacked)
    assert not isinstance(onednn._fused.head.weight, bl.PairPacked)
    for r, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(outs[0].logits[r, :n], outs[1].logits[r, :n], atol=0.05, rtol=0.02)
    step = torch.stack([outs[0].logits[r, n - 1].argmax(-1) for r, n in enumerate(lengths.tolist())])
    cache = caches[0]
    before = cache.lengths[rows].clone()
    verify = kernel.forward(cache, rows, torch.stack([step, step, step], 1), torch.full((2,), 3)).logits
    cache.rollback(rows, before)
    plain = kernel.forward(cache, rows, step[:, None], torch.ones(2, dtype=torch.long)).logits
    assert torch.equal(verify[:, 0], plain[:, 0])


def test_a_small_bf16_weight_is_packed_for_the_kernel_and_stays_on_f_linear_without_it():
    """The size threshold guards oneDNN's fixed call cost only: the kernel takes a draft's 192 × 576 k/v projection
    (and a 1 × 608 confidence projection), while with the kernel off such a weight stays unpacked."""
    if not bl.ready():
        pytest.skip("the bf16 kernel does not run on this CPU")
    for shape in ((192, 576), (1, 608)):
        w = _bf16(*shape, seed=12, scale=0.1)
        assert w.numel() < pl.MIN_PACKED_ELEMENTS
        assert pl.packable(w) and isinstance(pl.pack(w), bl.PairPacked)
        assert not pl.packable(w, bf16_kernel=False) and pl.pack(w, bf16_kernel=False) is None
    assert not pl.packable(_bf16(192, 576).float())  # fp32 keeps the threshold: MKL's call is the cheaper one
    layer = torch.nn.Linear(576, 192, bias=False).bfloat16()
    assert pl.pack_linears(layer) == 1 and type(layer) is pl.PackedLinear
    x = _bf16(7, 576, seed=13)
    with torch.no_grad():
        _assert_exact_to_rounding(layer(x), x, layer.weight, None)
