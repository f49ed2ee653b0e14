"""Building and loading this package's C++ CPU kernels (`*.cpp` beside this file), at first use.

Each source is plain C++ with a C ABI, compiled by the system's C++ compiler (`$CXX`, else `c++`) for this CPU
(`-march=native`: AVX512-BF16 paths where the CPU has them) in about a second, and loaded with ctypes: no torch
headers, no ninja (`torch.utils.cpp_extension` needs ninja on PATH and ~20 s of torch headers). The shared object
is cached under `$HARNESS_CACHE_DIR/kernels` (default `~/.cache/dspark-harness/kernels`), named by a hash of the
source, flags, compiler and CPU flags, so a source change or another CPU builds its own. Threads are OpenMP's,
the runtime torch itself loaded (a library naming `libgomp.so.1` resolves to torch's copy).

`-ffast-math` is given when compiling (vectorised exponentials) but not when linking, so a library does not
switch the whole process to flushing denormals. Where no compiler is found or the build fails, `load` warns
once per process and returns None: each dispatch then runs its torch twin.
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

COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-std=c++17")
LINK_FLAGS = ("-shared", "-fopenmp")
VARIANTS = {"native": (), "portable": ("-mno-avx512bf16",)}  # portable: the loops every CPU runs (tested beside)


class BuildError(RuntimeError):
    """A kernel could not be built here; the message says why (its dispatch then runs the twin)."""


def cache_dir() -> Path:
    env = os.environ.get("HARNESS_CACHE_DIR")
    return (Path(env) if env else Path.home() / ".cache" / "dspark-harness") / "kernels"


@lru_cache(maxsize=1)
def cpu_flags() -> str:
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


def build(name: str, variant: str = "native") -> Path:
    """The shared object of `name`.cpp in `variant`, compiled into the cache unless already there."""
    compiler = _compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found ($CXX, c++, g++, clang++)")
    source = Path(__file__).with_name(f"{name}.cpp")
    flags = COMPILE_FLAGS + VARIANTS[variant]
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]  # what the sources include
    key = hashlib.sha256("\n".join([source.read_text(), *headers, " ".join(flags + LINK_FLAGS), *version,
                                    cpu_flags()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{variant}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        obj, lib = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
        for argv in ([compiler, *flags, "-c", str(source), "-o", str(obj)],
                     [compiler, *LINK_FLAGS, str(obj), "-o", str(lib)]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise BuildError(f"{' '.join(argv[:2])} … failed: {(done.stderr or done.stdout).strip()[-400:]}")
        os.replace(lib, target)  # atomic: a concurrent build of the same key writes the same bytes
    return target


@lru_cache(maxsize=None)
def load(name: str, variant: str = "native") -> ctypes.CDLL | None:
    """The loaded library of `name`.cpp, or None (with one warning) where it cannot be built here."""
    try:
        return ctypes.CDLL(str(build(name, variant)))
    except (BuildError, OSError) as err:
        warnings.warn(f"{name} runs its torch twin: the C++ kernel is unavailable ({err})", stacklevel=2)
        return None


__all__ = ["BuildError", "build", "cache_dir", "load"]
