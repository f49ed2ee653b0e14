"""A closed loop's loaded throughput (the concurrency benchmark's headline figure): tokens over the loaded steps (≥ 3/4 of the slots busy),
prefills included, the drain left out."""

from __future__ import annotations

import pytest

from backends.inhouse.engine import Completed, Request
from contracts.records import StepRecord
from backends.inhouse.load import LoadResult, loaded_tokens_per_s
from dspark_core.generate import RequestCounters


def _completed(name: str, emissions: list[tuple[float, int]]) -> Completed:
    request = Request(name, [1, 2], max_new_tokens=10)
    total = sum(n for _, n in emissions)
    return Completed(request, [0] * total, "length", RequestCounters(3), 0.0, emissions[0][0], emissions[-1][0],
                     emissions)


def test_loaded_throughput_counts_the_steps_with_most_slots_busy():
    # 4 slots. Step 0 (1 s, prefills 4) and step 1 (0.5 s) are full; step 2 runs 3 of 4 (loaded still:
    # one request ended early); step 3 runs 1 (the drain: left out, with its tokens).
    steps = [StepRecord(0, 1.0, 4, 0, 0, 1.0, num_prefilled=4), StepRecord(1, 1.5, 4, 0, 0, 0.5),
             StepRecord(2, 2.0, 3, 0, 0, 0.5), StepRecord(3, 3.0, 1, 0, 0, 1.0)]
    completed = [
        _completed("a", [(0.9, 1), (1.4, 2), (1.9, 1), (2.9, 5)]),
        _completed("b", [(0.9, 1), (1.4, 2), (1.9, 1)]),
        _completed("c", [(0.9, 1), (1.4, 1), (1.9, 3)]),
        _completed("d", [(0.9, 1), (1.4, 1)]),
    ]
    result = LoadResult(completed, set(), steps, (0.0, 3.0))
    tokens = 4 + 6 + 5  # prefill tokens, step 1, step 2; not step 3's 5
    assert loaded_tokens_per_s(result, 4) == pytest.approx(tokens / 2.0)
    assert loaded_tokens_per_s(result, 1) == pytest.approx((tokens + 5) / 3.0)  # c = 1: every step is loaded
