"""The n-gram rule, case by case (vLLM's V1 rule; dspark_core/drafters/ngram.py). That it is exactly
vLLM's is checked against vLLM's own function in tests/backends/vllm/test_vllm_cross_engine.py (opt-in)."""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters import NgramDrafter, build_drafter
from dspark_core.drafters.base import DraftStep


def _lookup(seq, k=3, **kw):
    return NgramDrafter(**kw).lookup(seq, k).tolist()


def test_the_earliest_occurrence_of_the_longest_ngram_wins():
    # suffix 1 2 3 occurs at 0 (then 9) and at 4 (then 8): the earliest
    assert _lookup([1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]) == [9, 1, 2]
    # the 3-gram 6 2 3 occurs once, late; the 2-gram 2 3 earlier: longest first
    assert _lookup([5, 2, 3, 7, 6, 2, 3, 8, 6, 2, 3]) == [8, 6, 2]
    # n is at most max_n: with max_n 2 the earliest 2-gram wins over the later 3-gram
    assert _lookup([5, 2, 3, 7, 6, 2, 3, 8, 6, 2, 3], max_n=2) == [7, 6, 2]


def test_matches_need_a_following_token_may_overlap_the_suffix_and_stop_at_the_end():
    assert _lookup([1, 1, 1, 1]) == [1]  # 1 1 1 at 0, overlapping the suffix: only one token follows
    assert _lookup([4, 5, 6, 4, 5], k=5) == [6, 4, 5]  # fewer than k tokens left: never padded
    assert _lookup([7, 8, 9]) == []  # no earlier occurrence
    assert _lookup([3, 3]) == []  # min_n 2: one token before the suffix is not enough
    assert _lookup([3, 3], min_n=1) == [3]


def test_max_model_len_caps_the_proposal():
    seq = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]  # 11 tokens
    assert _lookup(seq, max_model_len=13) == [9, 1]
    assert _lookup(seq, max_model_len=11) == [] and _lookup(seq, max_model_len=5) == []
    assert _lookup(seq) == [9, 1, 2]


def test_defaults_are_the_harness_vllm_settings_and_bad_sizes_are_refused():
    from backends.vllm.server import NGRAM

    drafter = build_drafter("ngram")
    assert (drafter.min_n, drafter.max_n, drafter.max_model_len) == (
        NGRAM["prompt_lookup_min"], NGRAM["prompt_lookup_max"], None)
    for bad in ({"min_n": 0}, {"min_n": 3, "max_n": 2}, {"max_model_len": 0}):
        with pytest.raises(ValueError):
            NgramDrafter(**bad)


def test_propose_over_a_batch_pads_and_counts_valid_drafts():
    token_ids = torch.tensor([[1, 2, 3, 9, 1, 2, 3, 0], [4, 5, 4, 5, 0, 0, 0, 0], [7, 8, 9, 0, 0, 0, 0, 0]])
    step = DraftStep(rows=torch.tensor([0, 1, 2]), token_ids=token_ids, num_tokens=torch.tensor([7, 4, 3]),
                     num_drafts=3, temperatures=torch.zeros(3), generators=[torch.Generator() for _ in range(3)])
    proposal = NgramDrafter().propose(None, step)
    assert proposal.num_valid.tolist() == [3, 2, 0]  # row 1: only 4 5 follows the earliest 4 5
    assert proposal.token_ids[0].tolist() == [9, 1, 2] and proposal.token_ids[1, :2].tolist() == [4, 5]
    assert proposal.draft_probs is None
