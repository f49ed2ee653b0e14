"""Every kernel compiles for an H100/H200 (sm_90) without a GPU: the interpreter accepts code the GPU compiler
rejects, so the CPU-only run also compiles each kernel ahead of time (`python -m dspark_core.kernels.aot`),
in a subprocess without TRITON_INTERPRET (the interpreter's kernels cannot be compiled)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_every_kernel_compiles_for_sm90():
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("this triton build has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSPARK_KERNELS")}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # silences triton 3.9's notice; kernels pass enable_fp_fusion
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_core.kernels.aot", "--arch", "90"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compilations for sm_90: ok" in proc.stdout
