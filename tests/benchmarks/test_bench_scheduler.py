"""One scheduler decision for 256 requests × γ 7 (goal: ≤ 1 ms on the CPU).

Run with `python -m pytest tests/benchmarks/test_bench_scheduler.py --benchmark-enable`; by default
(benchmarks disabled) each case runs once as a smoke test. The SPS table is a staircase shaped like a
GPU's (a step every 16 tokens) and the confidences are spread so that the decision stops mid-list.
"""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters.base import DraftProposal
from dspark_core.scheduler import AsyncBudgetScheduler, ConfidenceThreshold, PrefixScheduler
from dspark_core.costs import step_sps_table

NUM_REQUESTS, GAMMA = 256, 7
# A memory-bound staircase: 10 ms + 0.03 ms per started tile of 16 tokens, measured at the tile edges.
TABLE = step_sps_table(2048, 16, base_latency_s=0.010, tile_latency_s=0.00003)

def _proposal() -> DraftProposal:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(NUM_REQUESTS, GAMMA, generator=gen) * 2 + 2  # [R, γ]
    return DraftProposal(torch.zeros(NUM_REQUESTS, GAMMA, dtype=torch.long), None, logits)


POLICIES = {
    "prefix": lambda: PrefixScheduler(TABLE),
    "async-prefix": lambda: AsyncBudgetScheduler(TABLE),
    "prefix-sts": lambda: PrefixScheduler(TABLE, temperatures=torch.linspace(0.8, 2.0, GAMMA)),
    "threshold": lambda: ConfidenceThreshold(0.7),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_scheduler_decision(benchmark, torch_threads, name: str) -> None:
    torch_threads(1)  # the engine runs the scheduler on one host thread
    policy, proposal = POLICIES[name](), _proposal()
    benchmark.group = f"scheduler-{NUM_REQUESTS}x{GAMMA}"
    lengths = benchmark(policy.choose, proposal, None)
    assert lengths.shape == (NUM_REQUESTS,) and lengths.dtype == torch.long
    assert 0 <= int(lengths.min()) and int(lengths.max()) <= GAMMA
    if name.startswith("prefix"):
        assert 0 < int(lengths.sum()) < NUM_REQUESTS * GAMMA, "the decision should stop mid-list"
