"""`harness gate` and `harness compare`: which runs to compare, with which rules, and where the verdict goes.

The candidate is a run id or `latest` (the newest suite run, whatever its status: an unfinished run is
judged invalid, not skipped). The baseline is, in order of precedence:
- an exported run file (`*.json`, e.g. `results/baselines/ci.json` kept in the repo and updated on
  purpose with `harness baseline export`), loaded into an in-memory store;
- a run id in the store;
- `latest`: the newest finished run of the same suite before the candidate;
- otherwise a branch name: the newest finished run of the same suite on that branch.
Rules come from the suite text stored with the candidate run (what it ran is what it is judged by),
or from `--suite FILE` to try new gates on old runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from harness.gate.report import ExitCode


def _fail(message: str, code: int) -> int:
    print(f"harness: error: {message}", file=sys.stderr)
    return code


def resolve_baseline(store, ref: str, candidate: dict):
    """(store holding it, run id) for `ref`, or (None, reason)."""
    from harness.store import Store, import_run

    path = Path(ref)
    if ref.endswith(".json"):
        if not path.is_file():
            return None, f"baseline file {ref} does not exist (create it with `harness baseline export`)"
        memory = Store.open(":memory:")
        try:
            return memory, import_run(memory, path)
        except BaseException:
            memory.close()
            raise
    if store.run(ref) is not None:
        return store, ref
    same_suite = {"suite_name": candidate["suite_name"], "exclude": candidate["run_id"], "kind": None}
    if ref == "latest":
        found = store.latest_run(before=candidate["run_id"], **same_suite)
        return (store, found) if found else (None, f"no finished run of suite {candidate['suite_name']!r} before "
                                                    f"{candidate['run_id']}")
    found = store.latest_run(branch=ref, **same_suite)
    if found:
        return store, found
    return None, f"{ref!r} is neither a run id, nor a branch with a finished run of suite {candidate['suite_name']!r}"


def gate_command(db, *, run: str = "latest", baseline: str = "latest", fmt: str = "text", output: Path | None = None,
                 suite: Path | None = None) -> int:
    from harness.gate import render, run_gate
    import duckdb

    from harness.store import Store, StoreError
    from harness.store.connection import damaged
    from harness.suite import SuiteError, load_suite, parse_suite_text
    from harness.suite.errors import show

    try:
        store = Store.open(db, read_only=True)
    except StoreError as exc:
        return _fail(str(exc), ExitCode.INVALID)
    try:  # a store or baseline that breaks while being read is invalid input: one line, exit 2
        with store:
            run_id = store.latest_run(kind="suite", status=None) if run == "latest" else run
            candidate = store.run(run_id) if run_id else None
            if candidate is None:
                return _fail(f"no run {show(run)} in {db}", ExitCode.INVALID)
            rules_from = load_suite(suite) if suite else parse_suite_text(candidate["suite_text"] or "",
                                                                           f"<suite of {run_id}>")
            base_store, base_id = resolve_baseline(store, baseline, candidate)
            if base_store is None:
                print(f"NO BASELINE: {base_id}", file=sys.stderr)
                return ExitCode.NO_BASELINE
            try:
                report = run_gate((store.con, run_id), (base_store.con, base_id), rules_from.gates, rules_from.validity)
            finally:
                if base_store is not store:
                    base_store.close()
    except (StoreError, SuiteError) as exc:
        return _fail(str(exc), ExitCode.INVALID)
    except duckdb.Error as exc:
        return _fail(str(damaged(db, exc)), ExitCode.INVALID)
    text = render(report, fmt)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        print(report.summary, file=sys.stderr)
    else:
        print(text)
    return int(report.exit_code)


def compare_command(db, run_a: str, run_b: str, metrics: Sequence[str] | None = None, fmt: str = "table",
                    show_all: bool = False, out=None) -> int:
    """`harness compare A B`: the important rows (every significant change, then the largest), or `--all`."""
    from harness.gate.compare import COLUMNS, compare_table, display_row, important
    import duckdb

    from harness.gate import compare_runs
    from harness.store.connection import damaged
    from harness.store import Store, StoreError
    from harness.tables import markdown_table, write_table

    out = out if out is not None else sys.stdout
    try:
        with Store.open(db, read_only=True) as store:
            ids = []
            for ref in (run_a, run_b):
                run_id = store.latest_run(kind="suite", status=None) if ref == "latest" else ref
                if run_id is None or store.run(run_id) is None:
                    return _fail(f"no run {ref!r} in {db}", ExitCode.INVALID)
                ids.append(run_id)
            rows = compare_runs(store.con, ids[0], ids[1], metrics)
    except StoreError as exc:
        return _fail(str(exc), ExitCode.INVALID)
    except duckdb.Error as exc:
        return _fail(str(damaged(db, exc)), ExitCode.INVALID)
    shown = rows if show_all or metrics else important(rows)
    if fmt in ("csv", "json"):  # machine formats: raw numbers, every row
        columns = ["cell_id", "label", "metric", "unit", "direction", "a", "b", "change", "scale", "effect",
                   "ci_low", "ci_high", "p_value", "verdict", "test", "n"]
        write_table(columns, [(r.cell_id, r.label, r.metric, r.unit, r.direction, r.a, r.b, r.change, r.scale,
                               r.effect, *(r.ci or (None, None)), r.p_value, r.verdict, r.method, r.n)
                              for r in rows], fmt, out)
        return 0
    counts = {v: sum(r.verdict == v for r in rows) for v in ("worse", "better", "changed", "noise", "too few")}
    head = (f"{ids[0]} → {ids[1]}: {len(rows)} (cell, metric) rows; significant at 95%: {counts['worse']} worse, "
            f"{counts['better']} better, {counts['changed']} changed without a direction; {counts['noise']} within "
            f"noise; {counts['too few']} with too few repeats to decide")
    hidden = len(rows) - len(shown)
    tail = f"{hidden} more rows: harness compare {run_a} {run_b} --all" if hidden else ""
    if fmt == "markdown":
        out.write(f"**{head}**\n\n" + markdown_table(COLUMNS, [display_row(r) for r in shown]))
        out.write(f"\n_{tail}_\n" if tail else "")
    else:
        out.write(head + "\n" + compare_table(shown) + (tail + "\n" if tail else ""))
    return 0
