"""Prefill batching: the split of admitted prompts is the cheapest one, and the engine's outputs do not depend on it."""

from __future__ import annotations

import itertools

import pytest
import torch

from backends.inhouse.engine import Engine, EngineConfig, Request
from backends.inhouse.prefill_groups import prefill_groups
from dspark_core.drafters import NgramDrafter
from dspark_core.generate import GenerationConfig, generate


def _cost(lengths, groups, per_forward):
    return sum(len(g) * max(lengths[i] for i in g) + per_forward for g in groups)


def _every_split(lengths, per_forward):
    """The least cost over every partition into batches (brute force: small n only)."""
    n, best = len(lengths), None
    for labels in itertools.product(range(n), repeat=n):
        groups = [[i for i in range(n) if labels[i] == g] for g in set(labels)]
        cost = _cost(lengths, groups, per_forward)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_split_is_the_cheapest_of_all_partitions(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 300, (6,), generator=gen).tolist()
    per_forward = [0, 16, 64, 1000][seed % 4]
    groups = prefill_groups(lengths, per_forward)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert _cost(lengths, groups, per_forward) == _every_split(lengths, per_forward)


def test_like_lengths_stay_together_and_outliers_go_alone():
    assert prefill_groups([100, 101, 99, 102]) == [[2, 0, 1, 3]]  # padding of 3 tokens is not worth a forward
    assert prefill_groups([50, 380, 52, 49]) == [[3, 0, 2], [1]]  # MT-Bench-like: the long prompt alone
    assert prefill_groups([]) == [] and prefill_groups([7]) == [[0]]
    assert prefill_groups([10, 500], forward_cost_tokens=10_000) == [[0, 1]]


def test_grouped_prefills_give_the_outputs_of_solo_generation(qwen3_target, monkeypatch):
    """Prompts of 3 to 40 tokens admitted at once go through several prefills, into consecutive slots; every
    request's tokens equal a solo `generate` run (greedy and sampled)."""
    import backends.inhouse.engine as engine_module

    calls = []
    real = engine_module.prefill
    monkeypatch.setattr(engine_module, "prefill", lambda *a, **kw: calls.append(a[3].tolist()) or real(*a, **kw))
    gen = torch.Generator().manual_seed(3)
    lengths = [40, 3, 38, 4, 5, 39]
    requests = [Request(f"r{i}", torch.randint(0, 90, (n,), generator=gen).tolist(), max_new_tokens=8,
                        temperature=float(i % 2), seed=10 + i) for i, n in enumerate(lengths)]
    engine = Engine(qwen3_target, NgramDrafter(), EngineConfig(num_slots=6, max_context=64, num_drafts=3))
    done = {c.request.request_id: c for c in engine.run_to_completion(requests)}
    assert len(calls) == 2 and sorted(calls) == [[0, 1, 2], [3, 4, 5]]
    for req in requests:
        config = GenerationConfig(max_new_tokens=8, num_drafts=3, temperature=req.temperature)
        (solo,) = generate(qwen3_target, NgramDrafter(), [req.prompt_ids], config,
                           generators=[torch.Generator().manual_seed(req.seed)])
        assert done[req.request_id].output_ids == solo.output_ids
