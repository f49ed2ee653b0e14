"""The C++ bf16 linear of the CPU (`bf16_linear.cpp`), over weights packed for AVX512-BF16's dot products.

Its twin is the oneDNN linear of `dspark_core.packed_linear` (and `F.linear` over the weight it was packed from);
`packed_linear.pack` packs a bf16 weight for this kernel where `ready()` says so, and `packed_linear.packed_linear`
runs it. Where it runs: bf16 on a CPU with AVX512-BF16 and without AMX, the library built, `DSPARK_KERNELS` not
`torch`. On an AMX CPU oneDNN's tile products serve the many rows of a prefill several times faster than
AVX512-BF16 dot products can, and a weight must keep one kernel for every number of rows (a row's result may
not depend on the rows beside it), so there oneDNN keeps every linear; not measured on AMX here.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import torch
from torch import Tensor

from dspark_core.kernels import cpu_build, kernel_mode

NAME = "bf16_linear"
LANES = 16  # output columns per packed block (bf16_linear.cpp)
_DECLARED: list[ctypes.CDLL] = []  # libraries whose signatures are declared


class PairPacked(NamedTuple):
    """A [N, K] bf16 weight packed for the kernel, with the weight itself (what the twin multiplies by)."""

    blocks: Tensor  # [ceil(N / 16), K / 2, 16, 2] bf16: 16 output columns per block, K in adjacent pairs
    weight: Tensor  # [N, K], the source (never copied: the module's own tensor or its stack)
    out_features: int
    in_features: int

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape


def library(variant: str = "native") -> ctypes.CDLL | None:
    lib = cpu_build.load(NAME, variant)
    if lib is not None and not any(lib is seen for seen in _DECLARED):
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.dspark_bf16_linear_pack.argtypes = [p, p, i64, i64]
        lib.dspark_bf16_linear_pack.restype = None
        lib.dspark_bf16_linear.argtypes = [p, p, p, p, i64, i64, i64, ctypes.c_int]
        lib.dspark_bf16_linear.restype = None
        lib.dspark_bf16_linear_native.restype = ctypes.c_int
        _DECLARED.append(lib)  # held, so no later library can take its place unseen
    return lib


def ready() -> bool:
    """Whether `packed_linear.pack` packs bf16 weights for this kernel (see the module docstring)."""
    if kernel_mode() == "torch" or "amx_bf16" in cpu_build.cpu_flags().split():
        return False
    lib = library()
    return lib is not None and bool(lib.dspark_bf16_linear_native())


def takes(weight: Tensor) -> bool:
    """A 2-D bf16 weight on the CPU with an even number of inputs (the kernel reads K in pairs)."""
    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2 and weight.shape[1] % 2 == 0


def pack(weight: Tensor, variant: str = "native") -> PairPacked:
    lib = library(variant)
    assert lib is not None and takes(weight)
    n, k = weight.shape
    source = weight.detach().contiguous()
    blocks = torch.empty(((n + LANES - 1) // LANES, k // 2, LANES, 2), dtype=torch.bfloat16)
    lib.dspark_bf16_linear_pack(source.data_ptr(), blocks.data_ptr(), n, k)
    return PairPacked(blocks, weight.detach(), n, k)


def linear(x: Tensor, packed: PairPacked, bias: Tensor | None, variant: str = "native") -> Tensor:
    """x @ W.T + b for x [..., K] bf16 (any leading dimensions), W the weight `packed` holds. Kept lean: it runs for
    every projection of every step (≈ 5 µs of Python and ctypes per call)."""
    lib = library(variant)
    assert lib is not None
    n, k = packed.out_features, packed.in_features
    if x.dtype != torch.bfloat16 or x.shape[-1] != k:
        raise ValueError(f"bf16_linear: x {tuple(x.shape)} {x.dtype}, weight [{n}, {k}] bf16")
    if not x.is_contiguous():
        x = x.contiguous()
    out = torch.empty((*x.shape[:-1], n), dtype=torch.bfloat16)
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    lib.dspark_bf16_linear(x.data_ptr(), packed.blocks.data_ptr(), None if b is None else b.data_ptr(),
                           out.data_ptr(), x.numel() // k, n, k, torch.get_num_threads())
    return out


__all__ = ["PairPacked", "library", "linear", "pack", "ready", "takes"]
