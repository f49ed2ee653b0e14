"""The C++ kernel of a bf16 decode step's attention on the CPU (`decode_attention.cpp`), built at first use.

Its twin and spec is `dspark_core.decode_attention.decode_attention_torch` (fp32 products over widened keys and
values); the dispatch, `decode_attention.decode_attention`, runs this kernel unless `DSPARK_KERNELS=torch`, the
CPU lacks AVX512-BF16 (the portable loops are no faster than the twin) or it cannot be built (`cpu_build`: the
system compiler, about a second, cached per source and CPU; a warning once where it fails).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from dspark_core.kernels import cpu_build, kernel_mode

NAME = "decode_attention"
_DECLARED: list[ctypes.CDLL] = []  # libraries whose signatures are declared


def library(variant: str = "native") -> ctypes.CDLL | None:
    """The loaded kernel with its signatures declared, or None where it cannot be built here."""
    lib = cpu_build.load(NAME, variant)
    if lib is not None and not any(lib is seen for seen in _DECLARED):
        i64 = ctypes.c_int64
        lib.dspark_decode_attention.argtypes = [ctypes.c_void_p] * 5 + [i64] * 11 + [ctypes.c_float, ctypes.c_int]
        lib.dspark_decode_attention.restype = None
        lib.dspark_decode_attention_native.restype = ctypes.c_int
        _DECLARED.append(lib)  # held, so no later library can take its place unseen
    return lib


def ready() -> bool:
    """Whether the dispatch runs this kernel: not `DSPARK_KERNELS=torch`, built here, and with its AVX512-BF16
    paths (elsewhere its portable loops are no faster than the twin)."""
    lib = library() if kernel_mode() != "torch" else None
    return lib is not None and bool(lib.dspark_decode_attention_native())


def covers(query: Tensor, keys: Tensor) -> bool:
    """Whether the kernel takes these tensors: bf16 on the CPU, unit stride over head_dim, one query per row."""
    return (query.dtype == keys.dtype == torch.bfloat16 and keys.device.type == "cpu" and query.shape[2] == 1
            and keys.stride(-1) == 1 and query.shape[1] % keys.shape[1] == 0)


def decode_attention_cpu(query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float,
                         variant: str = "native") -> Tensor | None:
    """`decode_attention_torch`'s result from the kernel, or None where it is unavailable (shapes as the twin's:
    query [R, heads, 1, d], keys/values [R, kv_heads, T, d], mask additive [R, 1, 1, T] or None)."""
    lib = library(variant)
    if lib is None or (variant == "native" and not lib.dspark_decode_attention_native()):
        return None  # no kernel, or a CPU without AVX512-BF16: the portable loops are no faster than the twin
    rows, heads, _, dim = query.shape
    kv_heads, total = keys.shape[1], keys.shape[2]
    if values.stride(-1) != 1 or values.shape != keys.shape:
        values = values.contiguous()
    q = query.reshape(rows, heads, dim).contiguous()
    m = None if mask is None else mask.reshape(rows, total).to(torch.float32).contiguous()
    out = torch.empty((rows, heads, 1, dim), dtype=torch.bfloat16)
    ks, vs = keys.stride(), values.stride()
    lib.dspark_decode_attention(
        q.data_ptr(), keys.data_ptr(), values.data_ptr(), None if m is None else m.data_ptr(), out.data_ptr(),
        rows, kv_heads, heads // kv_heads, total, dim, ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
        float(scale), torch.get_num_threads(),
    )
    return out


__all__ = ["covers", "decode_attention_cpu", "library", "ready"]
