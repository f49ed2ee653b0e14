"""One DSpark draft step with and without the Markov head (the paper: +0.2–1.3% of step latency).

Run with `python -m pytest tests/benchmarks --benchmark-enable --benchmark-group-by=param:shape`;
by default (benchmarks disabled) each case runs once as a smoke test. The ratio that matters is
markov ÷ none within one run, on the same backbone weights and the same context.
"""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters import DraftConfig, DSparkDrafter, DSparkModel
from dspark_core.drafters.base import DraftStep

SHAPES = {
    # name: (vocab, hidden, layers, batch, context)
    "tiny": (4096, 256, 5, 16, 256),
    "small": (32768, 512, 5, 32, 512),
}


def _drafter(head: str, shape: str) -> tuple[DSparkDrafter, DraftStep, torch.Tensor]:
    vocab, hidden, layers, batch, context = SHAPES[shape]
    config = DraftConfig(
        method="dspark", vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_layers=layers,
        num_attention_heads=hidden // 64, num_kv_heads=max(1, hidden // 128), head_dim=64,
        target_hidden_size=hidden, target_layer_ids=(1, 2, 3), mask_token_id=vocab - 1,
        head=head, markov_rank=256, confidence_head=head != "none",
    )
    torch.manual_seed(0)
    model = DSparkModel(config)  # same seed → same backbone weights for both heads
    drafter = DSparkDrafter(model)
    state = drafter.start(batch, context + 16)
    rows = torch.arange(batch)
    features = torch.randn(batch, context, 3 * hidden)
    tokens = torch.randint(0, vocab - 1, (batch, context + 16))
    drafter.observe(state, rows, tokens[:, :context], features, torch.full((batch,), context))
    num_tokens = torch.full((batch,), context + 1)
    step = DraftStep(
        rows, tokens, num_tokens, 7, torch.ones(batch), [torch.Generator().manual_seed(i) for i in range(batch)]
    )
    return drafter, step, state


@pytest.mark.parametrize("shape", ["tiny", "small"])
@pytest.mark.parametrize("head", ["none", "markov"])
def test_draft_step(benchmark, torch_threads, head: str, shape: str) -> None:
    torch_threads(2)
    drafter, step, state = _drafter(head, shape)
    benchmark.group = f"draft-step-{shape}"
    proposal = benchmark(drafter.propose, state, step)
    assert proposal.token_ids.shape == (len(step.rows), 7)
    assert (proposal.confidence_logits is None) == (head == "none")
