"""A DSpark drafter proposes the same drafts whichever way it reads its context slots: in place over a
contiguous range, in place over the range that covers rows with holes (idle slots computed and dropped),
or from a gathered copy. A wrong path here would not break losslessness (the target still decides), only
acceptance, so no engine test would see it."""

from __future__ import annotations

import pytest
import torch

import dspark_core.kv_slots as kv_slots
from dspark_core.drafters import DraftStep, as_drafter, build_draft_model, draft_config_for

MASK = 95


def _drafter(target):
    config = draft_config_for(target, "dspark", mask_token_id=MASK, head="markov", num_layers=2,
                              target_layer_ids=(0, 2), markov_rank=8, confidence_head=True)
    torch.manual_seed(0)
    model = build_draft_model(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.2 * torch.randn_like(p))
    return as_drafter(model.eval())


def _propose_over(drafter, rows: list[int]):
    """Five slots with contexts of different lengths, slot 1 released; then a draft for `rows`."""
    c = drafter.config
    gen = torch.Generator().manual_seed(1)
    num_slots, capacity = 5, 24
    ctx = torch.tensor([6, 4, 9, 3, 7])
    token_ids = torch.randint(0, c.vocab_size - 1, (num_slots, capacity), generator=gen)
    features = torch.randn(num_slots, 9, c.num_target_features * c.target_hidden_size, generator=gen)
    state = drafter.start(num_slots, capacity)
    drafter.observe(state, torch.arange(num_slots), token_ids[:, :9], features, ctx)
    drafter.reset(state, torch.tensor([1]))
    r = torch.tensor(rows)
    step = DraftStep(rows=r, token_ids=token_ids, num_tokens=ctx + 1, num_drafts=4,
                     temperatures=torch.tensor([1.0, 0.0, 1.0][: len(rows)]),
                     generators=[torch.Generator().manual_seed(100 + i) for i in rows])
    return drafter.propose(state, step), state.lengths.clone()


@pytest.mark.parametrize("rows", [[0, 2, 3], [2, 4]], ids=["freed-slot-hole", "live-slot-hole"])
def test_covered_rows_propose_what_the_gather_proposes(qwen3_target, monkeypatch, rows):
    drafter = _drafter(qwen3_target)
    calls = []
    original = kv_slots.covering_range
    monkeypatch.setattr("dspark_core.drafters.dspark.covering_range",
                        lambda lengths, r: calls.append(original(lengths, r)) or calls[-1])
    covered, lengths_after = _propose_over(drafter, rows)
    assert calls and calls[-1] is not None  # the covering path ran
    monkeypatch.setattr(kv_slots, "MAX_HOLE_FRACTION", 0.0)
    gathered, lengths_gathered = _propose_over(drafter, rows)
    assert calls[-1] is None  # and now the gather
    assert torch.equal(covered.token_ids, gathered.token_ids)
    torch.testing.assert_close(covered.draft_probs, gathered.draft_probs)
    torch.testing.assert_close(covered.confidence_logits, gathered.confidence_logits)
    assert torch.equal(lengths_after, lengths_gathered)  # proposing appends nothing to any slot
