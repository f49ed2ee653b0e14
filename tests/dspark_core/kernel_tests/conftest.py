"""Kernel tests: on a machine without CUDA every kernel runs in Triton's interpreter (numpy, on CPU tensors).

TRITON_INTERPRET is read when a `@triton.jit` function is defined, i.e. when dspark_core.kernels imports a
kernel module, which it does lazily on the first Triton dispatch: setting it here, before any test of this
folder runs, is early enough. (This folder is a package, `kernel_tests`, so that this conftest does not shadow
tests/conftest.py, which other test modules import as `conftest`; the tests here import nothing by that
name, only its fixtures. Not `kernels`: pytest puts its parent on sys.path, and transformers imports a
top-level `kernels` package, Hugging Face's, where it finds one.)
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture
def triton_kernels(monkeypatch):
    """Dispatches take the Triton path for this test (the interpreter on CPU)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("DSPARK_KERNELS", "triton")


@pytest.fixture
def torch_kernels(monkeypatch):
    """Dispatches take the torch twin for this test."""
    monkeypatch.setenv("DSPARK_KERNELS", "torch")


@pytest.fixture
def new_qwen3(qwen3_target):
    """Builds private copies of the session's tiny Qwen3 (tests/conftest.py) on DEVICE, free to be switched to
    another attention implementation."""
    return lambda: copy.deepcopy(qwen3_target.model).to(DEVICE)
