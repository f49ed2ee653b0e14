"""keep_freed_memory: after it, a freed 24 MiB block is served from the heap, not a fresh mmap (glibc only)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                                reason="glibc ≥ 2.33 (mallinfo2) only")

# A fresh interpreter (the test process's own thresholds are whatever its earlier tests left): the bytes glibc
# holds in mmapped blocks while one 24 MiB block is allocated, before and after keep_freed_memory.
PROBE = textwrap.dedent("""
    import ctypes, json, sys
    from dspark_core.host_memory import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def mmapped_while_held(size=24 << 20):
        block = libc.malloc(size)
        held = libc.mallinfo2().hblkhd
        libc.free(block)
        return held

    before = mmapped_while_held()
    kept = keep_freed_memory()
    after = mmapped_while_held()
    print(json.dumps({"before": before, "kept": kept, "again": keep_freed_memory(), "after": after}))
""")


def _probe(env: dict[str, str]) -> dict:
    import json

    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                          env={**env, "PYTHONPATH": os.getcwd()})
    return json.loads(done.stdout)


def test_freed_large_blocks_stay_in_the_heap():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = _probe(env)
    assert out["before"] >= 24 << 20  # glibc's default: a block this large is its own mmap
    assert out["kept"] and out["again"]
    assert out["after"] < 24 << 20  # now from the heap


def test_the_users_own_glibc_settings_are_left_alone():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = _probe({**env, "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert not out["kept"] and out["after"] >= 24 << 20
