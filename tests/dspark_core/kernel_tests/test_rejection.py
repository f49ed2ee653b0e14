"""kernels/rejection.py against its twin `verification.rejection_sample`: accepted counts and the
recovered/bonus token ids must be equal, over flattened variable-length batches (lengths 0 … γ, batch
of 1 included), with and without draft distributions, sampled and greedy rows mixed."""

from __future__ import annotations

import pytest
import torch

from dspark_core import verification
from dspark_core.verification import dispatch_rejection_sample
from dspark_core.distributions import logits_to_probs, sample_from_probs

from .conftest import DEVICE

pytest.importorskip("triton")


def _batch(num_drafts: list[int], vocab: int, temps: list[float], closeness: float, seed: int, dtype=torch.float32):
    """A flattened batch whose drafts come from a distribution `closeness`-near the target's (1: equal)."""
    g = torch.Generator().manual_seed(seed)
    num_requests = len(num_drafts)
    n = torch.tensor(num_drafts)
    cu = torch.zeros(num_requests + 1, dtype=torch.long)
    cu[1:] = n.cumsum(0)
    total = int(n.sum())
    target_logits = (torch.randn(total + num_requests, vocab, generator=g) * 2.5).to(dtype)
    rows = torch.cat([torch.arange(int(cu[r]) + r, int(cu[r + 1]) + r) for r in range(num_requests)]).long()
    draft_t = torch.repeat_interleave(torch.tensor(temps), n)
    noise = torch.randn(total, vocab, generator=g) * 2.5
    draft_logits = closeness * target_logits[rows].float() + (1 - closeness) * noise
    draft_probs = logits_to_probs(draft_logits, draft_t)
    draft_ids = sample_from_probs(draft_probs, torch.rand(total, generator=g))
    args = dict(
        target_logits=target_logits, draft_token_ids=draft_ids, cu_num_drafts=cu, draft_probs=draft_probs,
        temperatures=torch.tensor(temps), accept_uniforms=torch.rand(total, generator=g),
        sample_uniforms=torch.rand(num_requests, generator=g),
    )
    return {k: v.to(DEVICE) for k, v in args.items()}


def _assert_same(args: dict, **kw) -> verification.VerifyOutput:
    out = dispatch_rejection_sample(**args, **kw)
    ref = verification.rejection_sample(**args)
    assert out.num_accepted.dtype == torch.long and out.next_token_ids.dtype == torch.long
    assert out.num_accepted.tolist() == ref.num_accepted.tolist()
    assert out.next_token_ids.tolist() == ref.next_token_ids.tolist()
    return ref


CASES = {  # id: (drafts per request, vocab, temperatures)
    "one-request-gamma1": ([1], 64, [1.0]),
    "one-request-empty": ([0], 64, [0.8]),
    "mixed-lengths": ([3, 0, 7, 1], 200, [1.0, 0.7, 1.3, 0.5]),
    "all-max-gamma7": ([7, 7], 128, [1.0, 0.9]),
    "greedy-rows-mixed-in": ([2, 5, 0, 3], 256, [0.0, 1.0, 0.0, 0.6]),
}


@pytest.mark.parametrize("closeness", [1.0, 0.6, 0.0], ids=["draft=target", "near", "far"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_twin(triton_kernels, case: str, closeness: float):
    num_drafts, vocab, temps = CASES[case]
    rejected = []
    for seed in range(2):
        ref = _assert_same(_batch(num_drafts, vocab, temps, closeness, seed))
        rejected += [a < n for a, n, t in zip(ref.num_accepted.tolist(), num_drafts, temps) if n > 0 and t > 0]
    if closeness == 1.0:  # p_d = p_t: every draft accepted, every request takes the bonus path
        assert not any(rejected)
    elif closeness == 0.0:
        assert all(rejected), "independent drafts over a sharp target should all be rejected somewhere"


@pytest.mark.parametrize("case", ["mixed-lengths", "greedy-rows-mixed-in"])
def test_one_hot_drafts(triton_kernels, case: str):
    """draft_probs=None: deterministic drafts (p_d one-hot), the residual is p_t minus the draft token."""
    num_drafts, vocab, temps = CASES[case]
    for seed in range(2):
        args = _batch(num_drafts, vocab, temps, 0.6, seed)
        args["draft_probs"] = None
        _assert_same(args)


def test_bf16_target_logits(triton_kernels):
    num_drafts, vocab, temps = CASES["mixed-lengths"]
    _assert_same(_batch(num_drafts, vocab, temps, 0.6, 0, dtype=torch.bfloat16))


def test_residual_without_mass_falls_back_to_the_target(triton_kernels, monkeypatch):
    """RESIDUAL_EPS is read from verification at every call: with eps 2 every recovery samples p_t (the
    losslessness tests' "broken verifier" switch must bite through the kernel too)."""
    monkeypatch.setattr(verification, "RESIDUAL_EPS", 2.0)
    num_drafts, vocab, temps = CASES["mixed-lengths"]
    _assert_same(_batch(num_drafts, vocab, temps, 0.6, 1))


@pytest.mark.parametrize("num_drafts", [[1], [3, 0, 7, 2]], ids=["one-request", "mixed-lengths"])
def test_greedy_variant(triton_kernels, num_drafts: list[int]):
    """The argmax-only kernel equals the twin on greedy batches, also where drafts match the argmax."""
    vocab = 96
    for seed, closeness in [(0, 1.0), (1, 0.5)]:
        args = _batch(num_drafts, vocab, [0.0] * len(num_drafts), closeness, seed)
        ref = _assert_same(args, all_greedy=True)
        twin = verification.rejection_sample_greedy(args["target_logits"], args["draft_token_ids"], args["cu_num_drafts"])
        assert twin.num_accepted.tolist() == ref.num_accepted.tolist()
        assert twin.next_token_ids.tolist() == ref.next_token_ids.tolist()
        _assert_same(args)  # the general kernel too
        if closeness == 1.0:
            assert ref.num_accepted.tolist() == num_drafts


def test_no_requests(triton_kernels):
    empty = dict(
        target_logits=torch.zeros(0, 8), draft_token_ids=torch.zeros(0, dtype=torch.long),
        cu_num_drafts=torch.zeros(1, dtype=torch.long), draft_probs=None, temperatures=torch.zeros(0),
        accept_uniforms=torch.zeros(0), sample_uniforms=torch.zeros(0),
    )
    out = dispatch_rejection_sample(**{k: (v.to(DEVICE) if v is not None else v) for k, v in empty.items()})
    assert out.num_accepted.shape == out.next_token_ids.shape == (0,)
