"""Keeping freed host memory in the process, for loops that free and reallocate the same large tensors.

A draft's training step allocates tens of tensors of 10–100 MB (the block batch, [positions, draft vocab]
logits, softmaxes and their gradients) and frees them at its end. glibc's malloc serves a block above its mmap
threshold with a fresh mmap and unmaps it when freed, so every step faults every page of those tensors in
again, zeroed by the kernel: on a 2-core AMD Zen 4 (SmolLM2-135M's DSpark draft, 8,192-token vocabulary, fp32) a
step took 451 and 475 ms, and 352 and 350 ms with freed blocks kept (40 steps a process, the two alternated
twice; `sys` time had been a third of the wall clock). glibc raises that threshold by itself after a free, but only
for blocks up to the size freed, and trims the heap's top back to the kernel, so steady state never comes.

`keep_freed_memory` pins the threshold at glibc's maximum and stops trimming: a freed block stays in the heap
for the next step's tensor of the same size. The process keeps its peak memory until it exits, which a
training run reaches in its first steps anyway. Inference is left alone: a decode step's tensors are far
smaller, and the engine's DSpark tokens/s moved only within noise with the same setting (two alternated pairs).
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest accepted mmap threshold on a 64-bit host (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_NEVER = (1 << 31) - 1  # an int: trim only past 2 GiB of free heap top
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_kept = False


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks of up to 32 MiB in the heap and never trim it (once per process).
    True where it did (or already had); False on another C library or platform, or where the user set glibc's
    own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, which are theirs to choose."""
    global _kept
    if _kept:
        return True
    if not sys.platform.startswith("linux") or any(name in os.environ for name in _ENV):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's; musl has none
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_NEVER))
    return _kept


__all__ = ["keep_freed_memory"]
