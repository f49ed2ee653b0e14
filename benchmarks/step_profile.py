"""Per-step cost of `Engine.step` on the embedded default, plain vs a drafter, at fixed batch sizes.

    HARNESS_DATA_DIR=../shared/datasets python3 -m benchmarks.step_profile --batch 1 64 [--cprofile]

Fills `batch` slots with GSM8K prompts and a budget that outlasts the measurement (no stop tokens), runs
`--warmup` steps, then times `--steps` steps: median ms per step and emitted tokens per second. Variants
(names as in benchmarks.concurrency) are interleaved round by round, so a busy shared machine slows them
alike. `--cprofile` prints the top functions of the last round by cumulative time. Single-threaded
(torch.set_num_threads(1)), like the other benchmarks.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch


def measure(emb, variant: str, drafter: str, batch: int, prompts, sps, costs, warmup: int, steps: int,
            profile: cProfile.Profile | None) -> tuple[float, float]:
    """(median ms per step, emitted tokens per second) over `steps` steps of a full batch."""
    from backends.inhouse.engine import Engine, EngineConfig, Request
    from benchmarks.concurrency import make_policy

    gamma, policy = make_policy(variant, emb, sps, 0.0, drafter, costs)
    max_new = (warmup + steps + 2) * 8  # the same slot capacity for every variant (γ ≤ 7)
    engine = Engine(emb.target, emb.drafters["none" if gamma == 0 else drafter],
                    EngineConfig(num_slots=batch, max_context=max(map(len, prompts)) + max_new, num_drafts=gamma),
                    policy)
    for i in range(batch):
        engine.submit(Request(f"r{i}", prompts[i % len(prompts)], max_new_tokens=max_new, seed=i))
    for _ in range(warmup):
        engine.step()
    before = sum(len(s.output) for s in engine.slots.values())
    times = []
    if profile is not None:
        profile.enable()
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    if profile is not None:
        profile.disable()
    emitted = sum(len(s.output) for s in engine.slots.values()) - before
    assert len(engine.slots) == batch, "a request finished during the measurement"
    return statistics.median(times) * 1e3, emitted / wall


def main(argv: list[str] | None = None) -> int:
    from benchmarks.concurrency import load_prompts, measure_costs, measure_sps
    from inputs.model_refs import embedded_root
    from recipes.embedded.evaluate import load_embedded

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--variants", nargs="+", default=["plain", "static7", "prefix"])
    ap.add_argument("--drafter", default="dspark")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    emb = load_embedded(embedded_root(), ["none", args.drafter])
    prompts = load_prompts(emb, "gsm8k", 64)
    sps = measure_sps(emb)
    costs = measure_costs(emb, args.drafter, sps) if "adaptive" in args.variants else None
    for batch in args.batch:
        results: dict[str, list[tuple[float, float]]] = {v: [] for v in args.variants}
        profiles: dict[str, cProfile.Profile] = {}
        for rnd in range(args.rounds):
            for v in args.variants:
                prof = cProfile.Profile() if args.cprofile and rnd == args.rounds - 1 else None
                results[v].append(
                    measure(emb, v, args.drafter, batch, prompts, sps, costs, args.warmup, args.steps, prof))
                if prof is not None:
                    profiles[v] = prof
        for v, rows in results.items():
            print(f"batch {batch:3d} {v:10s} {statistics.median(r[0] for r in rows):8.2f} ms/step "
                  f"{statistics.median(r[1] for r in rows):8.0f} tok/s")
        for v, prof in profiles.items():
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
            print(f"\n==== cProfile batch {batch} {v} ({args.steps} steps)\n{out.getvalue()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
