"""Compile every kernel for a CUDA GPU on a machine without one: `python -m dspark_core.kernels.aot`.

The interpreter (TRITON_INTERPRET=1) runs kernels with numpy and accepts code the GPU compiler rejects
(types that change across loop iterations, dot shapes under 16, ...). This runs the real launchers on CPU
tensors with each kernel's launch replaced by an ahead-of-time `triton.compile` to cubin for the target
architecture (default sm_90, H100/H200), with the argument types and constexprs the launch would have
used. Nothing executes; a kernel that would not compile on the GPU fails here. Needs triton, not a GPU,
and TRITON_INTERPRET unset.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

_TYPES = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1",
}
_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


def _type_of(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


class Compiler:
    """Stands in for kernel launches: compiles each distinct (kernel, signature, constexprs) once."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)
        self.done: dict[tuple, float] = {}

    def capture(self, kernel):
        def run(*args, grid, warmup, **kwargs):
            import triton
            from triton.compiler import ASTSource

            options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
            names = kernel.arg_names
            bound = dict(zip(names, args)) | kwargs
            # As the JIT specialises: constexpr parameters, and integer arguments equal to 1 (`x.to(...)` on
            # such an argument compiles in the interpreter, never on the GPU).
            constexpr_names = {p.name for p in kernel.params if p.is_constexpr}
            constexpr_names |= {n for n in names if type(bound[n]) is int and bound[n] == 1}
            signature = {n: "constexpr" if n in constexpr_names else _type_of(bound[n]) for n in names}
            constexprs = {n: bound[n] for n in constexpr_names}
            key = (kernel.fn.__name__, tuple(signature.items()), tuple(sorted(constexprs.items())),
                   tuple(sorted(options.items())))
            if key not in self.done:
                start = time.perf_counter()
                src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
                triton.compile(src, target=self.target, options=options)
                self.done[key] = time.perf_counter() - start
            return None

        return run


def representative_launches() -> None:
    """Each launcher on small CPU tensors with GPU block sizes, once per constexpr branch and dtype path that
    matters, and once with the arguments that can be 1 (one request, one draft, one block) equal to 1."""
    from dspark_core.kernels.attention import varlen_attention_triton
    from dspark_core.kernels.markov_draft import markov_draft
    from dspark_core.kernels.prefix_scheduler import schedule_prefix_triton
    from dspark_core.kernels.rejection import rejection_greedy_sample_triton, rejection_sample_triton

    bf16, fp32, long = torch.bfloat16, torch.float32, torch.long
    vocab, hidden, rank = 1000, 64, 32

    def draft(num_rows: int, n: int, dtype: torch.dtype, head: bool = True, vocab: int = vocab) -> None:
        w = torch.zeros(vocab, rank, dtype=dtype) if head else None
        markov_draft(
            torch.zeros(num_rows, n, vocab, dtype=dtype), torch.zeros(num_rows, n, hidden, dtype=dtype),
            torch.zeros(num_rows, dtype=long), torch.ones(num_rows), torch.zeros(num_rows, n), w1=w, w2=w,
            conf_weight=torch.zeros(1, hidden + rank, dtype=dtype) if head else None,
            conf_bias=torch.zeros(1, dtype=dtype) if head else None,
        )

    draft(4, 3, bf16)  # bf16 tl.dot; positions 0 (anchor stride 1), 1, 2
    draft(1, 2, fp32, vocab=64)  # fp32 ieee tl.dot; one request, one V block
    draft(2, 1, fp32, head=False)  # no sequential head (DFlash)
    draft(64, 1, bf16)  # BLOCK_R 64, 8 warps

    def attend(num_q: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        cu = torch.zeros(len(num_q) + 1, dtype=long)
        cu[1:] = torch.tensor(num_q).cumsum(0)
        cache = torch.zeros(len(num_q), kv_heads, 64, head_dim, dtype=dtype)
        q = torch.zeros(sum(num_q), heads, head_dim, dtype=dtype)
        varlen_attention_triton(q, cache, cache, cu, torch.zeros(len(num_q), dtype=long), 0.1, max_seqlen_q=max(num_q))

    attend([3, 0, 5, 1], 8, 2, 128, bf16)  # GQA group 4, BLOCK_M 32
    attend([8, 2], 16, 2, 128, bf16)  # group 8, BLOCK_M 64
    attend([3, 1], 4, 2, 16, fp32)  # ieee fp32 dots (small tiles: at head_dim 128 this one compiles for ~20 s)
    attend([1], 2, 1, 64, bf16)  # one request, one query, one kv head

    def verify(num_drafts: list[int], dtype: torch.dtype, probs: bool) -> None:
        cu = torch.zeros(len(num_drafts) + 1, dtype=long)
        cu[1:] = torch.tensor(num_drafts).cumsum(0)
        total, num_rows = sum(num_drafts), len(num_drafts)
        logits, drafts = torch.zeros(total + num_rows, vocab, dtype=dtype), torch.zeros(total, dtype=long)
        rejection_sample_triton(logits, drafts, cu, torch.zeros(total, vocab) if probs else None, torch.ones(num_rows),
                                torch.zeros(total), torch.zeros(num_rows), residual_eps=1e-9)
        rejection_greedy_sample_triton(logits, drafts, cu)

    verify([2, 0, 3, 2], fp32, probs=True)
    verify([1], bf16, probs=False)  # one request, one draft, one-hot drafts

    for num_rows, gamma in ((4, 7), (1, 1)):
        sps = torch.ones(num_rows * (gamma + 1) + 1, dtype=torch.float64)
        schedule_prefix_triton(torch.zeros(num_rows, gamma, dtype=torch.float64), None, None, sps)
        schedule_prefix_triton(None, torch.zeros(num_rows, gamma), torch.zeros(num_rows, dtype=long), sps)


def compile_all(arch: int = 90) -> dict[tuple, float]:
    from dspark_core.kernels import attention, interpreting, markov_draft, prefix_scheduler, rejection

    if interpreting():
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    compiler = Compiler(arch)
    kernels = [
        getattr(module, name)
        for module in (markov_draft, rejection, attention, prefix_scheduler)
        for name in dir(module)
        if name.endswith("_kernel") and hasattr(getattr(module, name), "arg_names")
    ]
    for kernel in kernels:
        kernel.run = compiler.capture(kernel)
    try:
        representative_launches()
    finally:
        for kernel in kernels:
            del kernel.run
    missing = {k.fn.__name__ for k in kernels} - {key[0] for key in compiler.done}
    if missing:
        raise RuntimeError(f"kernels never launched by representative_launches: {sorted(missing)}")
    return compiler.done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability as an integer (90: H100/H200)")
    args = parser.parse_args(argv)
    done = compile_all(args.arch)
    for key, seconds in sorted(done.items(), key=lambda kv: kv[0][0]):
        print(f"sm_{args.arch} {key[0]:<28} {seconds:6.2f} s")
    print(f"{len(done)} compilations for sm_{args.arch}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
