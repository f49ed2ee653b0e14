"""kernels/markov_draft.py against its twin `DSparkModel.sample_block`: the Markov head's draft sampling.

Token ids equal exactly; draft probabilities and confidence logits to float rounding. The bf16 cases use
weights on a coarse grid (multiples of 1/16), so every matmul is exact in fp32 whatever its summation order
and the kernel's bf16 roundings of the bias and the confidence logit must match torch's bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.dspark import DSparkModel
from dspark_core.drafters.dspark import draft_block

from .conftest import DEVICE

pytest.importorskip("triton")

TEMPERATURES = [1.0, 0.0, 0.6, 1.3, 0.0, 0.8, 2.0]  # greedy rows mixed in


def _model(vocab: int, head: str, dtype: torch.dtype, rank: int = 24, hidden: int = 32, seed: int = 0,
           draft_vocab: int | None = None, w1_rows: str = "target") -> DSparkModel:
    torch.manual_seed(seed)
    method = "dspark" if head != "none" else "dflash"
    config = DraftConfig(
        method=method, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=1,
        num_attention_heads=4, num_kv_heads=2, head_dim=8, target_hidden_size=hidden, target_layer_ids=(0,),
        mask_token_id=vocab - 1, head=head, markov_rank=rank, confidence_head=head != "none",
        draft_vocab_size=draft_vocab, markov_w1_rows=w1_rows,
    )
    model = DSparkModel(config).eval()
    if draft_vocab is not None:  # a fixed random choice of the target's tokens
        model.set_draft_vocabulary(torch.randperm(vocab, generator=torch.Generator().manual_seed(seed + 7))[:draft_vocab])
    with torch.no_grad():
        for p in model.parameters():
            if dtype == torch.bfloat16:  # a grid on which fp32 sums are exact
                p.copy_((torch.randn_like(p) * 8).round().clamp(-24, 24) / 16)
            else:
                p.normal_(0, 1)
        model.lm_head.weight.mul_(0.5)
    return model.to(device=DEVICE, dtype=dtype)


def _inputs(model: DSparkModel, num_rows: int, n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    c = model.config
    h = torch.randn(num_rows, n, c.hidden_size, generator=g)
    if model.lm_head.weight.dtype == torch.bfloat16:
        h = (h * 4).round().clamp(-8, 8) / 8
    anchors = torch.randint(0, c.vocab_size, (num_rows,), generator=g)
    temps = torch.tensor([TEMPERATURES[i % len(TEMPERATURES)] for i in range(num_rows)])
    uniforms = torch.rand(num_rows, n, generator=g)
    dev = dict(device=DEVICE)
    return h.to(dtype=model.lm_head.weight.dtype, **dev), anchors.to(**dev), temps.to(**dev), uniforms.to(**dev)


def _check(model: DSparkModel, num_rows: int, n: int, seed: int = 1) -> None:
    h, anchors, temps, uniforms = _inputs(model, num_rows, n, seed)
    with torch.no_grad():
        tokens, probs, confs = draft_block(model, h, anchors, temps, uniforms)
        ref_tokens, ref_probs, ref_confs = model.sample_block(h, anchors, temps, uniforms)
    assert tokens.dtype == torch.long and tokens.shape == (num_rows, n)
    assert torch.equal(tokens, ref_tokens)
    assert probs.dtype == torch.float32 and probs.shape == ref_probs.shape
    torch.testing.assert_close(probs, ref_probs, rtol=1e-5, atol=1e-6)
    if ref_confs is None:
        assert confs is None
    else:
        torch.testing.assert_close(confs, ref_confs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_rows, n, vocab", [(1, 1, 64), (3, 3, 200), (2, 7, 128), (1, 7, 256), (5, 2, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_markov_head_matches_twin(triton_kernels, num_rows: int, n: int, vocab: int, dtype: torch.dtype):
    _check(_model(vocab, "markov", dtype), num_rows, n)


@pytest.mark.parametrize("num_rows, n, vocab", [(1, 3, 64), (4, 7, 200)])
def test_no_head_dflash_matches_twin(triton_kernels, num_rows: int, n: int, vocab: int):
    _check(_model(vocab, "none", torch.float32), num_rows, n)


def test_rank_wider_than_one_dot_block(triton_kernels):
    """rank 80: the bias sums over several BLOCK_K chunks, and the confidence over several hidden blocks."""
    _check(_model(64, "markov", torch.float32, rank=80, hidden=48), 3, 3)


def test_samples_follow_the_sequential_dependency(triton_kernels):
    """A sharp bigram head: x_k is decided by x_{k−1} (read on device from the previous launch)."""
    vocab = 64
    model = _model(vocab, "markov", torch.float32, rank=vocab)
    shift = torch.randperm(vocab, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.markov_head.markov_w1.weight.copy_(torch.eye(vocab))
        model.markov_head.markov_w2.weight.zero_()
        model.markov_head.markov_w2.weight[shift, torch.arange(vocab)] = 40.0
    h, anchors, _, uniforms = _inputs(model, 4, 5)
    temps = torch.ones(4, device=DEVICE)
    with torch.no_grad():
        tokens, _, _ = draft_block(model, h, anchors, temps, uniforms)
    expected, prev = [], anchors.cpu()
    for _ in range(5):
        prev = shift[prev]
        expected.append(prev)
    assert torch.equal(tokens.cpu(), torch.stack(expected, dim=1))


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_other_heads_run_the_twin(triton_kernels, monkeypatch, head: str):
    import dspark_core.kernels.markov_draft as kernel_module

    monkeypatch.setattr(kernel_module, "markov_draft", lambda *a, **k: pytest.fail("the kernel has no such head"))
    model = _model(64, head, torch.float32)
    _check(model, 2, 3)


@pytest.mark.parametrize("head", ["markov", "none"])
@pytest.mark.parametrize("num_rows, n, vocab, draft_vocab", [(3, 7, 200, 72), (2, 3, 96, 40)])
def test_reduced_draft_vocabulary_matches_twin(triton_kernels, head: str, num_rows: int, n: int, vocab: int,
                                               draft_vocab: int):
    """The kernels sample draft indices; W1 and the confidence head read x_{k−1} as a target id, and the
    tokens and probabilities come back in the target's vocabulary, exactly as the twin's."""
    model = _model(vocab, head, torch.float32, draft_vocab=draft_vocab)
    _check(model, num_rows, n)
    h, anchors, temps, uniforms = _inputs(model, num_rows, n)
    with torch.no_grad():
        tokens, probs, _ = draft_block(model, h, anchors, temps, uniforms)
    assert probs.shape == (num_rows, n, vocab)
    assert set(tokens.flatten().tolist()) <= set(model.draft_to_target.tolist())


@pytest.mark.parametrize("num_rows, n, vocab, draft_vocab", [(3, 7, 200, 72), (2, 3, 96, 40)])
def test_w1_over_the_draft_vocabulary_matches_twin(triton_kernels, num_rows: int, n: int, vocab: int, draft_vocab: int):
    """W1 indexed by draft index and a shared row (`markov_w1_rows` "draft"): the anchor reads its mapped row
    (most random anchors fall outside the draft vocabulary: the shared row), later positions the sampled index."""
    model = _model(vocab, "markov", torch.float32, draft_vocab=draft_vocab, w1_rows="draft")
    assert model.markov_head.markov_w1.weight.shape[0] == draft_vocab + 1
    _check(model, num_rows, n)
