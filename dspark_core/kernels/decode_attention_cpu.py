"""The C++ kernel of a bf16 decode step's attention on the CPU (`decode_attention.cpp`), built at first use.

Its twin and spec is `dspark_core.decode_attention.decode_attention_torch` (fp32 products over widened keys and
values); the dispatch, `decode_attention.decode_attention`, runs this kernel unless `DSPARK_KERNELS=torch` or it
cannot be built. The source is plain C with a C ABI, compiled by the system's C++ compiler (`$CXX`, else `c++`)
for this CPU (`-march=native`: the AVX512-BF16 paths where the CPU has them) in about a second, and loaded with
ctypes; no torch headers, no ninja. The shared object is cached under `$HARNESS_CACHE_DIR/kernels` (default
`~/.cache/dspark-harness/kernels`), named by a hash of the source, flags, compiler and CPU flags, so a source
change or another CPU builds its own. Threads are OpenMP's, the runtime torch itself loaded (the library names
`libgomp.so.1`, which the loader resolves to torch's copy), as many as `torch.get_num_threads()`.

Where no compiler is found or the build fails, the twin runs and a warning says why, once per process.
`-ffast-math` is given when compiling (the softmax's exponentials vectorised) but not when linking, so the
library does not switch the whole process to flushing denormals.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("decode_attention.cpp")
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-std=c++17")
LINK_FLAGS = ("-shared", "-fopenmp")
VARIANTS = {"native": (), "portable": ("-mno-avx512bf16",)}  # portable: the loops every CPU runs (tested beside)


def cache_dir() -> Path:
    env = os.environ.get("HARNESS_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "dspark-harness") / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")


class BuildError(RuntimeError):
    """The kernel could not be built here; the message says why (the dispatch then runs the twin)."""


def build(variant: str = "native") -> Path:
    """The shared object of `variant`, compiled into the cache unless already there."""
    compiler = _compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found ($CXX, c++, g++, clang++)")
    flags = COMPILE_FLAGS + VARIANTS[variant]
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256("\n".join([SOURCE.read_text(), " ".join(flags + LINK_FLAGS), *version,
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"decode_attention-{variant}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, lib = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        for argv in ([compiler, *flags, "-c", str(SOURCE), "-o", str(obj)], [compiler, *LINK_FLAGS, str(obj), "-o", str(lib)]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise BuildError(f"{' '.join(argv[:2])} … failed: {(done.stderr or done.stdout).strip()[-400:]}")
        os.replace(lib, target)  # atomic: a concurrent build of the same key writes the same bytes
    return target


@lru_cache(maxsize=None)
def library(variant: str = "native") -> ctypes.CDLL | None:
    """The loaded kernel, or None (with one warning) where it cannot be built here."""
    try:
        lib = ctypes.CDLL(str(build(variant)))
    except (BuildError, OSError) as err:
        warnings.warn(f"decode attention runs the torch twin: the C++ kernel is unavailable ({err})", stacklevel=2)
        return None
    i64 = ctypes.c_int64
    lib.dspark_decode_attention.argtypes = [ctypes.c_void_p] * 5 + [i64] * 11 + [ctypes.c_float, ctypes.c_int]
    lib.dspark_decode_attention.restype = None
    lib.dspark_decode_attention_native.restype = ctypes.c_int
    return lib


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


__all__ = ["BuildError", "build", "covers", "decode_attention_cpu", "library"]
