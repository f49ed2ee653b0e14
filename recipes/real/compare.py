"""Does a rebuilt model card reproduce the committed one? Every figure of the rebuilt card.json against the
committed card's figure for the same point, each with its 95% interval.

    python -m recipes.real.compare models/smollm2-135m /tmp/rebuild

Cells are matched by what they measure (backend, task, drafter, γ, policy, temperature, concurrency), never by
cell id: a build elsewhere names its drafts by path, so its suite and its cell ids differ. The drafts are
compared first, file by file, with the one wall-clock figure they record (`train_seconds`) left out: the build is
deterministic for a seed, so a rebuild on the same kind of CPU trains the same weights, and then τ, α_k and ECE are measured on the same drafts
and prompts (at T = 0 the same greedy walk) while speedups move with the machine. Each figure is *within*,
*outside*, has *no interval* to be judged by (a speedup of fewer than 6 rounds), or is *missing* from one card
(which fails the comparison, as a cell in one card only does).

Both cards are measurements, each with its own noise, so a figure is judged by the difference of the two: it is
*outside* when the difference is beyond its own 95% interval, the two half-widths that face each other combined in
quadrature (the interval of a difference of independent estimates). Judging the rebuilt point against the
committed interval alone, as this did before, ignores the rebuilt card's noise: an independent redraw of a
faithful build lands outside the other's 95% interval about 17% of the time (|Z| > 1.96/√2), not 5% (an AMD
re-measure of the AMX card put 30 of 206 figures "outside", 11 of 204 by the difference).

A reproduction is judged on the count outside: a faithful redraw puts about 5% of its figures outside, so the
comparison fails only when more land outside than a 5% rate explains (one-sided binomial test at 1%; the figures
of one cell are correlated, which makes the test lenient, never strict). Exit 0: reproduced; 1: not; 2: a card
could not be read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path


KEY = ("backend", "task", "drafter", "gamma", "policy", "temperature", "concurrency")
INTERVAL_FIGURES = ("tau", "ece_raw", "ece_calibrated", "speedup")
CHANCE_OUTSIDE = 0.05  # a 95% interval misses an independent redraw this often
TEST_LEVEL = 0.01


@dataclass(frozen=True)
class FigureCheck:
    """One figure of the rebuilt card against the committed card's, each with its 95% interval."""

    point: str  # the cell's axes, as a label
    figure: str  # tau, alpha_3, ece_calibrated, speedup, ...
    committed: float | None
    low: float | None
    high: float | None
    rebuilt: float | None
    verdict: str  # within | outside | no interval | missing
    rebuilt_low: float | None = None
    rebuilt_high: float | None = None


@dataclass(frozen=True)
class Reproduction:
    same_drafts: bool
    checks: list[FigureCheck]
    unmatched: list[str]  # cells present in one card only
    names: tuple[str, str] = ("committed", "rebuilt")  # how the two cards are named in the report

    @property
    def judged(self) -> list[FigureCheck]:
        return [c for c in self.checks if c.verdict in ("within", "outside")]

    @property
    def outside(self) -> list[FigureCheck]:
        return [c for c in self.checks if c.verdict == "outside"]

    @property
    def chance_p(self) -> float:
        """P(at least this many outside | each judged figure misses with probability 5%)."""
        return binomial_tail(len(self.outside), len(self.judged), CHANCE_OUTSIDE)

    @property
    def reproduced(self) -> bool:
        return not self.unmatched and not self.missing and self.chance_p >= TEST_LEVEL

    @property
    def missing(self) -> list[FigureCheck]:
        return [c for c in self.checks if c.verdict == "missing"]


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def read_card(root: Path) -> dict:
    """card.json of a build directory, in the shape `harness.report.model_card.card_json` writes."""
    path = root / "card.json"
    try:
        card = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable card ({e}); build one with `python -m recipes.real.build`") from e
    if not isinstance(card, dict) or "cells" not in card:
        raise ValueError(f"{path}: no `cells` (a card written before card.json named its parts); re-render it with "
                         "recipes.real.card.write_card")
    return card


def trained_fingerprint(drafts_dir: Path) -> str:
    """sha256 over the drafts' files, each draft_config.json without its `train_seconds`: what was trained, not how
    long it took (the card run's stamp, `recipes.real.build.drafts_fingerprint`, hashes the files as they are, so
    two builds of the same weights carry different stamps)."""
    def timeless(value):
        if isinstance(value, dict):
            return {k: timeless(v) for k, v in value.items() if k != "train_seconds"}
        if isinstance(value, list):
            return [timeless(v) for v in value]
        return value

    digest = hashlib.sha256()
    for path in sorted(Path(drafts_dir).rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "draft_config.json":
                data = json.dumps(timeless(json.loads(data)), sort_keys=True).encode()
            digest.update(str(path.relative_to(drafts_dir)).encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _label(cell: dict) -> str:
    return (f"{cell['backend']}/{cell['task']} T{cell['temperature']:g} c{cell['concurrency']} "
            f"{cell['drafter']} γ{cell['gamma']} {cell['policy']}")


def _check(point: str, figure: str, committed: dict | None, rebuilt: dict | None) -> FigureCheck | None:
    value = (committed or {}).get("value")
    again = (rebuilt or {}).get("value")
    if value is None and again is None:
        return None  # a figure neither card has (no confidences, no speedup for plain)
    low, high = (committed or {}).get("low"), (committed or {}).get("high")
    again_low, again_high = (rebuilt or {}).get("low"), (rebuilt or {}).get("high")
    if value is None or again is None:
        verdict = "missing"
    elif low is None or high is None or again_low is None or again_high is None:
        verdict = "no interval"
    else:
        verdict = "outside" if differs(value, low, high, again, again_low, again_high) else "within"
    return FigureCheck(point, figure, value, low, high, again, verdict, again_low, again_high)


def differs(a: float, a_low: float, a_high: float, b: float, b_low: float, b_high: float) -> bool:
    """Is b − a beyond its own 95% interval? Each estimate contributes the half-width on the side facing the other
    (intervals of ratios and of ECE are not symmetric), combined in quadrature."""
    up = b > a
    facing_a = (a_high - a) if up else (a - a_low)
    facing_b = (b - b_low) if up else (b_high - b)
    slack = 1e-9 * max(1.0, abs(a), abs(b))  # a Wilson bound of 0 successes computes as ±1e-17, not 0
    return abs(b - a) > math.hypot(max(facing_a, 0.0), max(facing_b, 0.0)) + slack


def compare(committed_dir: str | Path, rebuilt_dir: str | Path) -> Reproduction:
    committed_root, rebuilt_root = Path(committed_dir), Path(rebuilt_dir)
    committed, rebuilt = read_card(committed_root), read_card(rebuilt_root)
    same = trained_fingerprint(committed_root / "drafts") == trained_fingerprint(rebuilt_root / "drafts")
    return compare_cards(committed, rebuilt, same_drafts=same)


def compare_cards(committed: dict, rebuilt: dict, *, same_drafts: bool,
                  names: tuple[str, str] = ("committed", "rebuilt")) -> Reproduction:
    """Every figure of `rebuilt` against `committed`'s interval for the same point (both card.json objects);
    `names` say what the two cards are (a card measured again on the same drafts is not a rebuild)."""
    by_key = {tuple(c[k] for k in KEY): c for c in rebuilt["cells"]}
    seen, checks, unmatched = set(), [], []
    for cell in committed["cells"]:
        key = tuple(cell[k] for k in KEY)
        point = _label(cell)
        again = by_key.get(key)
        if again is None:
            unmatched.append(f"{point}: in the {names[0]} card only")
            continue
        seen.add(key)
        pairs = [(f, cell.get(f), again.get(f)) for f in INTERVAL_FIGURES]
        theirs = dict((k, v) for k, v in again.get("positions", []))
        pairs += [(f"alpha_{k}", v, theirs.get(k)) for k, v in cell.get("positions", [])]
        checks += [c for f, a, b in pairs if (c := _check(point, f, a, b)) is not None]
    unmatched += [f"{_label(c)}: in the {names[1]} card only" for c in rebuilt["cells"] if tuple(c[k] for k in KEY) not in seen]
    mine, theirs_pooled = committed.get("pooled_calibration"), rebuilt.get("pooled_calibration")
    if mine and theirs_pooled:
        point = f"pooled T{mine['temperature']:g} ({' + '.join(mine['tasks'])})"
        checks += [c for f in ("ece_raw", "ece_calibrated") if (c := _check(point, f, mine[f], theirs_pooled[f])) is not None]
    return Reproduction(same_drafts, checks, unmatched, names)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def report_lines(r: Reproduction, *, all_figures: bool = False) -> list[str]:
    mine, theirs = r.names
    lines = [f"drafts: {'the same weights and configuration (training time aside)' if r.same_drafts else 'different (another training)'}"]
    shown = r.checks if all_figures else [c for c in r.checks if c.verdict != "within"]
    if shown:
        lines.append(f"| point | figure | {mine} [95% interval] | {theirs} [95% interval] | verdict |")
        lines.append("|---|---|---|---|---|")
        lines += [f"| {c.point} | {c.figure} | {_num(c.committed)} [{_num(c.low)}, {_num(c.high)}] | {_num(c.rebuilt)} "
                  f"[{_num(c.rebuilt_low)}, {_num(c.rebuilt_high)}] | {c.verdict} |" for c in shown]
    lines += [f"unmatched: {u}" for u in r.unmatched]
    judged, outside = len(r.judged), len(r.outside)
    verdict = "reproduced" if r.reproduced else "NOT reproduced"
    why = (f"{outside} of {judged} figures differ from the {mine} card beyond their 95% intervals "
           f"(P = {r.chance_p:.3g} at a 5% chance rate; fails below {TEST_LEVEL:g})")
    untested = len(r.checks) - judged
    if untested:
        why += f"; {untested} without an interval, not judged"
    if r.missing:
        why += f"; {len(r.missing)} figures measured in one card only"
    if r.unmatched:
        why += f"; {len(r.unmatched)} cells in one card only"
    lines.append(f"{verdict}: {why}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.real.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("committed", help="the build directory holding the committed card.json and drafts/")
    parser.add_argument("rebuilt", help="a rebuild's directory (python -m recipes.real.build DIR)")
    parser.add_argument("--all", action="store_true", help="list every figure, not only those not within")
    args = parser.parse_args(argv)
    try:
        result = compare(args.committed, args.rebuilt)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(report_lines(result, all_figures=args.all)))
    return 0 if result.reproduced else 1


if __name__ == "__main__":
    raise SystemExit(main())
