"""The L1 step fit finds level changes through noise and none in noise alone (seeded)."""

from __future__ import annotations

import random

import pytest

from harness.report.changepoints import PENALTY_SCALE, detect_changes, fit_steps, noise_scale


def noisy(rng, level, n, sigma=1.0):
    return [rng.gauss(level, sigma) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_finds_a_step_in_noise(seed):
    rng = random.Random(seed)
    values = noisy(rng, 10.0, 15) + noisy(rng, 15.0, 15)  # a 5 σ step
    changes = detect_changes(values)
    assert len(changes) == 1
    change = changes[0]
    assert abs(change.index - 15) <= 1
    assert change.before == pytest.approx(10.0, abs=1.0) and change.after == pytest.approx(15.0, abs=1.0)
    assert change.relative == pytest.approx(0.5, abs=0.15)


def test_no_change_in_pure_noise():
    rng = random.Random(1234)
    series = [noisy(rng, 3.0, n, 0.2) for n in (6, 10, 20, 40, 80) for _ in range(20)]
    false_alarms = sum(bool(detect_changes(values)) for values in series)
    assert false_alarms <= 3  # of 100 series (measured rate 0–2 %)


def test_fit_levels_are_segment_medians():
    values = [1.0, 1.2, 0.9, 1.1, 1.0, 3.0, 3.1, 2.9, 3.0]
    fit = fit_steps(values)
    assert [c.index for c in fit.changes] == [5]
    assert fit.levels == (1.0,) * 5 + (3.0,) * 4
    assert fit.penalty == pytest.approx(PENALTY_SCALE * fit.noise)
    assert noise_scale(values) > 0


def test_outlier_mid_history_is_no_level_but_a_new_last_run_is():
    steady = [2.0, 2.02, 1.98, 2.01, 1.99, 2.0, 2.02, 1.98, 2.01, 1.99]
    assert detect_changes(steady[:5] + [9.0] + steady[5:]) == []  # one wild run in the middle
    last = detect_changes(steady + [9.0])  # the newest run at a new level
    assert [(c.index, c.after) for c in last] == [(10, 9.0)]


def test_deterministic_series():
    assert detect_changes([1.5] * 12) == []
    assert detect_changes([1.5] * 12 + [1.5 + 1e-12]) == []  # round-off is no change
    assert [c.index for c in detect_changes([1.5] * 8 + [1.6] * 4)] == [8]  # exact repeats: any step is real


def test_edge_cases():
    assert fit_steps([]).changes == () and fit_steps([]).levels == ()
    assert detect_changes([4.0]) == [] and detect_changes([4.0, 4.0]) == []
    assert detect_changes([1.0, 2.0, 3.0, 4.0], penalty=0.0)  # no penalty: every step pays
    with pytest.raises(ValueError):
        fit_steps([1.0, float("nan")])
