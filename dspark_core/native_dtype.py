"""The dtype this machine runs a target fastest in: bfloat16 where matmuls have native bf16, else float32.

On an AVX2-only CPU torch emulates bf16 and a bf16 linear runs 2–3× slower than fp32; with AVX512-BF16 or AMX
a bf16 product runs ≈ 4× fp32 and a 135M model is memory-bound at batch 1, as on a GPU (measured here). torch's
`get_cpu_capability()` says "AVX512" for every AVX512F CPU, bf16 or not, so the CPU's own flags decide where
the kernel lists them (Linux); elsewhere only an "AMX" capability counts as native.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of /proc/cpuinfo (or of `cpuinfo`'s text); empty where there is none."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str], capability: str) -> bool:
    return bool(flags & NATIVE_BF16_FLAGS) if flags else "AMX" in capability


@lru_cache(maxsize=1)
def fast_dtype() -> str:
    """"bfloat16" on CUDA and on CPUs with native bf16 matmuls, else "float32" (torch's dtype names)."""
    import torch

    if torch.cuda.is_available():
        return "bfloat16"
    return "bfloat16" if cpu_has_native_bf16(cpu_flags(), torch.backends.cpu.get_cpu_capability()) else "float32"
