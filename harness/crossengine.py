"""One run, two engines on the same cells: greedy outputs token for token, acceptance under one definition.

    python -m harness.crossengine --db results/harness.duckdb [--run RUN_ID] [--reference inhouse]
                                  [--tolerance 0.03]

Reads the store only (read-only). Cells of a run are paired when they differ in `backend` alone (same
target, drafter, γ, task and its whole spec, temperature, load, policy, seed). Per pair, and printed
per cell for both engines:

- outputs: the output token ids of every request (warm-up included), matched by prompt key; any
  differing request at temperature 0 fails the check — losslessness on both engines means both equal
  plain decoding, so they must equal each other;
- acceptance, from `v_acceptance` (the one definition of `harness.metrics.acceptance`: τ = 1 + accepted
  ÷ drafting steps, the window's ok requests): τ, drafting steps, drafts verified and accepted on each
  engine, and the in-house engine's draft coverage. Where the two engines draft the same way
  (`SAME_DRAFTING`) and the outputs are equal, |τ_other − τ_ref| / τ_ref above `--tolerance` fails;
  elsewhere τ is shown with the reason it is not compared.

Exit 0 when every pair agrees, 1 when outputs or acceptance differ or a cell failed, 2 when the store,
the run or the pairs are missing (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TextIO

from harness.store import Store, StoreError

# Methods whose drafts are the same on both engines, so τ must agree: our NgramDrafter follows vLLM's
# lookup rule, DraftModelDrafter is vLLM's draft_model, and our DSpark drafts run in vLLM's DSpark
# speculator as in our engine (tests/backends/vllm). vLLM's stock DFlash proposer fills the mask slots
# by another convention than our DFlash drafts are trained for (backends/vllm/export.py).
SAME_DRAFTING = ("ngram", "draft_model", "dspark")
NOT_COMPARED = {"dflash": "vLLM's DFlash slot convention differs", "none": "plain decoding"}
TOLERANCE = 0.03

_PAIR_KEY = ("target", "drafter", "method", "num_drafts", "task", "temperature", "concurrency", "rate", "policy",
             "seed", "task_spec")


@dataclass
class Side:
    """One engine's cell."""

    cell_id: str
    backend: str
    status: str
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # prompt key → output ids
    acceptance: dict[str, Any] = field(default_factory=dict)  # the v_acceptance row


@dataclass
class Pair:
    key: dict[str, Any]
    reference: Side
    other: Side

    @property
    def label(self) -> str:
        k = self.key
        drafts = f" γ{k['num_drafts']}" if k["method"] != "none" else ""
        load = f"c{k['concurrency']}" if k["concurrency"] is not None else f"r{k['rate']:g}"
        return f"{k['drafter']}{drafts}/{k['task']}/{load}"

    def output_check(self) -> tuple[int, int]:
        """(requests whose outputs are equal, requests compared)."""
        keys = sorted(set(self.reference.outputs) | set(self.other.outputs))
        equal = sum(self.reference.outputs.get(k) == self.other.outputs.get(k) for k in keys)
        return equal, len(keys)

    def tau(self, side: Side) -> float | None:
        return side.acceptance.get("acceptance_length")

    def verdict(self, tolerance: float) -> tuple[bool, str]:
        """(agrees, why)."""
        if self.reference.status != "ok" or self.other.status != "ok":
            return False, "a cell failed"
        equal, total = self.output_check()
        if total == 0:
            return False, "no requests"
        greedy = self.key["temperature"] == 0
        if greedy and equal != total:
            return False, f"greedy outputs differ on {total - equal} of {total} requests"
        method = self.key["method"]
        if method not in SAME_DRAFTING:
            return True, f"τ not compared: {NOT_COMPARED.get(method, 'the engines draft differently')}"
        if not greedy:
            return True, "τ not compared at temperature > 0"
        ref, other = self.tau(self.reference), self.tau(self.other)
        if ref is None or other is None:
            return False, "no drafting steps on one engine"
        delta = abs(other - ref) / ref
        if delta > tolerance:
            return False, f"τ differs by {delta:.1%} > {tolerance:.0%}"
        return True, f"τ within {tolerance:.0%}"


def load_pairs(store: Store, run_id: str, reference: str = "inhouse") -> list[Pair]:
    """The run's cells paired by everything but the backend, `reference` backend first."""
    columns, rows = store.query(
        """SELECT c.cell_id, c.repeat, c.backend, c.status, c.target, c.drafter, c.method, c.num_drafts, c.task,
                  c.temperature, c.concurrency, c.rate, c.policy, c.seed, (c.params -> 'task')::VARCHAR AS task_spec
           FROM cells c WHERE c.run_id = ? AND c.repeat = 0 ORDER BY c.backend, c.cell_id""", [run_id])
    cells = [dict(zip(columns, r)) for r in rows]
    acc_cols, acc_rows = store.query("SELECT * FROM v_acceptance WHERE run_id = ? AND repeat = 0", [run_id])
    acceptance = {r[acc_cols.index("cell_id")]: dict(zip(acc_cols, r)) for r in acc_rows}
    _, out_rows = store.query(
        "SELECT cell_id, prompt_key, output_ids FROM requests WHERE run_id = ? AND repeat = 0 AND error IS NULL",
        [run_id])
    outputs: dict[str, dict[str, tuple[int, ...]]] = {}
    for cell_id, prompt_key, ids in out_rows:
        outputs.setdefault(cell_id, {})[prompt_key] = tuple(ids or ())

    groups: dict[str, dict[str, Side]] = {}
    keys: dict[str, dict[str, Any]] = {}
    for c in cells:
        key = {k: c[k] for k in _PAIR_KEY}
        text = json.dumps(key, sort_keys=True, default=str)
        keys[text] = key
        groups.setdefault(text, {})[c["backend"]] = Side(c["cell_id"], c["backend"], c["status"],
                                                         outputs.get(c["cell_id"], {}), acceptance.get(c["cell_id"], {}))
    pairs = []
    for text, sides in groups.items():
        if reference not in sides:
            continue
        for backend, side in sorted(sides.items()):
            if backend != reference:
                pairs.append(Pair(keys[text], sides[reference], side))
    return pairs


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def _both(reference: Mapping[str, Any], other: Mapping[str, Any], name: str) -> str:
    return f"{reference.get(name, '—')}/{other.get(name, '—')}"


def table(pairs: Sequence[Pair], tolerance: float = TOLERANCE) -> tuple[str, bool]:
    """The per-cell table (both engines side by side) and whether every pair agrees."""
    if not pairs:
        return "", False
    ref, other = pairs[0].reference.backend, pairs[0].other.backend
    head = (f"{'cell':24} {'outputs':>9} {'τ ' + ref:>10} {'τ ' + other:>10} {'Δτ':>7} "
            f"{'drafting steps':>15} {'verified':>11} {'accepted':>11} {'coverage':>8}  verdict")
    lines = [f"acceptance under one definition: τ = 1 + accepted / drafting steps; {ref} vs {other}", head,
             "-" * len(head)]
    ok_all = True
    for p in sorted(pairs, key=lambda p: (p.key["method"], p.label)):
        a, b = p.reference.acceptance, p.other.acceptance
        equal, total = p.output_check()
        ta, tb = p.tau(p.reference), p.tau(p.other)
        delta = f"{(tb - ta) / ta:+.1%}" if ta and tb is not None else "—"
        agrees, why = p.verdict(tolerance)
        ok_all &= agrees
        lines.append(f"{p.label:24} {f'{equal}/{total}':>9} {_fmt(ta):>10} {_fmt(tb):>10} {delta:>7} "
                     f"{_both(a, b, 'drafting_steps'):>15} {_both(a, b, 'drafts_verified'):>11} "
                     f"{_both(a, b, 'drafts_accepted'):>11} "
                     f"{_fmt(a.get('draft_coverage'), '.2f'):>8}  {'ok' if agrees else 'FAIL'}: {why}")
    lines.append(f"(counts as {ref}/{other}; coverage: {ref}'s share of steps that drafted — {other} reports "
                 "drafting steps only)")
    return "\n".join(lines), ok_all


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.crossengine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="results/harness.duckdb")
    parser.add_argument("--run", help="run id (default: the newest finished run)")
    parser.add_argument("--suite", help="with no --run: the newest finished run of this suite name")
    parser.add_argument("--reference", default="inhouse", help="the backend the others are compared with")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="relative τ difference allowed (0.03)")
    args = parser.parse_args(argv)
    try:
        with Store.open(args.db, read_only=True) as store:
            run_id = args.run or store.latest_run(suite_name=args.suite)
            if run_id is None:
                print(f"crossengine: no finished run in {args.db}", file=sys.stderr)
                return 2
            pairs = load_pairs(store, run_id, args.reference)
    except (StoreError, OSError) as exc:
        print(f"crossengine: {exc}", file=sys.stderr)
        return 2
    if not pairs:
        print(f"crossengine: run {run_id} has no cells that differ only in backend ({args.reference} vs another)",
              file=sys.stderr)
        return 2
    text, ok = table(pairs, args.tolerance)
    print(f"run {run_id}", file=out)
    print(text, file=out)
    print("PASS: every pair agrees" if ok else "FAIL: see the verdicts above", file=out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
