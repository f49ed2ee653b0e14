"""The in-house engine's step costs at Qwen3-8B shapes with random weights (built from a config, nothing
downloaded), as pytest-benchmark JSON for `harness ingest`: the prepared GPU check's engine part.

    python -m benchmarks.gpu_engine --out engine.json [--sps-table sps.json]   # on the GPU, Qwen3-8B shapes
    python -m benchmarks.gpu_engine --toy --out engine.json                     # anywhere: toy shapes, CPU

1. SPS(B): a verify forward of the target for R requests × v verified tokens each, over a context of
   `--context` cached positions (`backends.inhouse.profile.profile_sps`: real `TargetModel.forward` over KV slots,
   synchronised, median of repeats). One benchmark per (R, v); `--sps-table` also saves the table at
   v = 8 (γ 7 + 1) in the format the `scheduler` / `budget` policies read.
2. The Markov head's share of a step: a DSpark draft step (5 layers, block 7) with the Markov head vs the
   same backbone without it (no confidence head in either), interleaved round by round (paired in time); per round,
   share = (t_markov − t_none) ÷ (t_markov + t_verify at R × 8 tokens). The paper reports +0.2–1.3%.
   Reported with the median over rounds and a 95% interval (2.5th–97.5th percentile of the rounds).
Random weights cost what trained ones do: no step here depends on the values (greedy drafting runs the
same kernels whatever token wins).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Shapes:
    """Target (a Qwen3 config) and DSpark draft sizes, and the grid measured."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    draft_layers: int
    draft_target_layers: tuple[int, ...]
    requests: tuple[int, ...]  # R
    verified: tuple[int, ...]  # v: tokens verified per request
    context: int


QWEN3_8B = Shapes("qwen3-8b", 151_936, 4096, 12_288, 36, 32, 8, 128, 5, (1, 9, 17, 25, 33),
                  (1, 4, 16, 32, 64), (1, 4, 8, 16), 1024)
TOY = Shapes("toy", 512, 64, 128, 4, 4, 2, 16, 2, (0, 2), (1, 4), (1, 4, 8), 32)


def build_target(shapes: Shapes, device: torch.device, dtype: torch.dtype):
    """A Qwen3 causal LM of these shapes with random weights, wrapped for verification."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from dspark_core.target import TargetModel

    config = Qwen3Config(vocab_size=shapes.vocab, hidden_size=shapes.hidden, intermediate_size=shapes.intermediate,
                         num_hidden_layers=shapes.layers, num_attention_heads=shapes.heads,
                         num_key_value_heads=shapes.kv_heads, head_dim=shapes.head_dim, rope_theta=1_000_000.0,
                         max_position_embeddings=40_960, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return TargetModel(model, layer_ids=shapes.draft_target_layers)


def build_drafter(shapes: Shapes, head: str, device: torch.device, dtype: torch.dtype):
    """A DSpark draft of these shapes; the same seed gives the same backbone with or without the heads."""
    from dspark_core.drafters import DraftConfig, DSparkDrafter, DSparkModel

    config = DraftConfig(method="dspark", vocab_size=shapes.vocab, hidden_size=shapes.hidden,
                         intermediate_size=shapes.intermediate, num_layers=shapes.draft_layers,
                         num_attention_heads=shapes.heads, num_kv_heads=shapes.kv_heads, head_dim=shapes.head_dim,
                         target_hidden_size=shapes.hidden, target_layer_ids=shapes.draft_target_layers,
                         mask_token_id=shapes.vocab - 1, head=head, markov_rank=256 if shapes.vocab > 4096 else 16,
                         confidence_head=False)  # the Markov head alone: what the paper's +0.2–1.3% is
    torch.manual_seed(0)
    return DSparkDrafter(DSparkModel(config).to(device=device, dtype=dtype))


def draft_inputs(drafter, shapes: Shapes, batch: int, device: torch.device, dtype: torch.dtype):
    """(state, step) of `batch` requests, each with `shapes.context` observed positions."""
    from dspark_core.drafters.base import DraftStep

    context = shapes.context
    state = drafter.start(batch, context + 16)
    rows = torch.arange(batch, device=device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    features = torch.randn(batch, context, shapes.hidden * len(shapes.draft_target_layers), generator=gen).to(device, dtype)
    tokens = torch.randint(0, shapes.vocab - 1, (batch, context + 16), generator=gen).to(device)
    drafter.observe(state, rows, tokens[:, :context], features, torch.full((batch,), context, device=device))
    step = DraftStep(rows, tokens, torch.full((batch,), context + 1, device=device), 7,
                     torch.zeros(batch, device=device), [torch.Generator(device=device).manual_seed(i) for i in range(batch)])
    return state, step


def _timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _stats(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"min": ordered[0], "max": ordered[-1], "mean": statistics.fmean(times), "median": statistics.median(times),
            "stddev": statistics.stdev(times) if len(times) > 1 else 0.0, "rounds": len(times), "iterations": 1,
            "ops": 1.0 / statistics.fmean(times), "total": sum(times), "data": times}


def _interval(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]  # noqa: E731
    return pick(0.025), pick(0.975)


def _bench(group: str, name: str, params: dict, times: list[float], extra: dict) -> dict:
    return {"group": group, "name": name, "fullname": f"benchmarks/gpu_engine.py::{name}", "params": params,
            "stats": _stats(times), "extra_info": extra, "options": {"timer": "perf_counter", "synchronised": True}}


def sps_benchmarks(target, shapes: Shapes, repeats: int, sps_table: Path | None) -> tuple[list[dict], dict]:
    """One benchmark per (R, v), and the median verify latency per (R, v) for the share below."""
    from backends.inhouse.profile import profile_sps
    from dspark_core.costs import save_sps_table

    out, latency = [], {}
    for v in shapes.verified:
        table = profile_sps(target, [r * v for r in shapes.requests], shapes.context, tokens_per_request=v,
                            repeats=repeats, target_id=f"random-{shapes.name}")
        for r in shapes.requests:
            times = table.meta["latencies_s"][str(r * v)]
            latency[(r, v)] = statistics.median(times)
            out.append(_bench("sps", f"sps[R={r},v={v}]", {"requests": r, "verified_per_request": v}, times,
                              {"tokens": r * v, "sps": 1.0 / latency[(r, v)], "context": shapes.context,
                               "shapes": shapes.name}))
        if sps_table is not None and v == 8:
            save_sps_table(sps_table, table)
    return out, latency


def markov_share_benchmarks(shapes: Shapes, device, dtype, rounds: int, verify_latency: dict) -> list[dict]:
    """Draft steps with and without the Markov head, interleaved per round; the head's share of a step."""
    out = []
    with_head, without = build_drafter(shapes, "markov", device, dtype), build_drafter(shapes, "none", device, dtype)
    v = 8 if 8 in shapes.verified else max(shapes.verified)
    for r in shapes.requests:
        inputs = {name: draft_inputs(d, shapes, r, device, dtype) for name, d in (("markov", with_head), ("none", without))}
        drafters = {"markov": with_head, "none": without}
        for name in ("markov", "none"):  # warm-up: kernels compiled, caches allocated
            drafters[name].propose(*inputs[name])
        times: dict[str, list[float]] = {"markov": [], "none": []}
        for i in range(rounds):
            for name in (("markov", "none") if i % 2 == 0 else ("none", "markov")):  # rotate the order
                times[name].append(_timed(functools.partial(drafters[name].propose, *inputs[name]), device))
        shares = [(m - n) / (m + verify_latency[(r, v)]) for m, n in zip(times["markov"], times["none"])]
        low, high = _interval(shares)
        for name in ("markov", "none"):
            out.append(_bench("draft-step", f"draft_step[head={name},R={r}]", {"head": name, "requests": r},
                              times[name], {"shapes": shapes.name, "block": 7}))
        out.append(_bench("markov-share", f"markov_share[R={r}]", {"requests": r}, shares,
                          {"share_median": statistics.median(shares), "share_low": low, "share_high": high,
                           "verify_s": verify_latency[(r, v)], "verified_per_request": v, "shapes": shapes.name,
                           "unit": "fraction of a step (draft + verify)"}))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="pytest-benchmark JSON to write")
    ap.add_argument("--toy", action="store_true", help="toy shapes on the CPU (a dry run of the GPU check)")
    ap.add_argument("--sps-table", type=Path, default=None, help="also save SPS(B) at v = 8 here")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per SPS point (default 7; toy 2)")
    ap.add_argument("--rounds", type=int, default=None, help="paired rounds per draft batch (default 30; toy 4)")
    args = ap.parse_args(argv)
    shapes = TOY if args.toy else QWEN3_8B
    if not args.toy and not torch.cuda.is_available():
        raise SystemExit("gpu_engine: no CUDA device; use --toy for a dry run on the CPU")
    device = torch.device("cpu" if args.toy else "cuda")
    dtype = torch.float32 if args.toy else torch.bfloat16
    repeats = args.repeats or (2 if args.toy else 7)
    rounds = args.rounds or (4 if args.toy else 30)
    start = time.perf_counter()
    with torch.inference_mode():
        target = build_target(shapes, device, dtype)
        print(f"target {shapes.name}: {sum(p.numel() for p in target.model.parameters()) / 1e9:.2f} B parameters, "
              f"{dtype} on {device} (built in {time.perf_counter() - start:.0f} s)", flush=True)
        benchmarks, latency = sps_benchmarks(target, shapes, repeats, args.sps_table)
        del target
        if device.type == "cuda":
            torch.cuda.empty_cache()
        benchmarks += markov_share_benchmarks(shapes, device, dtype, rounds, latency)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or platform.machine()
    doc = {"machine_info": {"node": platform.node(), "device": name, "torch": torch.__version__,
                            "python": platform.python_version(), "shapes": shapes.name},
           "commit_info": {}, "benchmarks": benchmarks, "datetime": dt.datetime.now(dt.timezone.utc).isoformat(),
           "version": "gpu_engine/1"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    for b in benchmarks:
        if b["group"] == "markov-share":
            x = b["extra_info"]
            print(f"{b['name']:<24} {x['share_median']:+.2%}  (95% of rounds {x['share_low']:+.2%} … {x['share_high']:+.2%})")
    sps = {b["name"]: b["extra_info"]["sps"] for b in benchmarks if b["group"] == "sps"}
    print("SPS(B) steps/s: " + "  ".join(f"{k.removeprefix('sps')} {v:.1f}" for k, v in sps.items()))
    print(f"wrote {len(benchmarks)} benchmarks to {args.out} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
