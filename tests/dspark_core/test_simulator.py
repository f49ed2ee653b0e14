"""The scheduler simulator: exact replay under full verification, and policies compared at 1,024 requests."""

from __future__ import annotations

import pytest
import torch

from dspark_core.drafters import as_drafter, build_draft_model, draft_config_for
from dspark_core.generate import GenerationConfig, generate
from dspark_core.scheduler import PrefixScheduler, StaticLength
from dspark_core.simulator import Trace, simulate, traces_from_counters
from dspark_core.costs import SPSTable, step_sps_table


@pytest.fixture(scope="module")
def recorded(qwen3_target):
    """Traces from a real generation (untrained draft with a randomised confidence head), every draft verified."""
    config = draft_config_for(qwen3_target, "dspark", mask_token_id=95, num_layers=1, markov_rank=16)
    torch.manual_seed(1)
    model = build_draft_model(config)
    model.copy_target_embeddings(qwen3_target.input_embeddings(), qwen3_target.output_embeddings())
    with torch.no_grad():
        model.confidence_head.proj.weight.normal_(std=2.0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 90, (n,), generator=g).tolist() for n in (4, 9, 2, 13, 6, 8)]
    prompts = [p + p for p in prompts]  # repetition: some drafts get accepted
    results = generate(qwen3_target, as_drafter(model), prompts, GenerationConfig(max_new_tokens=40, num_drafts=7))
    return results


def test_full_verification_replays_the_recording_exactly(recorded):
    traces = traces_from_counters([r.counters for r in recorded])
    full_steps = [[(v, a) for v, a in zip(r.counters.num_verified, r.counters.num_accepted) if v == 7] for r in recorded]
    assert len(traces) == len(recorded) and sum(map(len, full_steps)) > len(recorded)
    flat = SPSTable.from_points([(1, 100.0), (1 << 20, 100.0)])
    sim = simulate(traces, StaticLength(7), flat, concurrency=1, num_requests=len(traces))
    assert sim.request_steps == sum(map(len, full_steps))
    assert sim.accepted_drafts == sum(a for steps in full_steps for _, a in steps)
    assert sim.output_tokens == sum(1 + sum(a + 1 for _, a in steps) for steps in full_steps)
    assert sim.seconds == pytest.approx(sim.num_steps / 100.0)


def test_traces_need_full_verification():
    from dspark_core.generate import RequestCounters

    c = RequestCounters(3)
    c.record(1, 1, [0.0])
    c.record(3, 0, [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="every draft verified"):
        traces_from_counters([c, c])


def _synthetic_traces(num: int, gamma: int = 7, seed: int = 0) -> list[Trace]:
    """Confidences that carry information: a draft is acceptable with probability σ(c)."""
    g = torch.Generator().manual_seed(seed)
    traces = []
    for _ in range(num):
        conf = torch.randn(40, gamma, generator=g) * 2 + 1
        survive = torch.rand(40, gamma, generator=g) < torch.sigmoid(conf)
        acceptable = survive.long().cumprod(dim=1).sum(dim=1)
        traces.append(Trace(conf, acceptable, 64))
    return traces


def test_production_scale_scheduler_beats_static_when_the_gpu_is_busy():
    """1,024 concurrent requests: on a step-shaped curve that is busy past 2,048 tokens, Algorithm 1 beats
    verifying every draft and verifying none; on a flat (idle) curve it verifies everything."""
    traces = _synthetic_traces(64)
    busy = step_sps_table(16384, 1024, base_latency_s=0.01, tile_latency_s=0.004)
    results = {
        name: simulate(traces, policy, busy, concurrency=1024, num_requests=1024)
        for name, policy in [("static0", StaticLength(0)), ("static7", StaticLength(7)),
                             ("scheduler", PrefixScheduler(busy))]
    }
    assert results["scheduler"].throughput >= max(results["static0"].throughput, results["static7"].throughput)
    flat = SPSTable.from_points([(1, 50.0), (1 << 20, 50.0)])
    idle = simulate(traces, PrefixScheduler(flat), flat, concurrency=1024, num_requests=1024)
    full = simulate(traces, StaticLength(7), flat, concurrency=1024, num_requests=1024)
    assert idle.verified_tokens == full.verified_tokens
