"""A rebuilt card against the committed one: figures judged on the committed intervals, chance misses allowed,
cells and figures present in one card only failing the comparison."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from recipes.real.compare import binomial_tail, compare, differs, main

COMMITTED = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m"


def _build_dir(root: Path, card: dict | list, draft_bytes: bytes = b"weights", train_seconds: float = 573.2) -> Path:
    """A build directory holding `card` and one small draft (the comparison reads the drafts' bytes)."""
    (root / "drafts" / "dspark").mkdir(parents=True)
    (root / "drafts" / "dspark" / "model.safetensors").write_bytes(draft_bytes)
    config = {"method": "dspark", "extra": {"report": {"heldout_acceptance": 0.302, "train_seconds": train_seconds}}}
    (root / "drafts" / "dspark" / "draft_config.json").write_text(json.dumps(config))
    (root / "card.json").write_text(json.dumps(card))
    return root


@pytest.fixture
def card() -> dict:
    return json.loads((COMMITTED / "card.json").read_text())


def test_the_committed_card_reproduces_itself(tmp_path, card):
    a, b = _build_dir(tmp_path / "a", card), _build_dir(tmp_path / "b", card, train_seconds=1236.9)
    r = compare(a, b)  # the same weights trained in another time: the same drafts
    assert r.same_drafts and r.reproduced and not r.outside and not r.unmatched
    assert len(r.judged) > 100  # τ, α_k and ECE of every cell, the pooled ECE
    assert {c.figure for c in r.judged} >= {"tau", "alpha_1", "alpha_7", "ece_raw", "ece_calibrated"}
    assert any(c.point.startswith("pooled T1") for c in r.judged)
    # α_k = 0 of 0 successes sits on a Wilson bound computed as ±1e-17: within, not outside
    zero = [c for c in r.judged if c.committed == 0.0]
    assert zero and all(c.verdict == "within" for c in zero)


def _shift(figure: dict, by: float) -> dict:
    """The figure measured again `by` higher, its interval moved with it (a redraw carries its own interval)."""
    return {k: (v + by if v is not None else None) for k, v in figure.items()}


def test_a_few_misses_are_chance_and_many_are_not(tmp_path, card):
    moved = copy.deepcopy(card)
    dspark = [c for c in moved["cells"] if c["drafter"] == "dspark"]
    for c in dspark[:2]:  # two τ far beyond both intervals: what a faithful redraw does now and then
        c["tau"] = _shift(c["tau"], 0.5)
    r = compare(_build_dir(tmp_path / "a", card), _build_dir(tmp_path / "b", moved, b"other weights"))
    assert not r.same_drafts
    assert [c.figure for c in r.outside] == ["tau", "tau"] and r.reproduced
    for c in moved["cells"]:  # every τ and α_k moved: a different draft, not chance
        c["tau"] = _shift(c["tau"], 0.5)
        c["positions"] = [[k, _shift(v, 0.2)] for k, v in c["positions"]]
    shutil.rmtree(tmp_path / "b")
    r = compare(tmp_path / "a", _build_dir(tmp_path / "b", moved))
    assert not r.reproduced and r.chance_p < 0.01 and len(r.outside) > 50


def test_a_figure_is_judged_by_the_difference_of_two_measurements_not_by_one_interval():
    """Two faithful measurements 1.3 half-widths apart: the second point is outside the first's interval, but the
    difference (√2 half-widths of noise) is not beyond its own 95% interval; the same gap on intervals half as wide is."""
    assert not differs(2.0, 1.8, 2.2, 2.26, 2.06, 2.46)
    assert differs(2.0, 1.9, 2.1, 2.26, 2.16, 2.36)
    # Only the half-widths that face each other count (ECE's and ratios' intervals are lopsided): long tails pointing
    # away widen nothing, either way round; a long tail pointing at the other figure does.
    assert differs(0.06, 0.059, 0.10, 0.05, 0.02, 0.051) and differs(0.05, 0.02, 0.051, 0.06, 0.059, 0.10)
    assert not differs(0.06, 0.059, 0.10, 0.05, 0.049, 0.08)
    assert not differs(0.0, -1e-17, 0.01, 0.0, 0.0, 0.012)  # two zero counts


def test_a_cell_or_figure_in_one_card_only_fails(tmp_path, card):
    fewer = copy.deepcopy(card)
    dropped = fewer["cells"].pop(0)
    r = compare(_build_dir(tmp_path / "a", card), _build_dir(tmp_path / "b", fewer))
    assert not r.reproduced and r.unmatched == [
        f"inhouse/{dropped['task']} T{dropped['temperature']:g} c{dropped['concurrency']} {dropped['drafter']} "
        f"γ{dropped['gamma']} {dropped['policy']}: in the committed card only"]
    lost = copy.deepcopy(card)
    cell = next(c for c in lost["cells"] if c["confidences"])
    cell["ece_calibrated"] = {"value": None, "low": None, "high": None}
    r = compare(tmp_path / "a", _build_dir(tmp_path / "c", lost))
    assert not r.reproduced and [(c.figure, c.verdict) for c in r.missing] == [("ece_calibrated", "missing")]


def test_the_command_exits_by_the_verdict_and_names_an_unreadable_card(tmp_path, card, capsys):
    a = _build_dir(tmp_path / "a", card)
    assert main([str(a), str(a)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("reproduced: 0 of ")
    old = _build_dir(tmp_path / "old", card["cells"])  # a list: the shape before card.json named its parts
    assert main([str(a), str(old)]) == 2
    assert f"{old / 'card.json'}: no `cells`" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "nowhere")]) == 2
    assert "not a readable card" in capsys.readouterr().err


def test_binomial_tail():
    assert binomial_tail(0, 10, 0.05) == 1.0
    assert binomial_tail(10, 10, 0.5) == pytest.approx(0.5**10)
    assert binomial_tail(1, 3, 0.5) == pytest.approx(1 - 0.125)
