"""fp32 and bf16 linears over oneDNN's prepacked weights on the CPU, for inference.

MKL's fp32 matmul is slow at the few rows of a decode or verify step on an AVX2 CPU (measured, 2 threads:
SmolLM2's gate/up [3072 × 576] at 8 rows 4.2 ms, oneDNN's over the prepacked weight 1.2 ms; a layer's four
projections at 8 rows 6.1 vs 2.1 ms, at 1 row 1.25 vs 0.94 ms). vLLM's CPU backend prepacks every linear the
same way. Unlike MKL's, oneDNN's result for a row does not depend on how many rows are multiplied with it, so
a verify step's logits equal a plain step's bit for bit. A packed copy costs the weight's size again.

bf16 on a CPU with native bf16 (AVX512-BF16/AMX) runs through oneDNN either way, but a plain `F.linear`
reorders the weight at every call: over the prepacked copy the same products run 1.4–1.6× faster with the
same numbers (measured here, 1 thread: gate/up [3072 × 576] at 16 rows 0.28 → 0.19 ms, the LM head
[49,152 × 576] 7.9 → 4.9 ms, max difference 0). Without native bf16 they stay on `F.linear`. Where the CPU has
AVX512-BF16 but no AMX, a bf16 weight is packed for this project's own kernel instead
(`kernels/bf16_linear_cpu.py`): at the few rows of a decode or verify step oneDNN reads the weight at 8–18 GB/s,
the kernel at 22–27 GB/s (AMD Zen 4, 2 threads: SmolLM2's projections at one row 0.60–0.65× oneDNN's time, at 8
rows 0.64–0.74×; at hundreds of rows within 10%). It too gives a row the same result whatever rows run beside it.

`decoder_forward` packs the target's projections and LM head (`pack`); `pack_linears` turns a draft model's
`nn.Linear`s into `PackedLinear`s, which pack their weight at the first forward without gradients and again
whenever it changes (its address, version or dtype: `weight_key`), and run `F.linear` wherever autograd needs it.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark_core.kernels import bf16_linear_cpu, kernel_mode
from dspark_core.kernels.bf16_linear_cpu import PairPacked


# oneDNN's call costs a fixed ≈ 60 µs more than MKL's at one row (576 × 576: 0.10 vs 0.04 ms), which only a large
# product repays: the embedded default's 128-wide layers (≤ 98 k weights) stay on MKL; SmolLM2's projections
# (≥ 331 k) and LM head are packed. The bf16 kernel's call costs a few µs, so a bf16 weight it takes is packed for
# it whatever its size (a SmolLM2 draft's 192-wide k/v projections: 60–150 µs a call on `F.linear` inside a step,
# ≈ 10 µs on the kernel). A weight's own size and dtype decide, never the rows of a call: a row's result must not
# depend on how many rows run with it.
MIN_PACKED_ELEMENTS = 1 << 17


@lru_cache(maxsize=1)
def _native_bf16() -> bool:
    from dspark_core.native_dtype import cpu_flags, cpu_has_native_bf16

    return cpu_has_native_bf16(cpu_flags(), torch.backends.cpu.get_cpu_capability())


def packable(weight: Tensor, bf16_kernel: bool = True) -> bool:
    """Where a prepacked matmul is the faster one and its ops exist: a bf16 weight the bf16 kernel takes (any size,
    unless `bf16_kernel` is off), else, for oneDNN, a large fp32 weight on the CPU or a large bf16 one on a CPU with
    native bf16."""
    if weight.device.type != "cpu":
        return False
    if bf16_kernel and uses_bf16_kernel(weight):
        return True
    if weight.numel() < MIN_PACKED_ELEMENTS:
        return False
    if not (weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and _native_bf16())):
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack(weight: Tensor, bf16_kernel: bool = True) -> Tensor | PairPacked | None:
    """A [out, in] weight packed for the faster kernel here: this project's bf16 kernel where it runs and
    `bf16_kernel` (`PairPacked`), else oneDNN's blocked copy; None where it is not `packable` (or oneDNN refuses it)."""
    if not packable(weight, bf16_kernel):
        return None
    if bf16_kernel and uses_bf16_kernel(weight):
        return bf16_linear_cpu.pack(weight)
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except (RuntimeError, AttributeError):  # pragma: no cover - a torch without these ops
        return None


def uses_bf16_kernel(weight: Tensor) -> bool:
    """Whether `pack` packs this weight for the bf16 kernel (`kernels/bf16_linear_cpu.py`) rather than oneDNN."""
    return weight.dtype == torch.bfloat16 and bf16_linear_cpu.takes(weight) and bf16_linear_cpu.ready()


def path(dtype: torch.dtype, device: torch.device, bf16_kernel: bool = True) -> str:
    """Which linear a packed projection of `dtype` on `device` runs (a cell's provenance records it): "c++ kernel",
    "onednn" or "torch" (`F.linear`, where nothing is packed)."""
    probe = torch.empty((1, 1 << 17), dtype=dtype, device=device)  # a weight as large as the smallest packed one
    if not packable(probe, bf16_kernel):
        return "torch"
    return "c++ kernel" if bf16_kernel and uses_bf16_kernel(probe) else "onednn"


def packed_linear(x: Tensor, packed: Tensor | PairPacked, bias: Tensor | None) -> Tensor:
    """x @ W.T + b over `pack(W)`; any leading dimensions. A weight packed for the bf16 kernel runs `F.linear` over
    the weight itself while `DSPARK_KERNELS=torch` (the kernel's twin, read at every call as the other kernels')."""
    if isinstance(packed, PairPacked):
        if kernel_mode() == "torch":
            return F.linear(x, packed.weight, bias)
        return bf16_linear_cpu.linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def weight_key(weight: Tensor) -> tuple[int, int, torch.dtype]:
    """Changes when the weight moves or is written in place (a packed copy would be stale). An inference
    tensor (made under `torch.inference_mode`, as the GPU check loads its target) keeps no version counter,
    and nothing outside inference mode can write it in place, so its address and dtype are the key."""
    return weight.data_ptr(), -1 if weight.is_inference() else weight._version, weight.dtype


class PackedLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same state dict) whose forward without gradients runs over its weight
    prepacked for oneDNN, kept beside it and packed again when the weight changes."""

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)
        key = weight_key(self.weight)
        cached = getattr(self, "_packed", None)
        if cached is None or cached[0] != key:
            cached = (key, pack(self.weight))
            object.__setattr__(self, "_packed", cached)  # not a buffer: never saved, never moved by .to()
        if cached[1] is None:
            return F.linear(x, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        return packed_linear(x, cached[1], bias)


def pack_linears(module: nn.Module) -> int:
    """Make every plain `nn.Linear` in `module` a `PackedLinear` (in place; parameters untouched) where its
    weight is `packable`; returns how many. For inference: training keeps `F.linear` through autograd anyway."""
    count = 0
    for m in module.modules():
        if type(m) is nn.Linear and packable(m.weight):
            m.__class__ = PackedLinear
            count += 1
    return count
