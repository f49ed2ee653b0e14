"""Choosing a reduced draft vocabulary: ranking, ties, forced tokens, coverage."""

import math

import pytest
import torch

from dspark_core.draft_vocabulary import choose_draft_vocabulary, coverage, token_counts


def test_counts_rank_then_secondary_then_id_and_forced_tokens_stay():
    counts = token_counts([[5, 5, 5, 2, 2, 7], torch.tensor([2, 9, 9])], 12)
    assert counts.tolist() == [0, 0, 3, 0, 0, 3, 0, 1, 0, 2, 0, 0]
    # 2 and 5 tie on 3: both in; 9 (2) next; then 7 (1); the zeros rank by the secondary counts, then by id
    assert choose_draft_vocabulary(counts, 4).tolist() == [2, 5, 7, 9]
    secondary = torch.zeros(12, dtype=torch.long)
    secondary[11] = 1
    assert choose_draft_vocabulary(counts, 5, secondary=secondary).tolist() == [2, 5, 7, 9, 11]
    assert choose_draft_vocabulary(counts, 5).tolist() == [0, 2, 5, 7, 9]  # no secondary: the lowest id
    # a stop token that never occurred is kept; the least frequent chosen one (7) makes room
    assert choose_draft_vocabulary(counts, 4, always=[10]).tolist() == [2, 5, 9, 10]
    # secondary counts never outrank a primary count
    heavy = torch.zeros(12, dtype=torch.long)
    heavy[0] = 1_000
    assert 7 in choose_draft_vocabulary(counts, 4, secondary=heavy).tolist()


def test_refusals():
    counts = torch.ones(8, dtype=torch.long)
    with pytest.raises(ValueError, match="1 … 8 tokens, got 9"):
        choose_draft_vocabulary(counts, 9)
    with pytest.raises(ValueError, match="at most 2 ids in \\[0, 8\\)"):
        choose_draft_vocabulary(counts, 2, always=[1, 2, 3])
    with pytest.raises(ValueError, match="at most 2 ids"):
        choose_draft_vocabulary(counts, 2, always=[8])


def test_coverage_counts_every_occurrence():
    vocab = torch.tensor([1, 3])
    assert coverage(vocab, [[1, 1, 2], torch.tensor([3, 4])]) == pytest.approx(3 / 5)
    assert math.isnan(coverage(vocab, []))
