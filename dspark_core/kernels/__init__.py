"""Triton kernels for DSpark's hot paths, and the rule that picks them or their torch twins.

Each dispatch sits beside its twin, in the module that owns the concept, and asks `use_triton` here:

| dispatch (where)                                           | kernel module          | torch twin (the spec)            |
|------------------------------------------------------------|------------------------|----------------------------------|
| `drafters.dspark.draft_block`                              | `markov_draft.py`      | `DSparkModel.sample_block`       |
| `verification.dispatch_rejection_sample`                   | `rejection.py`         | `verification.rejection_sample`  |
| `kernels.attention_ref.varlen_attention`                   | `attention.py`         | `attention_ref.varlen_attention_torch` |
| `scheduler.dispatch_schedule_prefix`                       | `prefix_scheduler.py`  | `scheduler.schedule_prefix`      |
| `scheduler.dispatch_schedule_prefix_from_logits`           | `prefix_scheduler.py`  | `calibrated_survival` + `schedule_prefix` |
| `decode_attention.decode_attention` (CPU, bf16)            | `decode_attention_cpu.py` (C++) | `decode_attention.decode_attention_torch` |
| `decoder_forward.decoder_forward` (CPU, bf16)              | `decoder_pointwise_cpu.py` (C++) | `_rms_norm`, `_rope`, `act_fn(gate) * up` |
| `packed_linear.packed_linear` (CPU, bf16)                  | `bf16_linear_cpu.py` (C++) | oneDNN's packed linear, `F.linear` |
| `losses.draft_loss` (CPU, fp32, a reduced draft vocabulary) | `distill_loss_cpu.py` (C++) | its torch ops and autograd |

Wired: `DSparkDrafter.propose` calls `draft_block`, `verification.verify` calls `dispatch_rejection_sample`,
`PrefixScheduler.__call__` calls `dispatch_schedule_prefix`, and `TargetModel.__init__` calls
`attention_ref.use_varlen_attention`, which switches the Hugging Face model to "dspark_varlen" attention where
the Triton path runs (elsewhere the model keeps its attention; on the CPU, `dspark_core.sdpa_gqa`).

This package imports nothing from the core above it (only the leaf `dspark_core.distributions`), and it is
the only place that imports `triton`, lazily, inside a dispatch that chose the Triton path:
`import dspark_core` works without triton installed.

Four are not Triton: a bf16 decode or verify step's attention, a bf16 decoder layer's elementwise steps, a
bf16 linear and a training step's distillation terms (cross-entropy and L1, with their gradient) on the CPU,
C++ compiled for the CPU they run on at first use (`cpu_build.py`), where Triton has no compiled backend; they run under `auto` and `triton` wherever they build (the attention and the linear only where
the CPU has AVX512-BF16, the linear not on AMX CPUs, where oneDNN's tile products win at many rows), the twins
otherwise. The attention's queries and the linear's rows are computed alike whatever shares the call, so a bf16
verify step's logits are a decode step's bit for bit and greedy speculative decoding stays plain decoding.

Which path runs is `DSPARK_KERNELS` (read at every call, so a test can switch it):
- `auto` (default): Triton for CUDA tensors when triton is importable, the twin otherwise;
- `triton`: Triton always — on CUDA, or on CPU tensors under the interpreter (`TRITON_INTERPRET=1`, read
  when the kernel modules are first imported, i.e. at the first Triton dispatch); anything else raises
  rather than silently running the twin;
- `torch`: the twin always.
A dispatch also runs the twin where its kernel does not cover the case (say, an RNN head).

Every dispatch is free of host syncs on the Triton path (no `.item()`, no data-dependent shapes; the
SPS table's dense device copy is built once, at its first use), so an engine can enqueue draft →
schedule → verify without waiting on the device.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

import torch

MODES = ("auto", "triton", "torch")


def kernel_mode() -> str:
    mode = os.environ.get("DSPARK_KERNELS", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"DSPARK_KERNELS={mode!r}; valid: {', '.join(MODES)}")
    return mode


@lru_cache(maxsize=None)
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether Triton kernels run in the CPU interpreter (numpy) rather than compiled."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(device: torch.device | str) -> bool:
    """Whether a dispatch on tensors of `device` runs its Triton kernel (see the module docstring)."""
    mode = kernel_mode()
    if mode == "torch":
        return False
    on_cuda = torch.device(device).type == "cuda"
    if mode == "auto":
        return on_cuda and triton_available()
    if not triton_available():
        raise RuntimeError("DSPARK_KERNELS=triton but triton is not installed (pip install 'dspark-harness[kernels]')")
    if not (on_cuda or interpreting()):
        raise RuntimeError(
            f"DSPARK_KERNELS=triton on {torch.device(device).type} tensors needs TRITON_INTERPRET=1 "
            "(set before the first Triton dispatch imports the kernels)"
        )
    return True


__all__ = ["MODES", "interpreting", "kernel_mode", "triton_available", "use_triton"]
