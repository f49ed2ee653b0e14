"""The C++ kernel of a bf16 decode or verify step's attention on the CPU (`decode_attention.cpp`), built at first use.

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
_NATIVE: dict[int, bool] = {}  # id of a declared library: whether it has the AVX512-BF16 paths (asked once)


def library(variant: str = "native") -> ctypes.CDLL | None:
    """The loaded kernel with its signatures declared, or None where it cannot be built here."""
    lib = cpu_build.load(NAME, variant)
    if lib is not None and not any(lib is seen for seen in _DECLARED):
        i64 = ctypes.c_int64
        lib.dspark_decode_attention.argtypes = [ctypes.c_void_p] * 5 + [i64] * 13 + [ctypes.c_float, ctypes.c_int]
        lib.dspark_decode_attention.restype = None
        lib.dspark_decode_attention_native.restype = ctypes.c_int
        _DECLARED.append(lib)  # held, so no later library can take its place unseen
        _NATIVE[id(lib)] = bool(lib.dspark_decode_attention_native())
    return lib


def ready() -> bool:
    """Whether the dispatch runs this kernel: not `DSPARK_KERNELS=torch`, built here, and with its AVX512-BF16
    paths (elsewhere its portable loops are no faster than the twin)."""
    lib = library() if kernel_mode() != "torch" else None
    return lib is not None and _NATIVE[id(lib)]


def covers(query: Tensor, keys: Tensor) -> bool:
    """Whether the kernel takes these tensors: bf16 on the CPU, unit stride over head_dim."""
    return (query.dtype == keys.dtype == torch.bfloat16 and keys.device.type == "cpu"
            and keys.stride(-1) == 1 and query.shape[1] % keys.shape[1] == 0)


def decode_attention_cpu(query: Tensor, keys: Tensor, values: Tensor, visible: Tensor | None, scale: float,
                         variant: str = "native") -> Tensor | None:
    """`decode_attention_torch`'s result from the kernel, or None where it is unavailable (shapes as the twin's:
    query [R, heads, W, d], keys/values [R, kv_heads, T, d], visible [R, W] keys per query or None for all T)."""
    lib = library(variant)
    if lib is None or (variant == "native" and not _NATIVE[id(lib)]):
        return None  # no kernel, or a CPU without AVX512-BF16: the portable loops are no faster than the twin
    rows, heads, width, dim = query.shape
    kv_heads, total = keys.shape[1], keys.shape[2]
    if values.stride(-1) != 1 or values.shape != keys.shape:
        values = values.contiguous()
    if query.stride()[1:] != (width * dim, dim, 1):  # rows may stand apart (a slice of the rotary's output)
        query = query.contiguous()
    if visible is None:
        seen = torch.full((rows, width), total, dtype=torch.int64)
    else:  # the kernel reads exactly these keys (clamped to 1 … T)
        seen = visible if visible.dtype == torch.int64 and visible.is_contiguous() else visible.to(torch.int64).contiguous()
    out = torch.empty((rows, heads, width, dim), dtype=torch.bfloat16)
    ks, vs = keys.stride(), values.stride()
    lib.dspark_decode_attention(
        query.data_ptr(), keys.data_ptr(), values.data_ptr(), seen.data_ptr(), out.data_ptr(),
        rows, kv_heads, heads // kv_heads, width, total, dim, query.stride(0), ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
        float(scale), torch.get_num_threads(),
    )
    return out


__all__ = ["covers", "decode_attention_cpu", "library", "ready"]
