"""`harness.metrics.derive`: a backend's raw records become metrics in one place, the same for every backend."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from contracts.records import ServerTTFT, SpecCounts
from harness.metrics import summarise
from harness.metrics.confidence import reliability_bins
from harness.metrics.derive import derive
from harness.metrics.server_counts import spec_count_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent / "store"))
from store_fixtures import make_result  # noqa: E402  (the store tests' hand-made cell result)


def _cell(**drafter) -> Cell:
    return Cell("inhouse", TargetSpec("t", "embedded"), DrafterSpec("d", "dspark", "embedded:dspark", **drafter), 4,
                TaskSpec("gsm8k", 24, 16), PolicySpec("full"), concurrency=4)


def _raw(seed: int = 0):
    """A backend's result: the fixture's records, with nothing derived."""
    return replace(make_result(seed), metrics={}, calibration_bins=[])


def test_the_calibrated_ece_applies_the_level_offsets_and_the_raw_one_does_not():
    raw = _raw()
    gamma = len(raw.sts_temperatures)
    shifted = replace(raw, sts_offsets=tuple(-0.7 for _ in range(gamma)))
    plain_sts, levelled = derive(_cell(), raw), derive(_cell(), shifted)
    assert levelled.metrics.value("ece_raw") == plain_sts.metrics.value("ece_raw")
    assert levelled.metrics.value("ece_calibrated") != plain_sts.metrics.value("ece_calibrated")
    records = [r.record for r in raw.requests]
    expected = summarise(records, raw.steps, raw.window, temperatures=raw.sts_temperatures, offsets=shifted.sts_offsets)
    assert levelled.metrics.value("ece_calibrated") == expected.value("ece_calibrated")
    inside = [r for r in records if not r.failed and raw.window.contains(r.finish_s)]
    assert [tuple(vars(b).values()) for b in levelled.calibration_bins] == reliability_bins(
        inside, raw.sts_temperatures, offsets=shifted.sts_offsets)


def test_derive_is_summarise_and_the_reliability_bins_of_the_records():
    raw = _raw()
    got = derive(_cell(), raw)
    records = [r.record for r in raw.requests]
    assert dict(got.metrics) == dict(summarise(records, raw.steps, raw.window, temperatures=raw.sts_temperatures))
    inside = [r for r in records if not r.failed and raw.window.contains(r.finish_s)]
    assert [tuple(vars(b).values()) for b in got.calibration_bins] == reliability_bins(inside, raw.sts_temperatures)
    assert got.calibration_bins and got.metrics.value("ece_raw") is not None
    assert raw.metrics == {} and got.requests is raw.requests  # the records themselves are untouched


def test_server_counters_define_acceptance_where_the_records_have_no_steps():
    counts = SpecCounts(drafts=10, draft_tokens=40, accepted=20, accepted_per_pos=(9, 6, 3, 2))
    got = derive(_cell(), replace(_raw(), spec_counts=counts, server_ttft=ServerTTFT(2.0, 8)))
    for name, metric in spec_count_metrics(counts, 4).items():
        assert got.metrics[name] == metric, name
    assert got.metrics.value("acceptance_length") == 3.0 and got.metrics.value("ttft_server_mean") == 0.25


def test_a_synthetic_cell_carries_its_flag_metric():
    assert "synthetic_acceptance" not in derive(_cell(), _raw()).metrics
    flagged = derive(_cell(synthetic_acceptance=(0.5, 0.5)), _raw())
    assert flagged.metrics.value("synthetic_acceptance") == 1.0
