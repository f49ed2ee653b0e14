"""Markov W1 over the draft vocabulary and one shared row (`DraftConfig.markov_w1_rows` "draft"): the same head
as W1 over every target id whose rows outside the draft vocabulary are all equal, at a sixth of the size on
SmolLM2. The kernel's and vLLM's sides are in kernel_tests/test_markov_draft.py and backends/vllm/test_export.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.dspark import DSparkModel
from dspark_core.drafters.heads import w1_over_target

VOCAB, DRAFT_VOCAB = 120, 30


def _config(**kw) -> DraftConfig:
    base = dict(method="dspark", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_layers=1,
                num_attention_heads=4, num_kv_heads=2, head_dim=8, target_hidden_size=32, target_layer_ids=(0,),
                mask_token_id=VOCAB - 1, markov_rank=12, draft_vocab_size=DRAFT_VOCAB)
    return DraftConfig(**(base | kw))


def _pair(head: str) -> tuple[DSparkModel, DSparkModel]:
    """A compact-W1 draft with random weights, and the same draft with its W1 scattered over target ids."""
    torch.manual_seed(0)
    compact = DSparkModel(_config(head=head, markov_w1_rows="draft")).eval()
    vocab = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:DRAFT_VOCAB]
    compact.set_draft_vocabulary(vocab)
    with torch.no_grad():
        for p in compact.parameters():
            p.normal_(0, 0.5)
    full = DSparkModel(replace(compact.config, markov_w1_rows="target")).eval()
    state = compact.state_dict()
    state["markov_head.markov_w1.weight"] = w1_over_target(state["markov_head.markov_w1.weight"],
                                                           compact.draft_to_target, VOCAB)
    full.load_state_dict(state)
    return compact, full


@pytest.mark.parametrize("head", ["markov", "gated", "rnn"])
def test_compact_w1_is_the_target_indexed_head(head: str):
    """Teacher-forced (training: previous tokens anywhere in the target's vocabulary, the shared row for those
    outside the draft's) and sampled (drafting: the anchor mapped, later tokens by draft index), the two layouts
    give the same logits, confidences and drafts."""
    compact, full = _pair(head)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(4, 5, 32, generator=g)
    prev = torch.randint(0, VOCAB, (4, 5), generator=g)
    assert not torch.isin(prev, compact.draft_to_target).all()
    with torch.no_grad():
        for a, b in zip(compact.teacher_forced(h, prev), full.teacher_forced(h, prev)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        temps, uniforms = torch.tensor([0.0, 1.0, 0.7, 1.0]), torch.rand(4, 5, generator=g)
        for a, b in zip(compact.sample_block(h, prev[:, 0], temps, uniforms), full.sample_block(h, prev[:, 0], temps, uniforms)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compact_w1_is_smaller_by_the_vocabularies_ratio():
    compact, full = _pair("markov")
    assert compact.markov_head.markov_w1.weight.shape == (DRAFT_VOCAB + 1, 12)
    assert full.markov_head.markov_w1.weight.shape == (VOCAB, 12)


@pytest.mark.parametrize("kw, why", [
    (dict(markov_w1_rows="draft", draft_vocab_size=None), "draft_vocab_size"),
    (dict(markov_w1_rows="draft", method="dflash", head="none", confidence_head=False), "head"),
    (dict(markov_w1_rows="vocab"), "valid: target, draft"),
])
def test_compact_w1_needs_a_head_and_a_draft_vocabulary(kw: dict, why: str):
    with pytest.raises(ValueError, match=why):
        _config(**kw)
