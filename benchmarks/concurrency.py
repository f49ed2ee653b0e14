"""Throughput under closed-loop concurrency: plain decoding vs the best static γ vs the schedulers, in one run.

    HARNESS_DATA_DIR=../shared/datasets python3 -m benchmarks.concurrency \
        --tasks gsm8k mt_bench --concurrency 1 4 16 64 [--temperatures 0 1] [--repeats 3] [--json out.json]

On the embedded default (`models/embedded`, or $HARNESS_EMBEDDED_DIR) it drives the in-house engine with
`run_load` (closed loop: `concurrency` requests in flight, the next starts when one finishes; the engine has
exactly `concurrency` slots) over first-turn prompts of each task, for every variant:

- `plain`: the `none` drafter (one target token per step);
- `static<γ>`: the draft proposes γ tokens and all are verified, γ in `--static`;
- `prefix`: Algorithm 1 (`PrefixScheduler`, STS temperatures) at γ = 7 over an SPS(B) table measured first;
- `adaptive`: `CostAwareScheduler` at γ ≤ 7 over a step-cost table measured first (`profile_step_costs`):
  plans each step's draft length, 0 (no draft forward) included, from observed acceptance.

Throughput (the table) is loaded throughput: over the engine steps that ran with at least 3/4 of the
`concurrency` slots busy, output tokens emitted in them (prefill tokens included) over their wall time
(prefills included). The drain at the end (fewer requests in flight, longest for the variants whose
requests finish at uneven speeds) is left out, and no prefill is: every request is admitted in a loaded
step. Two earlier cuts were fragile: tokens from the first arrival to the last one charged a variant for
however many of the last prefills fell inside it (first turns finish near-together at a token limit, so a
few or dozens, ≈ 10 ms each at c = 64), and steps with *every* slot busy lost a whole second wave to one
request that ended at its first token. `--json` also keeps the whole-window figure (all tokens / first
arrival → last finish). The machine is shared and
noisy, so variants are interleaved (one run of each per repeat, the order rotating) and every ratio is the
median over repeats of the ratio *within* a repeat. Torch runs single-threaded (`torch.set_num_threads(1)`):
tiny models gain nothing from intra-op threads on two shared cores. A measurement tool, not a test: the
defaults take about 10 minutes on two quiet cores (15 with `--max-new-tokens 96`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

SPS_BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
SCHEDULERS = ("prefix", "adaptive")
COST_ROWS = (1, 2, 4, 8, 16, 32, 64)
CONTEXT_LEN = 160  # committed tokens per request the tables are measured at (prompt ≈ 60–140, + output)


def load_prompts(emb, task: str, n: int, seed: int = 0) -> list[list[int]]:
    """`n` first-turn prompts of `task` (cycled when the task has fewer samples)."""
    from inputs.tasks import load_task, prompt_ids

    data = load_task(task, n_samples=None, seed=seed)
    samples = data.samples[:n]
    prompts = [prompt_ids(emb.tokenizer, data.spec, s) for s in samples]
    return [prompts[i % len(prompts)] for i in range(n)]


def measure_sps(emb, context_len: int = CONTEXT_LEN, batch_sizes: Sequence[int] = SPS_BATCH_SIZES):
    """SPS(B) of the target on this CPU (target forward only), made monotone; plus, where the cost model is
    available, the draft forward's cost table (see dspark_core.costs)."""
    from backends.inhouse.profile import profile_sps

    return profile_sps(emb.target, batch_sizes, context_len, warmup=2, repeats=7, target_id="embedded").monotone()


def measure_costs(emb, drafter: str, sps):
    """The step-cost table the adaptive scheduler needs (draft forward + verify, see dspark_core.costs)."""
    from backends.inhouse.profile import profile_step_costs

    costs = profile_step_costs(emb.target, emb.drafters[drafter], COST_ROWS, context_len=CONTEXT_LEN, repeats=5)
    return costs.monotone()


def sts_for(emb, drafter: str, temperature: float) -> torch.Tensor | None:
    return emb.sts_temperatures.get(drafter, {}).get(f"{temperature:g}")


def offsets_for(emb, drafter: str, temperature: float) -> torch.Tensor | None:
    """The level offsets fitted beside the draft's temperatures, or None (STS alone)."""
    return emb.sts_offsets.get(drafter, {}).get(f"{temperature:g}")


def make_policy(variant: str, emb, sps, temperature: float, drafter: str = "dspark", costs=None):
    """(γ drafted per step, policy) of a variant name."""
    from dspark_core.scheduler import PrefixScheduler

    if variant == "plain":
        return 0, None
    if variant.startswith("static"):
        return int(variant.removeprefix("static")), None
    temps = sts_for(emb, drafter, temperature)
    offsets = offsets_for(emb, drafter, temperature) if temps is not None else None  # they come with temperatures
    if variant == "prefix":
        return 7, PrefixScheduler(sps, temperatures=temps, offsets=offsets)
    if variant == "adaptive":
        from dspark_core.scheduler import CostAwareScheduler

        return 7, CostAwareScheduler(costs, temperatures=temps, offsets=offsets)
    raise ValueError(f"unknown variant {variant!r}: plain, static<γ>, {', '.join(SCHEDULERS)}")


@dataclass
class Run:
    task: str
    temperature: float
    concurrency: int
    variant: str
    repeat: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float  # loaded: over the steps with ≥ 3/4 of the slots busy
    window_tokens_per_s: float  # every token over first arrival → last finish
    steps: int
    drafted_steps: int  # steps that ran the draft forward
    acceptance_length: float  # tokens per request-step, bonus included


def run_variant(emb, variant: str, prompts, concurrency: int, temperature: float, max_new_tokens: int,
                sps, costs, drafter: str, repeat: int = 0, task: str = "") -> Run:
    from backends.inhouse.engine import Engine, EngineConfig, Request
    from backends.inhouse.load import LoadSpec, loaded_tokens_per_s, run_load
    from recipes.embedded.evaluate import stop_tokens

    gamma, policy = make_policy(variant, emb, sps, temperature, drafter, costs)
    max_context = max(len(p) for p in prompts) + max_new_tokens
    engine = Engine(emb.target, emb.drafters["none" if gamma == 0 else drafter],
                    EngineConfig(num_slots=concurrency, max_context=max_context, num_drafts=gamma), policy)
    stops = stop_tokens(emb.tokenizer)
    requests = [Request(f"r{i}", p, max_new_tokens, temperature, seed=1000 + i, stop_token_ids=stops)
                for i, p in enumerate(prompts)]
    result = run_load(engine, requests, LoadSpec(concurrency=concurrency))
    tokens = sum(len(c.output_ids) for c in result.measured)
    wall = result.window[1] - result.window[0]
    loaded = loaded_tokens_per_s(result, concurrency)
    req_steps = sum(c.counters.num_steps for c in result.measured)
    step_tokens = sum(a + 1 for c in result.measured for a in c.counters.num_accepted)
    drafted = sum(1 for s in result.steps if getattr(s, "draft_length", gamma) > 0)
    return Run(task, temperature, concurrency, variant, repeat, tokens, wall, loaded,
               tokens / wall if wall > 0 else 0.0, len(result.steps), drafted,
               step_tokens / req_steps if req_steps else float("nan"))


def _paired_ratio(by: dict[str, dict[int, Run]], repeats: list[int], a: str, b: str | None) -> float:
    """The median over repeats of variant a's tok/s over variant b's in the same repeat."""
    if b is None or a not in by:
        return float("nan")
    return statistics.median(by[a][i].tokens_per_s / by[b][i].tokens_per_s for i in repeats)


def summarise(runs: list[Run], schedulers: Sequence[str]) -> list[dict]:
    """One row per (task, temperature, concurrency): median tok/s per variant, best static γ, and ratios as
    the median over repeats of within-repeat ratios."""
    rows = []
    keys = sorted({(r.task, r.temperature, r.concurrency) for r in runs}, key=lambda k: (k[0], k[1], k[2]))
    for key in keys:
        cell = [r for r in runs if (r.task, r.temperature, r.concurrency) == key]
        by: dict[str, dict[int, Run]] = {}
        for r in cell:
            by.setdefault(r.variant, {})[r.repeat] = r
        med = {v: statistics.median(x.tokens_per_s for x in reps.values()) for v, reps in by.items()}
        statics = [v for v in by if v.startswith("static")]
        best = max(statics, key=lambda v: med[v]) if statics else None
        repeats = sorted(by["plain"])
        row = {"task": key[0], "temperature": key[1], "concurrency": key[2], "plain": med["plain"],
               "best_static": best, "best_static_tok_s": med[best] if best else float("nan"),
               "static_tok_s": {v: med[v] for v in statics}}
        for s in schedulers:
            row[s] = med.get(s, float("nan"))
            row[f"{s}/best_static"] = _paired_ratio(by, repeats, s, best)
            row[f"{s}/plain"] = _paired_ratio(by, repeats, s, "plain")
            row[f"{s}_tau"] = statistics.median(x.acceptance_length for x in by[s].values()) if s in by else None
            row[f"{s}_drafted_steps"] = (statistics.median(x.drafted_steps / max(x.steps, 1) for x in by[s].values())
                                         if s in by else None)
        row["best_static/plain"] = _paired_ratio(by, repeats, best, "plain") if best else float("nan")
        rows.append(row)
    return rows


def format_table(rows: list[dict], schedulers: Sequence[str]) -> str:
    head = ["task", "T", "conc", "plain", "best static", *schedulers,
            *[f"{s}/static" for s in schedulers], *[f"{s}/plain" for s in schedulers], "static/plain"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        cells = [r["task"], f"{r['temperature']:g}", str(r["concurrency"]), f"{r['plain']:.0f}",
                 f"{r['best_static_tok_s']:.0f} ({r['best_static']})", *[f"{r[s]:.0f}" for s in schedulers],
                 *[f"{r[f'{s}/best_static']:.2f}" for s in schedulers], *[f"{r[f'{s}/plain']:.2f}" for s in schedulers],
                 f"{r['best_static/plain']:.2f}"]
        lines.append(" | ".join(cells))
    return "\n".join("| " + line + " |" for line in lines)


def main(argv: list[str] | None = None) -> int:
    from inputs.model_refs import embedded_root
    from recipes.embedded.evaluate import load_embedded

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["gsm8k", "mt_bench"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    ap.add_argument("--static", type=int, nargs="+", default=[1, 3, 5, 7], help="static γ values")
    ap.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS), choices=SCHEDULERS)
    ap.add_argument("--drafter", default="dspark")
    ap.add_argument("--requests", type=int, default=2,
                    help="requests per cell: this × concurrency (at least --min-requests)")
    ap.add_argument("--min-requests", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write every run and the summary rows to this file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    emb = load_embedded(embedded_root(), ["none", args.drafter])
    start = time.perf_counter()
    sps = measure_sps(emb)
    costs = measure_costs(emb, args.drafter, sps) if "adaptive" in args.schedulers else None
    print(f"# SPS measured in {time.perf_counter() - start:.1f} s: "
          + ", ".join(f"{b}:{s:.0f}" for b, s in zip(sps.batch_sizes, sps.steps_per_second)), file=sys.stderr)
    variants = ["plain", *[f"static{g}" for g in args.static], *args.schedulers]
    runs: list[Run] = []
    for task in args.tasks:
        max_c = max(args.concurrency)
        all_prompts = load_prompts(emb, task, max(args.requests * max_c, args.min_requests))
        for temperature in args.temperatures:
            for conc in args.concurrency:
                prompts = all_prompts[: max(args.requests * conc, args.min_requests)]
                for v in variants:  # warm-up, untimed: first-call allocations of each shape
                    run_variant(emb, v, prompts[: min(conc, 2)], conc, temperature, 8, sps, costs, args.drafter)
                for rep in range(args.repeats):
                    order = variants[rep % len(variants):] + variants[: rep % len(variants)]
                    for v in order:
                        r = run_variant(emb, v, prompts, conc, temperature, args.max_new_tokens, sps, costs,
                                        args.drafter, rep, task)
                        runs.append(r)
                        print(f"# {task} T={temperature:g} c={conc} rep {rep} {v:9s} {r.tokens_per_s:7.0f} tok/s "
                              f"(window {r.window_tokens_per_s:5.0f}) "
                              f"τ={r.acceptance_length:.2f} drafted {r.drafted_steps}/{r.steps}", file=sys.stderr)
    rows = summarise(runs, args.schedulers)
    print(format_table(rows, args.schedulers))
    print(f"# total {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "sps": sps.to_dict(), "rows": rows, "runs": [asdict(r) for r in runs]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
