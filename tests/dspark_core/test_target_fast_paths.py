"""`TargetModel.forward`'s fast paths give what the plain path gives.

- Logits at chosen positions only (`logits_at`, what a prefill asks for) equal those positions of the full
  logits.
- KV slots read in place (contiguous rows), read in place over the range that covers rows with a few holes
  (idle slots computed and dropped), gathered (any other rows) or through the old concatenating cache path
  (too little room behind the longest row) all give the same logits, features and slots.
"""

from __future__ import annotations

import copy

import pytest
import torch

import dspark_core.target as target_module
import dspark_core.kv_slots as kv_slots
from dspark_core.kv_slots import covering_range, row_span
from dspark_core.target import TargetModel


def _tokens(seed: int, shape, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def test_row_span():
    assert row_span(torch.tensor([2, 3, 4])) == slice(2, 5)
    assert row_span(torch.tensor([5])) == slice(5, 6)
    assert row_span(torch.tensor([0, 2, 1])) is None and row_span(torch.tensor([0, 2])) is None
    assert row_span(torch.tensor([], dtype=torch.long)) is None


def test_covering_range():
    lengths = torch.tensor([5, 0, 7, 6, 9, 4])
    span, at = covering_range(lengths, torch.tensor([0, 2, 3]))
    assert span.tolist() == [0, 1, 2, 3] and at.tolist() == [0, 2, 3]
    assert covering_range(lengths, torch.tensor([0, 1, 2])) is None  # contiguous: a view already
    assert covering_range(lengths, torch.tensor([2, 0, 3])) is None  # unsorted
    assert covering_range(lengths, torch.tensor([0, 3])) is None  # 2 holes for 2 rows: gather
    assert covering_range(lengths, torch.tensor([2, 3, 5])) is None  # idle slot 4 holds a longer context


def test_logits_at_selected_positions(qwen3_target: TargetModel):
    vocab = qwen3_target.vocab_size
    lengths = torch.tensor([5, 2, 7])
    token_ids = _tokens(0, (3, 7), vocab)
    rows = torch.tensor([0, 1, 2])
    full = qwen3_target.forward(qwen3_target.new_cache(3, 16), rows, token_ids, lengths)
    last = (lengths - 1)[:, None]
    cache = qwen3_target.new_cache(3, 16)
    some = qwen3_target.forward(cache, rows, token_ids, lengths, logits_at=last)
    assert some.logits.shape == (3, 1, vocab)
    torch.testing.assert_close(some.logits[:, 0], full.logits[torch.arange(3), lengths - 1])
    torch.testing.assert_close(some.features, full.features)
    assert cache.lengths.tolist() == lengths.tolist()
    two = qwen3_target.forward(qwen3_target.new_cache(3, 16), rows, token_ids, lengths,
                               logits_at=torch.tensor([[0, 4], [1, 0], [6, 2]]))
    torch.testing.assert_close(two.logits[2, 0], full.logits[2, 6])
    torch.testing.assert_close(two.logits[1, 0], full.logits[1, 1])


def _run(target: TargetModel, capacity: int, order: list[list[int]]):
    """Prefill 4 slots, then verify-shaped chunks over the row subsets in `order`, with a rollback between."""
    cache = target.new_cache(4, capacity)
    outs = []
    rows = torch.arange(4)
    out = target.forward(cache, rows, _tokens(1, (4, 6), target.vocab_size), torch.tensor([6, 3, 5, 1]))
    outs.append(out)
    for i, subset in enumerate(order):
        r = torch.tensor(subset)
        num_new = torch.tensor([3, 1, 2, 3][: len(subset)])
        outs.append(target.forward(cache, r, _tokens(2 + i, (len(subset), 3), target.vocab_size), num_new))
        cache.rollback(r, cache.lengths[r] - 1)
    return outs, cache


@pytest.mark.parametrize("order", [[[0, 1, 2, 3], [1, 2]], [[0, 1, 3], [0, 2, 3]], [[3, 0, 2], [2, 0]]],
                         ids=["contiguous", "covered", "gathered"])
def test_in_place_gathered_and_concatenated_paths_agree(qwen3_target: TargetModel, monkeypatch, order):
    """The lean forward (new positions behind each row) and Hugging Face's (new positions behind the longest
    row, then moved), in place, tight (no room behind the longest row) and concatenated: the same results."""
    assert qwen3_target.lean
    lean, lean_cache = _run(qwen3_target, 20, order)
    tight, tight_cache = _run(qwen3_target, 11, order)  # no room behind the longest row for a whole chunk
    monkeypatch.setattr(qwen3_target, "lean", False)
    hf, hf_cache = _run(qwen3_target, 20, order)
    hf_tight, _ = _run(qwen3_target, 11, order)
    monkeypatch.setattr(target_module, "_DynamicLayer", None)  # the older gather-and-concatenate path
    slow, slow_cache = _run(qwen3_target, 20, order)
    valid = [[6, 3, 5, 1]] + [[3, 1, 2, 3][: len(subset)] for subset in order]  # padded positions are garbage
    for outs in (lean, tight, hf, hf_tight):
        for a, c, counts in zip(outs, slow, valid):
            for row, n in enumerate(counts):
                torch.testing.assert_close(a.logits[row, :n], c.logits[row, :n])
                torch.testing.assert_close(a.features[row, :n], c.features[row, :n])
    assert all(c.lengths.tolist() == slow_cache.lengths.tolist() for c in (lean_cache, tight_cache, hf_cache))
    for cache in (lean_cache, hf_cache):
        for k_fast, k_slow in zip(cache.keys, slow_cache.keys):
            for row, n in enumerate(slow_cache.lengths.tolist()):
                torch.testing.assert_close(k_fast[row, :, :n], k_slow[row, :, :n])


def test_eager_attention_gets_the_2d_mask(qwen3_target: TargetModel):
    """Only SDPA receives the ready 4-D boolean mask; other implementations build their own from the 2-D one."""
    model = copy.deepcopy(qwen3_target.model)
    model.config._attn_implementation = "eager"
    eager = TargetModel(model)
    token_ids = _tokens(3, (2, 5), eager.vocab_size)
    num_new = torch.tensor([5, 3])
    a = eager.forward(eager.new_cache(2, 8), torch.tensor([0, 1]), token_ids, num_new)
    b = qwen3_target.forward(qwen3_target.new_cache(2, 8), torch.tensor([0, 1]), token_ids, num_new)
    for j, n in enumerate(num_new.tolist()):
        torch.testing.assert_close(a.logits[j, :n], b.logits[j, :n], atol=1e-4, rtol=1e-4)


def test_covering_a_freed_slot_matches_the_gather(qwen3_target: TargetModel, monkeypatch):
    """Rows [0, 2, 3] around a released slot 1 (nothing cached, nothing new): the covering forward computes it,
    appends nothing to it and drops its row; the rows get what the gather gives them."""
    def run(max_holes: float):
        monkeypatch.setattr(kv_slots, "MAX_HOLE_FRACTION", max_holes)
        cache = qwen3_target.new_cache(4, 20)
        qwen3_target.forward(cache, torch.arange(4), _tokens(1, (4, 6), qwen3_target.vocab_size), torch.tensor([6, 3, 5, 1]))
        cache.lengths[1] = 0  # the engine's release_slots
        rows = torch.tensor([0, 2, 3])
        out = qwen3_target.forward(cache, rows, _tokens(2, (3, 4), qwen3_target.vocab_size), torch.tensor([4, 1, 2]),
                                   logits_at=torch.tensor([[3], [0], [1]]))
        return out, cache

    covered, covered_cache = run(0.5)
    gathered, gathered_cache = run(0.0)
    monkeypatch.setattr(qwen3_target, "lean", False)
    hf_covered, _ = run(0.5)
    torch.testing.assert_close(covered.logits[:, 0], hf_covered.logits[:, 0])  # logits_at: valid positions only
    assert torch.isfinite(covered.logits).all() and covered.logits.shape == gathered.logits.shape
    torch.testing.assert_close(covered.logits, gathered.logits)
    for j, n in enumerate([4, 1, 2]):
        torch.testing.assert_close(covered.features[j, :n], gathered.features[j, :n])
    assert covered_cache.lengths.tolist() == gathered_cache.lengths.tolist() == [10, 0, 6, 3]
