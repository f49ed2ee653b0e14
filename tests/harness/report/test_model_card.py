"""The model card from a store run: the one τ and ECE with intervals, the ECE floor, relations judged on intervals."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from harness.gate.data import ConfidenceCycles, confidence_cycles
from harness.gate.stats import ece_table
from harness.report.model_card import (ZERO, Interval, card_json, card_rows, card_sections, ece_floor, ece_gain,
                                       ece_with_floor, pooled_calibration, relations)
from harness.store import Store
from report_fixtures import make_cell, make_result, record_run


def _run(tmp_path, accepts: dict[str, float], name: str = "card") -> tuple[Store, str]:
    store = Store.open(tmp_path / f"{name}.duckdb")
    plain = make_result(1, gamma=0, num_requests=40)
    cells = [(make_cell("plain"), plain, None)]
    for i, (drafter, accept) in enumerate(accepts.items()):
        cells.append((make_cell(drafter, 4), make_result(10 + i, gamma=4, accept=accept, confidences=drafter == "dspark",
                                                          plain=plain, num_requests=40), None))
    return store, record_run(store, cells)


def test_tau_is_the_stored_acceptance_length_with_an_interval_around_it(tmp_path):
    store, run_id = _run(tmp_path, {"dspark": 0.7, "dflash": 0.5, "eagle3": 0.3})
    with store:
        rows = {r.drafter: r for r in card_rows(store.con, run_id)}
        stored = dict(store.con.execute(
            "SELECT c.drafter, a.acceptance_length FROM v_acceptance a JOIN cells c USING (run_id, cell_id, \"repeat\") "
            "WHERE a.run_id = ? AND c.method <> 'none'", [run_id]).fetchall())
    for drafter, value in stored.items():
        tau = rows[drafter].tau
        assert tau.value == pytest.approx(value)
        assert tau.low < tau.value < tau.high
    assert rows["dspark"].confidences > 0 and rows["dflash"].confidences == 0
    assert [p for p, _ in rows["dspark"].positions] == [1, 2, 3, 4]


def test_relations_are_judged_on_the_intervals(tmp_path):
    store, run_id = _run(tmp_path, {"dspark": 0.8, "dflash": 0.5, "eagle3": 0.2})
    with store:
        ordered = relations(card_rows(store.con, run_id))
    assert [v for c, v, _ in ordered if "τ DSpark > DFlash" in c] == ["holds"]
    evidence = next(e for c, _, e in ordered if "τ DSpark > DFlash" in c)
    assert evidence.endswith("; DSpark > DFlash holds, DFlash > Eagle3-style holds, DSpark > Eagle3-style holds")
    store, run_id = _run(tmp_path, {"dspark": 0.2, "dflash": 0.5, "eagle3": 0.8}, name="reversed")
    with store:
        rows = card_rows(store.con, run_id)
        reversed_ = relations(rows)
        text = "\n".join(card_sections(rows))
    assert [v for c, v, _ in reversed_ if "τ DSpark > DFlash" in c] == ["does not hold"]
    assert "DSpark > Eagle3-style does not hold" in next(e for c, _, e in reversed_ if "τ DSpark > DFlash" in c)
    assert "## Calibration" in text and "does not hold" in text


def _cycles(logits: np.ndarray, accepted: np.ndarray) -> ConfidenceCycles:
    n, gamma = logits.shape
    return ConfidenceCycles(prompt_keys=tuple(f"p{i}" for i in range(n)), units=tuple(f"p{i}" for i in range(n)),
                            prompt_index=np.arange(n), repeat=np.zeros(n, dtype=np.int64), logits=logits,
                            num_verified=np.full(n, gamma), num_accepted=accepted)


def test_a_calibrated_predictor_sits_at_its_floor_and_a_miscalibrated_one_far_above_it():
    rng = np.random.default_rng(3)
    n, gamma = 400, 4
    logits = rng.normal(0.5, 1.5, size=(n, gamma))
    survival = np.cumprod(1 / (1 + np.exp(-logits)), axis=1)
    # outcomes drawn from the confidences: each position's acceptance has probability a_j exactly
    u = rng.random(n)
    calibrated = (survival > u[:, None]).sum(axis=1)  # a_j decreasing, so y_j = u < a_j is a prefix
    unit = np.arange(n)
    floor = ece_floor(_cycles(logits, calibrated), None, unit, n, draws=50)
    ece = float(ece_table(logits, np.full(n, gamma), calibrated, unit, n).ece(np.ones((1, n)))[0])
    assert 0.5 * floor < ece < 2.0 * floor
    never = np.zeros(n, dtype=np.int64)  # nothing ever accepted: confidences far above outcomes
    ece_bad = float(ece_table(logits, np.full(n, gamma), never, unit, n).ece(np.ones((1, n)))[0])
    assert ece_bad > 5 * floor


def test_the_mean_gap_tells_a_level_shift_from_scatter():
    """Outcomes accepted with probability 0.7·σ(c) at every position: every confidence promises too much, so the
    mean gap a − y is positive beyond its interval and carries most of the ECE; outcomes drawn from the confidences
    themselves leave a gap whose interval holds 0, though their ECE (the floor's noise) does not vanish."""
    rng = np.random.default_rng(11)
    n, gamma = 600, 4
    logits = rng.normal(0.0, 1.5, size=(n, gamma))
    conditional = 1 / (1 + np.exp(-logits))
    u = rng.random((n, gamma))
    shifted = np.cumprod(u < 0.7 * conditional, axis=1).sum(axis=1)
    faithful = np.cumprod(u < conditional, axis=1).sum(axis=1)
    over, fair = ece_with_floor(_cycles(logits, shifted), None), ece_with_floor(_cycles(logits, faithful), None)
    assert over.mean_gap.low > 0.03 and over.mean_gap.value > 0.6 * over.ece.value
    assert fair.mean_gap.low < 0 < fair.mean_gap.high and fair.ece.value > 0
    survival = np.cumprod(conditional, axis=1)
    direct = np.mean([survival[i, j] - (shifted[i] > j) for i in range(n) for j in range(gamma)])
    assert over.mean_gap.value == pytest.approx(direct)


def test_the_calibration_claim_is_judged_on_the_paired_gain():
    """Outcomes drawn from σ(c / 2): STS at T = 2 is the truth, so the paired gain lies above 0; 'calibrating'
    with T = 1 changes nothing, so its gain is exactly 0 and the claim is an overlap, not a hold."""
    rng = np.random.default_rng(5)
    n, gamma = 300, 4
    logits = rng.normal(1.0, 2.0, size=(n, gamma))
    survival = np.cumprod(1 / (1 + np.exp(-logits / 2.0)), axis=1)
    accepted = (survival > rng.random(n)[:, None]).sum(axis=1)
    unit, verified = np.arange(n), np.full(n, gamma)
    raw = ece_table(logits, verified, accepted, unit, n)
    gain = ece_gain(raw, ece_table(logits, verified, accepted, unit, n, np.full(gamma, 2.0)))
    assert gain.low is not None and gain.low > 0 and gain.above(ZERO) is True
    same = ece_gain(raw, ece_table(logits, verified, accepted, unit, n, np.ones(gamma)))
    assert same.value == pytest.approx(0.0) and same.above(ZERO) is None
    assert Interval(-0.01, -0.02, -0.005).above(ZERO) is False and Interval(0.01).above(ZERO) is None


def test_an_ece_gain_too_small_to_print_is_not_a_hold(tmp_path):
    """STS pinned at its bound moves ECE by ~1e-4 with a tight interval: wholly above 0, yet nothing the card
    can show (it prints 0.000 [0.000, 0.000]); only a gain beyond the printed resolution holds."""
    store, run_id = _run(tmp_path, {"dspark": 0.8, "dflash": 0.5, "eagle3": 0.2})
    with store:
        rows = card_rows(store.con, run_id)
    dspark = next(r for r in rows if r.drafter == "dspark")

    def verdict(gain: Interval) -> str:
        row = replace(dspark, ece_raw=Interval(0.05, 0.04, 0.06), ece_calibrated=Interval(0.04, 0.03, 0.05), ece_gain=gain)
        return next(v for c, v, _ in relations([row]) if "ECE calibrated < raw" in c)

    assert verdict(Interval(0.0002, 0.0001, 0.0003)) == "overlap"
    assert verdict(Interval(0.01, 0.004, 0.02)) == "holds"
    assert verdict(Interval(-0.01, -0.02, -0.004)) == "does not hold"


def test_the_ece_goal_is_judged_on_one_ece_over_every_task_pooled(tmp_path):
    """Two T = 1 tasks: the pooled ECE is the ECE of their cycles measured together (each cell's conversations
    its own units), not a mean of the two per-task ECEs; the goal's verdict reads its interval against 2%."""
    store = Store.open(tmp_path / "pooled.duckdb")
    plain = make_result(1, gamma=0, num_requests=40)
    cells = [(make_cell("plain", 0, task=t, temperature=1.0), plain, None) for t in ("gsm8k", "mt_bench")]
    cells += [(make_cell("dspark", 4, task=t, temperature=1.0),
               make_result(20 + i, gamma=4, accept=a, confidences=True, plain=plain, num_requests=40), None)
              for i, (t, a) in enumerate((("gsm8k", 0.8), ("mt_bench", 0.4)))]
    run_id = record_run(store, cells)
    with store:
        rows = [r for r in card_rows(store.con, run_id) if r.drafter == "dspark"]
        pooled = pooled_calibration(store.con, run_id, temperature=1.0)
        assert pooled_calibration(store.con, run_id, temperature=0.0) is None  # no T = 0 cell
        parts = [confidence_cycles(store.con, run_id, r.cell_id) for r in rows]
    assert pooled is not None and pooled.tasks == ("gsm8k", "mt_bench") and pooled.cells == 2
    assert pooled.raw.confidences == sum(r.confidences for r in rows) > 0
    logits = np.concatenate([c.logits for c in parts])
    verified = np.concatenate([c.num_verified for c in parts])
    accepted = np.concatenate([c.num_accepted for c in parts])
    units = np.concatenate([c.prompt_index + 1000 * i for i, c in enumerate(parts)])
    _, unit = np.unique(units, return_inverse=True)
    direct = ece_table(logits, verified, accepted, unit, int(unit.max()) + 1)
    assert pooled.raw.ece.value == pytest.approx(float(direct.ece(np.ones((1, int(unit.max()) + 1)))[0]))
    weighted = sum(r.ece_raw.value * r.confidences for r in rows) / pooled.raw.confidences
    assert pooled.raw.ece.value != pytest.approx(weighted)
    assert pooled.raw.ece.low <= pooled.raw.ece.value <= pooled.raw.ece.high

    def verdict(ece: Interval, n: int = 20_000) -> str:
        measure = pooled.calibrated._replace(ece=ece, confidences=n)
        return next(v for c, v, _ in relations(rows, replace(pooled, calibrated=measure)) if "≤ 2%" in c)

    assert verdict(Interval(0.012, 0.010, 0.018)) == "holds"
    assert verdict(Interval(0.018, 0.015, 0.030)) == "overlap"  # the point below 2%, the interval not
    assert verdict(Interval(0.040, 0.030, 0.050)) == "does not hold"
    assert verdict(Interval(0.012, 0.010, 0.018), n=9_000) == "too few confidences"
    text = "\n".join(card_sections(rows, pooled))
    assert "gsm8k + mt_bench (pooled)" in text and "not a mean of their ECEs" in text
    card = json.loads(card_json(rows, pooled))  # every cell an object of one shape, the pooled ECE its own part
    assert [c["cell_id"] for c in card["cells"]] == [r.cell_id for r in rows]
    assert card["pooled_calibration"]["tasks"] == ["gsm8k", "mt_bench"]
    assert card["pooled_calibration"]["ece_raw"]["value"] == pytest.approx(pooled.raw.ece.value)
    assert card["pooled_calibration"]["mean_gap_raw"]["value"] == pytest.approx(pooled.raw.mean_gap.value)
    assert {"mean_gap_raw", "mean_gap_calibrated"} <= set(card["cells"][0])
    assert json.loads(card_json(rows))["pooled_calibration"] is None


def _rounds_run(tmp_path, name: str, seeds: tuple[int, ...]) -> tuple[Store, str]:
    """One dspark cell measured in len(seeds) rounds; equal seeds make a round replay the one before it."""
    import datetime as dt

    from harness.store import new_run_id
    from report_fixtures import T0, run_info

    store = Store.open(tmp_path / f"{name}.duckdb")
    run_id = store.begin_run(run_info("card"), run_id=new_run_id(T0), started_at=T0)
    cell = make_cell("dspark", 4)
    for repeat, seed in enumerate(seeds):
        result = make_result(seed, gamma=4, accept=0.6, confidences=True, num_requests=40)
        store.record_cell(run_id, cell, repeat, result=result, error=None, started_at=T0,
                          finished_at=T0 + dt.timedelta(seconds=5),
                          comparability_key="k")
    store.finish_run(run_id)
    return store, run_id


def test_rounds_that_replay_one_another_count_once(tmp_path):
    """Greedy rounds ignore their sampling seeds, so a deterministic engine decodes the same conversations again: the card's
    ratios are the same with or without the copy, its counts, α_k intervals and ECE floor are one round's."""
    from harness.gate.data import replayed_rounds

    cards = {}
    for name, seeds in (("one", (3,)), ("replayed", (3, 3)), ("two", (3, 4))):
        store, run_id = _rounds_run(tmp_path, name, seeds)
        with store:
            cards[name] = (card_rows(store.con, run_id)[0], replayed_rounds(store.con, run_id))
    (one, _), (replayed, replay), (two, not_replayed) = cards["one"], cards["replayed"], cards["two"]
    assert [(r.rounds, r.first) for r in replay.values()] == [(2, 0)] and not not_replayed
    assert replayed.tau.value == pytest.approx(one.tau.value) and replayed.drafting_steps == one.drafting_steps
    assert replayed.confidences == one.confidences and two.confidences > one.confidences
    assert replayed.positions == one.positions
    assert replayed.ece_raw == one.ece_raw and replayed.ece_calibrated == one.ece_calibrated
