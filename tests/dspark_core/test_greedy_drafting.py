"""Model drafters draft a batch whose every row is greedy by argmax alone, with no draft probabilities.

A greedy draft's distribution is the one-hot on its argmax, which `DraftProposal.draft_probs = None` means
(what n-gram and the draft model already return). The fast path must draft exactly the tokens the general
path drafts for a greedy row, whose probabilities are that one-hot: checked here for DSpark (Markov head,
reduced draft vocabulary), DFlash and Eagle3-style, against a batch that mixes a sampled row in and so
takes the general path.
"""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters import DraftStep, as_drafter, build_draft_model, draft_config_for

MASK = 95
NUM_DRAFTS = 5


def _drafter(target, method: str):
    config = draft_config_for(target, method, mask_token_id=MASK, head="markov" if method == "dspark" else "none",
                              num_layers=1, target_layer_ids=(0, 2), markov_rank=8, draft_vocab_size=48)
    torch.manual_seed(0)
    model = build_draft_model(config)
    model.set_draft_vocabulary(torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(2))[:48])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name != "draft_to_target":
                p.copy_(0.5 * torch.randn_like(p))
    return as_drafter(model.eval())


def _propose(drafter, temperatures: list[float]):
    """Three slots with contexts of different lengths, all drafting `NUM_DRAFTS` tokens."""
    c = drafter.config
    gen = torch.Generator().manual_seed(1)
    num_slots, capacity = 3, 24
    ctx = torch.tensor([6, 4, 9])
    token_ids = torch.randint(0, c.vocab_size - 1, (num_slots, capacity), generator=gen)
    features = torch.randn(num_slots, 9, c.num_target_features * c.target_hidden_size, generator=gen)
    state = drafter.start(num_slots, capacity)
    drafter.observe(state, torch.arange(num_slots), token_ids[:, :9], features, ctx)
    step = DraftStep(rows=torch.arange(num_slots), token_ids=token_ids, num_tokens=ctx + 1, num_drafts=NUM_DRAFTS,
                     temperatures=torch.tensor(temperatures),
                     generators=[torch.Generator().manual_seed(100 + i) for i in range(num_slots)])
    with torch.no_grad():
        return drafter.propose(state, step)


@pytest.mark.parametrize("method", ["dspark", "dflash", "eagle3"])
def test_all_greedy_rows_draft_the_general_paths_argmax(qwen3_target, method: str):
    drafter = _drafter(qwen3_target, method)
    greedy = _propose(drafter, [0.0, 0.0, 0.0])
    mixed = _propose(drafter, [0.0, 1.0, 0.0])  # one sampled row: the general path for the whole batch
    assert greedy.draft_probs is None
    assert mixed.draft_probs is not None and mixed.draft_probs.shape[-1] == drafter.config.vocab_size
    for row in (0, 2):
        assert torch.equal(greedy.token_ids[row], mixed.token_ids[row])
        one_hot = torch.nn.functional.one_hot(mixed.token_ids[row], drafter.config.vocab_size).float()
        assert torch.equal(mixed.draft_probs[row], one_hot)
    assert set(greedy.token_ids.flatten().tolist()) <= set(drafter.model.draft_to_target.tolist())
    if method == "dspark":
        torch.testing.assert_close(greedy.confidence_logits[[0, 2]], mixed.confidence_logits[[0, 2]])
    # varied drafts (one token everywhere would make the comparison weak)
    assert len(set(greedy.token_ids.flatten().tolist())) >= 4
