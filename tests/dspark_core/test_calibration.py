import math

import numpy as np
import pytest
import torch

from dspark_core.calibration import (
    CalibrationReport,
    OnlineCalibrator,
    cumulative_survival,
    default_sts_grid,
    expected_calibration_error,
    fit_sts,
    fit_sts_level,
)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _simulate(true_logits: torch.Tensor, num_verified: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Accept draft k with probability sigmoid(true_k) given all before it were; stop at num_verified."""
    num_cycles, gamma = true_logits.shape
    u = torch.rand(num_cycles, gamma, generator=gen, dtype=torch.float64)
    accepted = u < torch.sigmoid(true_logits.double())  # [num_cycles, gamma]
    run = torch.cumprod(accepted.long(), dim=1).sum(dim=1)  # leading accepts
    return torch.minimum(run, num_verified)


def _random_cycles(num_cycles: int, gamma: int, seed: int, scale: float = 2.0, shift: float = 1.0):
    gen = torch.Generator().manual_seed(seed)
    conf_logits = torch.randn(num_cycles, gamma, generator=gen, dtype=torch.float64) * scale + shift
    num_verified = torch.randint(0, gamma + 1, (num_cycles,), generator=gen)
    return conf_logits, num_verified, gen


def _overconfident(num_cycles: int, factors: list[float], seed: int):
    """Raw logits are `factors` times too large: the true acceptance logit is raw / factor."""
    gamma = len(factors)
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randn(num_cycles, gamma, generator=gen, dtype=torch.float64) * 4.0 + 3.0
    num_verified = torch.randint(1, gamma + 1, (num_cycles,), generator=gen)
    num_accepted = _simulate(raw / torch.tensor(factors, dtype=torch.float64), num_verified, gen)
    return raw, num_verified, num_accepted


def _numpy_reference(conf_logits, temperatures, num_verified, num_accepted, num_bins):
    """Independent ECE / Brier / table: explicit loops over cycles, positions and bins, no masks."""
    c = conf_logits.numpy()
    t = temperatures.numpy()
    nv = num_verified.numpy()
    na = num_accepted.numpy()
    num_cycles, gamma = c.shape
    eces, briers, counts = [], [], []
    table = np.full((gamma, num_bins, 3), np.nan)
    for j in range(gamma):
        preds, outs = [], []
        for n in range(num_cycles):
            if nv[n] < j + 1:
                continue
            a = 1.0
            for i in range(j + 1):
                a *= 1.0 / (1.0 + math.exp(-c[n, i] / t[i]))
            preds.append(a)
            outs.append(1.0 if na[n] >= j + 1 else 0.0)
        counts.append(len(preds))
        if not preds:
            eces.append(np.nan)
            briers.append(np.nan)
            continue
        ece = 0.0
        for b in range(num_bins):
            members = [
                k for k, p in enumerate(preds) if min(int(math.floor(p * num_bins)), num_bins - 1) == b
            ]
            if not members:
                table[j, b, 0] = 0
                continue
            mp = sum(preds[k] for k in members) / len(members)
            mr = sum(outs[k] for k in members) / len(members)
            table[j, b] = (len(members), mp, mr)
            ece += len(members) / len(preds) * abs(mp - mr)
        eces.append(ece)
        briers.append(sum((p - o) ** 2 for p, o in zip(preds, outs)) / len(preds))
    w = np.array(counts, dtype=float)
    ok = w > 0
    overall_ece = float(np.sum(np.array(eces)[ok] * w[ok]) / w.sum())
    overall_brier = float(np.sum(np.array(briers)[ok] * w[ok]) / w.sum())
    return np.array(eces), np.array(briers), np.array(counts), overall_ece, overall_brier, table


@pytest.mark.parametrize("seed,num_bins", [(0, 20), (1, 20), (2, 7)])
def test_ece_and_brier_match_numpy_loops(seed: int, num_bins: int) -> None:
    gamma = 6
    conf_logits, num_verified, gen = _random_cycles(300, gamma, seed)
    num_verified[:5] = 0  # some cycles with nothing verified
    num_accepted = (torch.rand(300, generator=gen) * (num_verified + 1)).long()  # 0..num_verified
    temperatures = torch.rand(gamma, generator=gen, dtype=torch.float64) * 3 + 0.3

    report = expected_calibration_error(conf_logits, num_verified, num_accepted, temperatures, num_bins)
    eces, briers, counts, ece, brier, table = _numpy_reference(
        conf_logits, temperatures, num_verified, num_accepted, num_bins
    )
    assert report.num_observed.tolist() == counts.tolist()
    np.testing.assert_allclose(report.ece_per_position.numpy(), eces, rtol=0, atol=1e-12)
    np.testing.assert_allclose(report.brier_per_position.numpy(), briers, rtol=0, atol=1e-12)
    assert report.ece == pytest.approx(ece, abs=1e-12)
    assert report.brier == pytest.approx(brier, abs=1e-12)
    np.testing.assert_array_equal(report.bin_counts.numpy(), table[:, :, 0])
    np.testing.assert_allclose(report.bin_mean_predicted.numpy(), table[:, :, 1], atol=1e-12)
    np.testing.assert_allclose(report.bin_mean_realised.numpy(), table[:, :, 2], atol=1e-12)


def test_hand_checked_example() -> None:
    # gamma = 2, four cycles; survivals chosen away from bin edges (20 bins of width 0.05).
    conf_logits = torch.tensor(
        [
            [_logit(0.82), _logit(0.5)],  # a = (0.82, 0.41), verified 2, accepted 2 -> y = (1, 1)
            [_logit(0.82), _logit(0.5)],  # a = (0.82, 0.41), verified 2, accepted 1 -> y = (1, 0)
            [_logit(0.62), 5.0],  # a_1 = 0.62, verified 1, accepted 0 -> y_1 = 0; position 2 unobserved
            [_logit(0.9), -5.0],  # verified 0: contributes nothing
        ],
        dtype=torch.float64,
    )
    num_verified = torch.tensor([2, 2, 1, 0])
    num_accepted = torch.tensor([2, 1, 0, 0])
    report = expected_calibration_error(conf_logits, num_verified, num_accepted)

    # Position 1: bin 16 holds {0.82, 0.82} with outcomes {1, 1}; bin 12 holds {0.62} with outcome {0}.
    ece_1 = (2 * 0.18 + 1 * 0.62) / 3
    # Position 2: bin 8 holds {0.41, 0.41} with outcomes {1, 0}: |0.41 - 0.5|.
    ece_2 = 0.09
    assert report.num_observed.tolist() == [3, 2]
    assert report.ece_per_position.tolist() == pytest.approx([ece_1, ece_2], abs=1e-12)
    assert report.ece == pytest.approx((3 * ece_1 + 2 * ece_2) / 5, abs=1e-12)  # 0.232
    assert report.ece == pytest.approx(0.232, abs=1e-12)
    brier_1 = (2 * 0.18**2 + 0.62**2) / 3
    brier_2 = (0.59**2 + 0.41**2) / 2
    assert report.brier_per_position.tolist() == pytest.approx([brier_1, brier_2], abs=1e-12)
    assert report.brier == pytest.approx((3 * brier_1 + 2 * brier_2) / 5, abs=1e-12)

    rows = report.reliability_rows()
    assert [(r["position"], r["bin"], r["count"]) for r in rows] == [(1, 12, 1), (1, 16, 2), (2, 8, 2)]
    assert rows[1]["mean_predicted"] == pytest.approx(0.82)
    assert rows[1]["mean_realised"] == 1.0
    assert rows[2]["bin_lo"] == pytest.approx(0.40) and rows[2]["bin_hi"] == pytest.approx(0.45)
    assert len(report.reliability_rows(include_empty=True)) == 2 * 20
    assert report.position_rows()[1] == {
        "position": 2,
        "num_observed": 2,
        "ece": pytest.approx(0.09),
        "brier": pytest.approx(brier_2),
    }


def test_bin_edge_convention() -> None:
    # sigmoid(+inf-ish) = 1.0 exactly must land in the last bin, not overflow; p = 0 in the first.
    conf_logits = torch.tensor([[100.0], [-800.0]], dtype=torch.float64)
    report = expected_calibration_error(conf_logits, torch.tensor([1, 1]), torch.tensor([1, 0]), num_bins=4)
    assert report.bin_counts.tolist() == [[1, 0, 0, 1]]
    assert report.ece == pytest.approx(0.0, abs=1e-12)
    # Exact edges go up: a_1 = 0.5 and a_2 = 0.25 (exact in binary) land in bins 10 and 5 of 20, not 9 and 4.
    report = expected_calibration_error(torch.zeros(1, 2), torch.tensor([2]), torch.tensor([2]))
    assert report.bin_counts[0].nonzero().flatten().tolist() == [10]
    assert report.bin_counts[1].nonzero().flatten().tolist() == [5]


def test_unverified_positions_are_excluded() -> None:
    gamma = 5
    conf_logits, num_verified, gen = _random_cycles(400, gamma, seed=3)
    num_accepted = (torch.rand(400, generator=gen) * (num_verified + 1)).long()
    unobserved = torch.arange(1, gamma + 1)[None, :] > num_verified[:, None]  # [num_cycles, gamma]
    assert unobserved.any() and (~unobserved).any()

    changed = conf_logits.clone()
    changed[unobserved] = torch.randn(int(unobserved.sum()), generator=gen, dtype=torch.float64) * 10
    a = expected_calibration_error(conf_logits, num_verified, num_accepted)
    b = expected_calibration_error(changed, num_verified, num_accepted)
    assert torch.equal(a.ece_per_position, b.ece_per_position)
    assert torch.equal(a.brier_per_position, b.brier_per_position)
    assert torch.equal(a.bin_counts, b.bin_counts)
    assert torch.equal(
        fit_sts(conf_logits, num_verified, num_accepted), fit_sts(changed, num_verified, num_accepted)
    )

    # Control: the same edit on observed positions does change the result, so the test can fail.
    changed_observed = conf_logits.clone()
    changed_observed[~unobserved] += 1.5
    c = expected_calibration_error(changed_observed, num_verified, num_accepted)
    assert not torch.equal(a.ece_per_position, c.ece_per_position)


def test_position_with_no_observations_is_nan_and_keeps_unit_temperature() -> None:
    gamma = 5
    conf_logits, _, gen = _random_cycles(500, gamma, seed=4)
    num_verified = torch.randint(0, 3, (500,), generator=gen)  # positions 3..5 never verified
    num_accepted = _simulate(conf_logits / 2, num_verified, gen)
    report = expected_calibration_error(conf_logits, num_verified, num_accepted)
    assert report.num_observed[2:].tolist() == [0, 0, 0]
    assert torch.isnan(report.ece_per_position[2:]).all()
    assert not torch.isnan(report.ece_per_position[:2]).any()
    assert math.isfinite(report.ece)
    temps = fit_sts(conf_logits, num_verified, num_accepted)
    assert temps[2:].tolist() == [1.0, 1.0, 1.0]
    assert (temps[:2] > 1.0).all()


def test_flat_ece_ties_break_to_unit_temperature() -> None:
    # Zero logits give sigmoid = 0.5 whatever T, so ECE is flat in T and the tie-break decides.
    gen = torch.Generator().manual_seed(5)
    conf_logits = torch.zeros(200, 3, dtype=torch.float64)
    num_verified = torch.full((200,), 3)
    num_accepted = torch.randint(0, 4, (200,), generator=gen)
    assert fit_sts(conf_logits, num_verified, num_accepted).tolist() == [1.0, 1.0, 1.0]


def test_default_grid() -> None:
    grid = default_sts_grid()
    assert 200 <= grid.numel() <= 500
    assert (grid == 1.0).sum() == 1
    assert grid.min() == pytest.approx(0.05) and grid.max() == pytest.approx(20.0)
    assert (grid.diff() > 0).all()


def test_perfectly_calibrated_data_has_small_ece() -> None:
    gamma = 5
    conf_logits, num_verified, gen = _random_cycles(20000, gamma, seed=6)
    num_accepted = _simulate(conf_logits, num_verified, gen)
    report = expected_calibration_error(conf_logits, num_verified, num_accepted)
    assert report.ece < 0.015
    assert (report.ece_per_position < 0.025).all()

    # Same logits, outcomes from a 2.5x less confident truth: the metric must notice.
    underconfident_truth = _simulate(conf_logits / 2.5, num_verified, gen)
    wrong = expected_calibration_error(conf_logits, num_verified, underconfident_truth)
    assert wrong.ece > 0.05


def test_sts_fixes_overconfidence_on_held_out_data() -> None:
    factors = [2.5, 1.5, 3.0, 2.0, 1.8]
    train = _overconfident(20000, factors, seed=7)
    test = _overconfident(20000, factors, seed=8)
    temps = fit_sts(*train)

    assert temps.shape == (len(factors),)
    assert (temps > 1.0).all()
    # Position 1 sees the truth directly, so it should land close to its factor.
    assert temps[0].item() == pytest.approx(factors[0], rel=0.2)

    raw = expected_calibration_error(*test)
    calibrated = expected_calibration_error(*test, temperatures=temps)
    assert raw.ece > 0.05
    assert calibrated.ece < 0.5 * raw.ece
    assert calibrated.ece < 0.02
    assert (calibrated.ece_per_position < raw.ece_per_position).all()
    assert calibrated.brier < raw.brier

    # Order within each position is kept, and survival still decreases along the block.
    test_logits = test[0]
    scaled = test_logits / temps
    assert torch.equal(torch.argsort(test_logits, dim=0), torch.argsort(scaled, dim=0))
    survival = cumulative_survival(test_logits, temps)
    assert (survival.diff(dim=1) <= 0).all()


def test_sts_position_one_is_grid_optimal() -> None:
    # Brute force over a small grid through the public report: the fit must pick the minimiser of ECE_1.
    train = _overconfident(3000, [2.0, 1.5], seed=9)
    grid = torch.tensor([0.5, 1.0, 1.7, 2.0, 2.4, 4.0], dtype=torch.float64)
    temps = fit_sts(*train, grid=grid)
    def ece_at(position: int, t_1: float, t_2: float) -> float:
        temps = torch.tensor([t_1, t_2], dtype=torch.float64)
        return expected_calibration_error(*train, temperatures=temps).ece_per_position[position].item()

    eces = [ece_at(0, t, 1.0) for t in grid.tolist()]
    assert temps[0].item() == grid[int(np.argmin(eces))].item()
    # Position 2 with T_1 fixed: also the minimiser over the grid.
    eces_2 = [ece_at(1, temps[0].item(), t) for t in grid.tolist()]
    assert temps[1].item() == grid[int(np.argmin(eces_2))].item()


def test_cumulative_survival_matches_product() -> None:
    conf_logits = torch.tensor([[0.0, _logit(0.8), _logit(0.25)]], dtype=torch.float32)
    assert cumulative_survival(conf_logits).tolist()[0] == pytest.approx([0.5, 0.4, 0.1], abs=1e-6)
    temps = torch.tensor([1.0, 2.0, 0.5])
    expected = torch.sigmoid(conf_logits / temps).cumprod(dim=1)
    assert torch.allclose(cumulative_survival(conf_logits, temps), expected)
    assert cumulative_survival(conf_logits, temps).dtype == torch.float32


def test_rejects_malformed_cycles() -> None:
    conf_logits = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        expected_calibration_error(conf_logits, torch.tensor([4, 1]), torch.tensor([0, 0]))
    with pytest.raises(ValueError):
        expected_calibration_error(conf_logits, torch.tensor([1, 1]), torch.tensor([2, 0]))
    with pytest.raises(ValueError):
        fit_sts(conf_logits, torch.tensor([1, 1]), torch.tensor([0, 0]), grid=torch.tensor([0.0, 1.0]))


def test_online_calibrator_matches_offline_fit_on_its_window() -> None:
    factors = [2.5, 1.5, 3.0, 2.0]
    stream = _overconfident(8192, factors, seed=10)
    calibrator = OnlineCalibrator(gamma=4, window=4096, refit_every=256, min_cycles=1024)

    chunk = 64
    for start in range(0, 8192, chunk):
        batch = tuple(t[start : start + chunk] for t in stream)
        refitted = calibrator.observe(*batch)
        seen = start + chunk
        if seen < 1024:
            assert not refitted
            assert calibrator.temperatures.tolist() == [1.0] * 4
            assert torch.equal(calibrator.calibrate(batch[0]), batch[0])
        elif seen == 1024:
            assert refitted and calibrator.num_fits == 1
    assert calibrator.num_buffered == 4096
    assert calibrator.num_fits == 1 + (8192 - 1024) // 256

    # The last refit happened on the last observe, over exactly the last `window` cycles.
    offline = fit_sts(*(t[-4096:] for t in stream))
    assert torch.equal(calibrator.temperatures, offline)
    # And it ends near the offline fit on the whole stream. Late positions see few cycles in a window
    # (small survival, grid search on a noisy ECE), so compare them through held-out ECE, not T.
    full = fit_sts(*stream)
    assert torch.allclose(calibrator.temperatures[:2], full[:2], rtol=0.15)
    assert (calibrator.temperatures > 1.0).all()

    test = _overconfident(8000, factors, seed=11)
    raw_ece = expected_calibration_error(*test).ece
    online_ece = expected_calibration_error(*test, temperatures=calibrator.temperatures).ece
    offline_ece = expected_calibration_error(*test, temperatures=full).ece
    assert raw_ece > 0.1
    assert online_ece < offline_ece + 0.015
    assert torch.allclose(calibrator.calibrate(test[0]), test[0] / calibrator.temperatures)


def test_online_calibrator_is_deterministic_and_bounded() -> None:
    stream = _overconfident(3000, [2.0, 2.0], seed=12)
    runs = []
    for _ in range(2):
        cal = OnlineCalibrator(gamma=2, window=1000, refit_every=500, min_cycles=600)
        for start in range(0, 3000, 300):  # one batch larger than refit_every would not matter either
            cal.observe(*(t[start : start + 300] for t in stream))
        runs.append(cal.temperatures)
    assert torch.equal(runs[0], runs[1])

    # A batch bigger than the window keeps only its tail.
    cal = OnlineCalibrator(gamma=2, window=1000, refit_every=500, min_cycles=600)
    assert cal.observe(*stream)
    assert cal.num_buffered == 1000 and cal.num_seen == 3000
    assert torch.equal(cal.temperatures, fit_sts(*(t[-1000:] for t in stream)))


def test_report_is_a_frozen_dataclass() -> None:
    report = expected_calibration_error(torch.zeros(1, 1), torch.tensor([1]), torch.tensor([1]))
    assert isinstance(report, CalibrationReport)
    with pytest.raises(AttributeError):
        report.ece = 0.0  # type: ignore[misc]


def _shifted(num_cycles: int, shifts: list[float], seed: int, factor: float = 1.0):
    """Raw logits promise too much by a level shift per position: the true acceptance logit is raw / factor − shift
    (the generalisation gap of a confidence head: every held-out position accepts less than it promises)."""
    gamma = len(shifts)
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randn(num_cycles, gamma, generator=gen, dtype=torch.float64) * 1.5 + 0.5
    num_verified = torch.randint(1, gamma + 1, (num_cycles,), generator=gen)
    truth = raw / factor - torch.tensor(shifts, dtype=torch.float64)
    return raw, num_verified, _simulate(truth, num_verified, gen)


def test_level_offsets_remove_a_shift_a_temperature_cannot() -> None:
    shifts = [0.8, 0.5, 0.6, 0.4]
    train, test = _shifted(20000, shifts, seed=11), _shifted(20000, shifts, seed=12)
    temps, offsets = fit_sts_level(*train)
    raw = expected_calibration_error(*test)
    sts_only = expected_calibration_error(*test, temperatures=fit_sts(*train))
    levelled = expected_calibration_error(*test, temperatures=temps, offsets=offsets)
    assert raw.ece > 0.05
    assert levelled.ece < 0.02
    assert levelled.ece < 0.5 * sts_only.ece  # the temperature alone leaves most of the shift
    assert levelled.brier < sts_only.brier
    # Position 1 sees the truth directly: T near 1 and the offset near −shift.
    assert offsets[0].item() == pytest.approx(-shifts[0], abs=0.15)
    assert temps[0].item() == pytest.approx(1.0, rel=0.2)
    # Order within a position is kept, survival decreases along the block.
    scaled = test[0] / temps + offsets
    assert torch.equal(torch.argsort(test[0], dim=0), torch.argsort(scaled, dim=0))
    assert (cumulative_survival(test[0], temps, offsets).diff(dim=1) <= 0).all()


def test_level_offsets_match_the_mean_on_the_fitted_set() -> None:
    # Σ a_j = Σ y_j over the observed cycles of every position: the fit's defining equation, through the public report.
    train = _shifted(5000, [0.6, 0.3, -0.4], seed=13, factor=1.7)
    temps, offsets = fit_sts_level(*train)
    survival = cumulative_survival(train[0], temps, offsets)
    positions = torch.arange(1, 4)
    observed = positions[None, :] <= train[1][:, None]
    realised = (positions[None, :] <= train[2][:, None]).double()
    for j in range(3):
        rows = observed[:, j]
        assert survival[rows, j].sum().item() == pytest.approx(realised[rows, j].sum().item(), abs=1e-6)
    # Among the grid's temperatures, the fit has the least ECE at position 1, each with its matched offset.
    grid = torch.tensor([0.5, 1.0, 1.7, 3.0], dtype=torch.float64)
    t_small, b_small = fit_sts_level(*train, grid=grid)
    eces = []
    for t in grid.tolist():
        t1, b1 = fit_sts_level(train[0][:, :1], train[1].clamp(max=1), train[2].clamp(max=1),
                               grid=torch.tensor([t], dtype=torch.float64))
        eces.append(expected_calibration_error(train[0][:, :1], train[1].clamp(max=1), train[2].clamp(max=1),
                                               temperatures=t1, offsets=b1).ece)
    assert t_small[0].item() == grid[int(np.argmin(eces))].item()


def test_level_offsets_leave_calibrated_confidences_and_unobserved_positions_alone() -> None:
    conf_logits, _, gen = _random_cycles(30000, 4, seed=14)
    num_verified = torch.randint(0, 3, (30000,), generator=gen)  # positions 3, 4 never verified
    num_accepted = _simulate(conf_logits, num_verified, gen)
    temps, offsets = fit_sts_level(conf_logits, num_verified, num_accepted)
    assert temps[2:].tolist() == [1.0, 1.0] and offsets[2:].tolist() == [0.0, 0.0]
    assert offsets[:2].abs().max().item() < 0.1  # nothing to shift


def test_cumulative_survival_with_offsets_is_the_product() -> None:
    conf_logits = torch.tensor([[0.0, 1.0, -2.0]], dtype=torch.float64)
    temps, offsets = torch.tensor([1.0, 2.0, 0.5]), torch.tensor([0.3, -0.2, 0.0])
    expected = torch.sigmoid(conf_logits / temps + offsets).cumprod(dim=1)
    assert torch.allclose(cumulative_survival(conf_logits, temps, offsets), expected)
    report = expected_calibration_error(conf_logits, torch.tensor([3]), torch.tensor([1]), temperatures=temps,
                                        offsets=offsets)
    assert report.bin_mean_predicted[0][~torch.isnan(report.bin_mean_predicted[0])].item() == pytest.approx(
        expected[0, 0].item())
