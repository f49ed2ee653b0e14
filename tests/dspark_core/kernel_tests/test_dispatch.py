"""The dispatch rules (dspark_core/kernels/__init__.py): which path runs, and that nothing needs triton
unless a Triton path is chosen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dspark_core import kernels

ROOT = Path(__file__).resolve().parents[3]


def test_modes(monkeypatch):
    monkeypatch.delenv("DSPARK_KERNELS", raising=False)
    assert kernels.kernel_mode() == "auto"
    assert not kernels.use_triton("cpu")  # auto: CUDA tensors only
    monkeypatch.setenv("DSPARK_KERNELS", "torch")
    assert not kernels.use_triton("cuda")
    monkeypatch.setenv("DSPARK_KERNELS", "Triton")
    if kernels.triton_available() and kernels.interpreting():  # compiled (a CUDA machine), CPU tensors are
        assert kernels.use_triton("cpu")  # refused: test_forced_triton_without_the_interpreter_refuses
    monkeypatch.setenv("DSPARK_KERNELS", "cuda")
    with pytest.raises(ValueError, match="valid: auto, triton, torch"):
        kernels.kernel_mode()


def test_forced_triton_without_the_interpreter_refuses(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("DSPARK_KERNELS", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.use_triton("cpu")


_WITHOUT_TRITON = """
import sys
import importlib.util
class Block:  # as if triton were not installed: `import triton` fails, find_spec("triton") is None
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "triton":
            raise ImportError("triton is not installed")
sys.meta_path.insert(0, Block())
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] == "triton" else _find_spec(name, *a)
import torch
import dspark_core, dspark_core.generate, dspark_core.drafters, dspark_core.verification
from dspark_core import kernels
from dspark_core.scheduler import dispatch_schedule_prefix
from dspark_core.costs import SPSTable
from dspark_core.verification import dispatch_rejection_sample
assert not kernels.triton_available() and not kernels.use_triton("cuda")
out = dispatch_rejection_sample(torch.randn(1, 8), torch.zeros(0, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                               None, torch.ones(1), torch.zeros(0), torch.rand(1))
lengths = dispatch_schedule_prefix(torch.full((2, 3), 0.5, dtype=torch.float64), SPSTable.from_points([(64, 1.0)]))
assert "triton" not in sys.modules
print("ok", out.next_token_ids.tolist(), lengths.tolist())
"""


def test_everything_imports_and_runs_without_triton():
    """`import dspark_core` and every dispatch's twin path with triton uninstallable (auto mode, CPU)."""
    env = {"PATH": "/usr/bin:/bin", "DSPARK_KERNELS": "auto"}
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_TRITON], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


def test_twins_run_off_cuda_in_auto_mode(monkeypatch):
    monkeypatch.setenv("DSPARK_KERNELS", "auto")
    survival = torch.cumprod(torch.full((2, 3), 0.9, dtype=torch.float64), dim=1)
    from dspark_core.scheduler import dispatch_schedule_prefix, schedule_prefix
    from dspark_core.costs import SPSTable

    sps = SPSTable.from_points([(64, 1.0)])
    assert dispatch_schedule_prefix(survival, sps).tolist() == schedule_prefix(survival, sps).tolist() == [3, 3]
