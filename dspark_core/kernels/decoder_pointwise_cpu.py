"""The C++ elementwise steps of a bf16 Llama-family decoder layer on the CPU (`decoder_pointwise.cpp`).

Their twins are the eager ops of `dspark_core.decoder_forward` (`_rms_norm`, `_rope`, `act_fn(gate) * up`, the
residual add); `decoder_forward` calls these where `ready()` says so (bf16, the CPU, the library built,
`DSPARK_KERNELS` not `torch`). Each takes contiguous bf16 tensors and returns new ones.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from dspark_core.kernels import cpu_build, kernel_mode

NAME = "decoder_pointwise"
_DECLARED: list[ctypes.CDLL] = []  # libraries whose signatures are declared


def library(variant: str = "native") -> ctypes.CDLL | None:
    lib = cpu_build.load(NAME, variant)
    if lib is not None and not any(lib is seen for seen in _DECLARED):
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.dspark_add_rms_norm.argtypes = [p] * 5 + [i64, i64, ctypes.c_float]
        lib.dspark_rope.argtypes = [p] * 4 + [i64] * 5
        lib.dspark_silu_mul.argtypes = [p, p, i64, i64]
        for fn in (lib.dspark_add_rms_norm, lib.dspark_rope, lib.dspark_silu_mul):
            fn.restype = None
        _DECLARED.append(lib)  # held, so no later library can take its place unseen
    return lib


def ready(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a forward over hidden states of `dtype` on `device` may take these kernels."""
    return dtype == torch.bfloat16 and device.type == "cpu" and kernel_mode() != "torch" and library() is not None


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float,
                 variant: str = "native") -> tuple[Tensor, Tensor]:
    """(x + delta, RMSNorm(x + delta)) in Hugging Face's bf16 numerics; delta None: (x, RMSNorm(x))."""
    lib = library(variant)
    assert lib is not None
    x = x.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    normed = torch.empty_like(x)
    total = x if delta is None else torch.empty_like(x)
    d = None if delta is None else delta.contiguous()
    lib.dspark_add_rms_norm(x.data_ptr(), None if d is None else d.data_ptr(), weight.contiguous().data_ptr(),
                            None if d is None else total.data_ptr(), normed.data_ptr(), rows, n, float(eps))
    return total, normed


def rope(qkv: Tensor, heads: int, cos: Tensor, sin: Tensor, variant: str = "native") -> Tensor:
    """The first `heads` heads of qkv [R, N, H3, D] rotated: [R, heads, N, D]; cos, sin [R, N, D] (or
    broadcastable views of that shape)."""
    lib = library(variant)
    assert lib is not None
    rows, steps, h3, dim = qkv.shape
    qkv = qkv.contiguous()
    cos = cos.reshape(rows, steps, dim).contiguous()
    sin = sin.reshape(rows, steps, dim).contiguous()
    out = torch.empty((rows, heads, steps, dim), dtype=qkv.dtype)
    lib.dspark_rope(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), rows, steps, h3, heads, dim)
    return out


def silu_mul(gate_up: Tensor, variant: str = "native") -> Tensor:
    """silu(gate) * up over gate_up [..., 2n] split as `chunk(2, -1)`: [..., n]."""
    lib = library(variant)
    assert lib is not None
    gate_up = gate_up.contiguous()
    n = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * n)
    out = torch.empty((*gate_up.shape[:-1], n), dtype=gate_up.dtype)
    lib.dspark_silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, n)
    return out


__all__ = ["add_rms_norm", "library", "ready", "rope", "silu_mul"]
