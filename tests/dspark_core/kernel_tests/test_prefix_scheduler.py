"""kernels/prefix_scheduler.py against its twin `scheduler.schedule_prefix` (and `_Calibrated.survival` for
the from-logits entry): verify lengths equal exactly, on random survival over random step-shaped SPS tables,
ties, undrafted positions, one request, γ 1 … 7."""

from __future__ import annotations

import pytest
import torch

from dspark_core.scheduler import (
    calibrated_survival, dispatch_schedule_prefix, dispatch_schedule_prefix_from_logits, schedule_prefix,
)
from dspark_core.costs import SPSTable, step_sps_table

from .conftest import DEVICE

pytest.importorskip("triton")


def _random_case(gen: torch.Generator, num_rows: int, gamma: int):
    logits = torch.randn(num_rows, gamma, generator=gen, dtype=torch.float64) * 2 + 1
    num_points = int(torch.randint(1, 6, (1,), generator=gen))
    sizes = sorted(set(torch.randint(1, num_rows * (gamma + 1) + 4, (num_points,), generator=gen).tolist()))
    drops = torch.rand(len(sizes), generator=gen, dtype=torch.float64) * 0.5 + 0.5
    return logits, SPSTable(tuple(sizes), tuple((100 * torch.cumprod(drops, 0)).tolist()))


SHAPES = [(1, 1), (1, 7), (3, 1), (2, 3), (5, 4), (8, 7)]


@pytest.mark.parametrize("num_rows, gamma", SHAPES)
def test_matches_twin_on_random_tables(triton_kernels, num_rows: int, gamma: int):
    gen = torch.Generator().manual_seed(num_rows * 10 + gamma)
    admitted = []
    for _ in range(4):
        logits, sps = _random_case(gen, num_rows, gamma)
        survival = torch.cumprod(torch.sigmoid(logits), dim=1).to(DEVICE)
        got = dispatch_schedule_prefix(survival, sps)
        assert got.dtype == torch.long and got.device.type == survival.device.type
        expected = schedule_prefix(survival, sps)
        assert got.tolist() == expected.tolist()
        admitted += expected.tolist()
    if num_rows * gamma > 1:
        assert 0 < sum(admitted) < 4 * num_rows * gamma, "the cases should stop early sometimes, not always"


@pytest.mark.parametrize("num_rows, gamma", [(1, 3), (4, 7)])
def test_from_logits_with_undrafted_positions(triton_kernels, num_rows: int, gamma: int):
    gen = torch.Generator().manual_seed(11)
    for case in range(4):
        logits, sps = _random_case(gen, num_rows, gamma)
        num_valid = torch.randint(0, gamma + 1, (num_rows,), generator=gen) if case % 2 else None
        logits, num_valid = logits.to(DEVICE), (num_valid.to(DEVICE) if num_valid is not None else None)
        got = dispatch_schedule_prefix_from_logits(logits, sps, num_valid)
        expected = schedule_prefix(calibrated_survival(logits, num_valid), sps)
        assert got.tolist() == expected.tolist()
        if num_valid is not None:
            assert bool((got <= num_valid).all())


def test_ties_go_to_the_earlier_position_then_the_lower_row(triton_kernels):
    """σ(50) = 1.0 exactly: every candidate ties. SPS 100 up to B = 5, then 10: three admitted, (0,1), (1,1),
    (0,2) — the twin's stable position-major order (tests/dspark_core/test_scheduler.py)."""
    cliff = SPSTable.from_points([(5, 100.0), (6, 10.0)])
    logits = torch.full((2, 3), 50.0, dtype=torch.float64, device=DEVICE)
    assert dispatch_schedule_prefix_from_logits(logits, cliff).tolist() == [2, 1]
    assert dispatch_schedule_prefix(torch.ones(2, 3, dtype=torch.float64, device=DEVICE), cliff).tolist() == [2, 1]


def test_idle_and_busy_hardware(triton_kernels):
    conf = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.5, 0.9]], dtype=torch.float64)
    survival = torch.cumprod(conf, dim=1).to(DEVICE)
    flat = SPSTable.from_points([(1, 100.0), (64, 100.0)])
    busy = SPSTable.from_points([(2, 100.0), (3, 30.0), (64, 25.0)])
    stairs = step_sps_table(64, 2, base_latency_s=0.010, tile_latency_s=0.004)
    for sps in (flat, busy, stairs):
        assert dispatch_schedule_prefix(survival, sps).tolist() == schedule_prefix(survival, sps).tolist()
    assert dispatch_schedule_prefix(survival, flat).tolist() == [3, 3]
    assert dispatch_schedule_prefix(survival, busy).tolist() == [0, 0]


def test_more_candidates_than_one_block(triton_kernels):
    """R·γ = 84 candidates: the ranking spans several program blocks and the Θ scan several tiles."""
    gen = torch.Generator().manual_seed(5)
    logits, _ = _random_case(gen, 12, 7)
    survival = torch.cumprod(torch.sigmoid(logits), dim=1).to(DEVICE)
    sps = step_sps_table(256, 8, base_latency_s=0.010, tile_latency_s=0.0009)
    expected = schedule_prefix(survival, sps)
    assert 0 < int(expected.sum()) < 84
    assert dispatch_schedule_prefix(survival, sps).tolist() == expected.tolist()


def test_empty_batch(triton_kernels):
    sps = SPSTable.from_points([(1, 1.0)])
    assert dispatch_schedule_prefix(torch.zeros(0, 3, dtype=torch.float64, device=DEVICE), sps).shape == (0,)
