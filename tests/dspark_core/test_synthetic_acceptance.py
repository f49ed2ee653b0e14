"""The synthetic-acceptance verifier accepts by its law, per request stream, and emits the target's token
after the cut; the real verifier is untouched by it."""

from __future__ import annotations

import math

import pytest
import torch

from dspark_core.verification import synthetic_verifier

LAW = (0.8, 0.6, 0.3)


def _batch(num_requests: int, gamma: int, vocab: int = 11, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.arange(num_requests + 1) * gamma
    logits = torch.randn(num_requests * (gamma + 1), vocab, generator=g)
    drafts = torch.randint(vocab, (num_requests * gamma,), generator=g)
    gens = [torch.Generator().manual_seed(1000 + i) for i in range(num_requests)]
    return logits, drafts, cu, gens


def test_measured_conditional_acceptance_matches_the_law():
    gamma, n = 5, 6000
    logits, drafts, cu, gens = _batch(n, gamma)
    out = synthetic_verifier(LAW)(logits, drafts, cu, None, torch.ones(n), gens)
    acc = out.num_accepted
    for k in range(1, gamma + 1):
        reached = int((acc >= k - 1).sum())
        accepted = int((acc >= k).sum())
        rate = LAW[min(k, len(LAW)) - 1]  # past the list: its last rate
        se = math.sqrt(rate * (1 - rate) / reached)
        assert abs(accepted / reached - rate) < 4 * se, (k, accepted / reached, rate)


def test_law_is_per_request_and_the_next_token_is_the_targets():
    gamma, n = 3, 8
    logits, drafts, cu, _ = _batch(n, gamma, seed=1)
    verify = synthetic_verifier([0.5])
    alone = [verify(logits[i * 4:(i + 1) * 4], drafts[i * 3:(i + 1) * 3], torch.tensor([0, 3]), None,
                    torch.zeros(1), [torch.Generator().manual_seed(1000 + i)]) for i in range(n)]
    together = verify(logits, drafts, cu, None, torch.zeros(n), [torch.Generator().manual_seed(1000 + i) for i in range(n)])
    assert together.num_accepted.tolist() == [int(a.num_accepted) for a in alone]  # batch-independent
    rows = cu[:-1] + torch.arange(n) + together.num_accepted
    assert together.next_token_ids.tolist() == logits[rows].argmax(-1).tolist()  # greedy: the target's argmax


@pytest.mark.parametrize("rates", [[], [1.2], [-0.1]])
def test_bad_laws_are_refused(rates):
    with pytest.raises(ValueError):
        synthetic_verifier(rates)
