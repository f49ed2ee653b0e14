"""One decode step of the target: the lean forward (`decoder_forward.py`) vs Hugging Face's own, paired.

    python3 -m benchmarks.target_forward --model smollm2-135m --batch 1 16 [--threads 2] [--clock cpu] [--profile]
    python3 -m benchmarks.target_forward --against unpacked --batch 1 16 --tokens 1 8 --threads 2 [--dtype bfloat16]

`--against unpacked`: the lean forward over oneDNN's prepacked weights vs the same forward over the plain
weights (MKL's matmul), the choice `decoder_forward.packed` makes. `--against sdpa`: the lean forward with a
bf16 decode step's attention as fp32 products (`decode_attention.py`) vs torch's SDPA throughout. `--against
eager`: bf16 norms, rotary and SiLU·up as C++ calls (`kernels/decoder_pointwise_cpu.py`) vs torch's ops. `--against
onednn`: bf16 projections and LM head on the C++ bf16 linear (`kernels/bf16_linear_cpu.py`) vs oneDNN's. `--tokens 8`: each step runs 8 positions
per row, as a verify step of γ 7 does, and rolls them back.

Both forwards run the same model object on their own KV slots, filled by the same prefill (`--context`
tokens per row). Each round times `--steps` decode steps of one, then of the other (the order alternates
every round), so a busy shared machine slows both alike; the figure is the median over rounds of the
per-round time ratio lean ÷ HF with a distribution-free 95% interval (order statistics of the ratios).
`--clock cpu` times this process's CPU seconds instead of wall seconds (with one thread, what another job
on the same cores takes does not count). `--profile` prints torch.profiler's table of `--steps` steps of each forward (self CPU time, top ops).
The greedy tokens of both forwards are checked equal at every step.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch


def median_ratio(values: list[float]) -> tuple[float, float, float]:
    """(median, low, high) of positive paired ratios: `harness.metrics.speedup.median_interval`, the one
    median-of-ratios with its sign-test interval that speedups use; min–max where no 95% interval exists
    (below 6 rounds)."""
    from harness.metrics.speedup import median_interval

    med, ci, _ = median_interval(values)
    low, high = ci if ci is not None else (min(values), max(values))
    return med, low, high


def _targets(model_text: str, against: str = "hf", dtype: str = "float32"):
    from dspark_core.target import TargetModel

    if model_text == "tiny":  # a small random Llama with SmolLM2's head layout (9 heads, 3 KV heads), no wheel needed
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=512, hidden_size=72, intermediate_size=192, num_hidden_layers=2,
                             num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
        model = LlamaForCausalLM(config).eval().to(getattr(torch, dtype))
    else:
        from inputs.model_refs import resolve

        model = TargetModel.from_pretrained(resolve(model_text).path, dtype=getattr(torch, dtype)).model
    # Each forward over its own copy of the weights: the lean forward re-stacks a model's projections when it
    # builds its fused weights (`fuse_projections`), so two targets sharing one model would rebuild them in turn
    # at every switch, and the packed side would repack 121 weights per round.
    lean, other = TargetModel(model), TargetModel(copy.deepcopy(model))
    if not lean.lean:
        raise SystemExit(f"{model_text}: not a model the lean forward covers (decoder_forward.supports)")
    if against == "unpacked":
        other.pack_weights = False
    elif against == "sdpa":
        other.decode_products = False
    elif against == "eager":
        other.fused_pointwise = False
    elif against == "onednn":
        other.bf16_linear = False
    else:
        other.lean = False
    return {"lean": lean, against: other}


def measure_batch(targets: dict, batch: int, args: argparse.Namespace, clock, tokens: int = 1) -> tuple[float, float, float]:
    """Prefill `batch` rows, then paired rounds of steps of `tokens` positions per row; prints and returns
    lean ÷ the other (median, low, high)."""
    capacity = args.context + (args.rounds + 2) * args.steps + 8 + tokens
    rows = torch.arange(batch)
    one = torch.ones(batch, dtype=torch.long)
    (a, b) = targets
    state = {}
    for name, target in targets.items():
        cache = target.new_cache(batch, capacity)
        prompt = torch.randint(0, target.vocab_size, (batch, args.context), generator=torch.Generator().manual_seed(0))
        out = target.forward(cache, rows, prompt, torch.full((batch,), args.context))
        state[name] = (cache, out.logits[:, -1].argmax(-1))

    def steps(name: str, n: int) -> float:
        target, (cache, last) = targets[name], state[name]
        start = clock()
        for _ in range(n):
            if tokens > 1:  # a verify-shaped step: `tokens` positions, rolled back but the first
                logits = target.forward(cache, rows, last[:, None].expand(-1, tokens), one * tokens).logits
                cache.rollback(rows, cache.lengths[rows] - (tokens - 1))
                last = logits[:, 0].argmax(-1)
            else:
                last = target.forward(cache, rows, last[:, None], one).logits[:, -1].argmax(-1)
        state[name] = (cache, last)
        return clock() - start

    steps(a, 1), steps(b, 1)
    ratios, times = [], {a: [], b: []}
    for r in range(args.rounds):
        order = (a, b) if r % 2 == 0 else (b, a)
        took = {name: steps(name, args.steps) for name in order}
        if not torch.equal(state[a][1], state[b][1]):
            print(f"batch {batch}: greedy tokens differ at round {r}")
        for name in took:
            times[name].append(took[name] / args.steps * 1e3)
        ratios.append(took[a] / took[b])
    med, lo, hi = median_ratio(ratios)
    ms = {name: median_ratio(t)[0] for name, t in times.items()}
    print(f"batch {batch:3d} × {tokens} token(s), context {args.context}, {args.threads} thread(s), {args.clock} clock: "
          f"{a} {ms[a]:.1f} ms/step, {b} {ms[b]:.1f} ms/step; {a} ÷ {b} {med:.3f} [{lo:.3f}, {hi:.3f}] "
          f"(median of {len(ratios)} paired rounds)", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in targets:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                steps(name, args.steps)
            print(f"--- {name}, batch {batch}, {args.steps} steps")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    return med, lo, hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--context", type=int, default=128, help="prompt tokens per row before decoding")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=4, help="decode steps per forward per round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU time (with --threads 1, robust to other jobs taking the cores)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--against", choices=("hf", "unpacked", "sdpa", "eager", "onednn"), default="hf",
                    help="hf: Hugging Face's own forward; unpacked: the lean forward without prepacked weights; "
                         "sdpa: the lean forward with SDPA at decode steps too; eager: the lean forward with its "
                         "elementwise steps as torch ops, not C++ calls; onednn: the lean forward with bf16 "
                         "projections on oneDNN's packed matmul, not the C++ bf16 linear")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1], help="positions per row per step (8: a γ 7 verify)")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="float32",
                    help="the target's dtype (auto: bf16 where the CPU has native bf16)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    from dspark_core.native_dtype import fast_dtype

    targets = _targets(args.model, args.against, fast_dtype() if args.dtype == "auto" else args.dtype)
    for batch in args.batch:
        for tokens in args.tokens:
            measure_batch(targets, batch, args, clock, tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
