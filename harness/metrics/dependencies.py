"""What a metric's value depends on beyond the cell's parameters: the scope within which two runs compare.

Each metric module declares, beside its definitions, a `DEPENDS_ON` table (base name → scope); the gate
reads it through `depends_on(name)` and compares a metric of a cell only where every part of its scope
agrees between candidate and baseline (`harness.gate.comparability`). Two scopes:

    CONTENT   what was computed, and by which numeric code: the cell parameters (dtype included), the
              checkpoints (target and draft hashes), the data (dataset hash), the prompt format and the
              engine (backend version, the tokenizer's transformers), the numeric code (torch, triton,
              vllm, sglang versions, and the device kind the kernels ran on: cpu or cuda) — never the CPU
              model. Acceptance, per-position acceptance, ECE/Brier and the greedy outputs are functions
              of these alone: the same engine on the same content yields them on any machine.
    HARDWARE  CONTENT and the host (CPU model, cores, GPUs, driver, CUDA: `provenance.host_fingerprint`):
              everything measured in seconds — throughput, latency, speedup, step times, window length.

Names resolve by their base: a per-position suffix `_k<j>` and a statistic suffix (`_mean`, `_p<q>`)
are stripped (`position_acceptance_conditional_k3` → `position_acceptance_conditional`, `ttft_p99` →
`ttft`). A name no module declares depends on HARDWARE: the narrowest comparison is the safe one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Scope:
    name: str  # content | hardware
    host: bool  # whether the host fingerprint is part of it
    why: str  # what a mismatch in the part beyond CONTENT is called in the gate's report


CONTENT = Scope("content", host=False, why="content differs")
HARDWARE = Scope("hardware", host=True, why="hardware differs")
SCOPES = (CONTENT, HARDWARE)

_SUFFIX = re.compile(r"(_k\d+|_p\d+(?:\.\d+)?|_mean)$")


@lru_cache(maxsize=None)
def _declared() -> dict[str, Scope]:
    from harness.metrics import acceptance, confidence, latency, rates, steps, summary

    out: dict[str, Scope] = {}
    for module in (acceptance, confidence, latency, rates, steps, summary):
        out.update(module.DEPENDS_ON)
    return out


def declared(name: str) -> Scope | None:
    """The scope a module declares for `name` (or its base name); None when none does."""
    table = _declared()
    base = name
    while True:
        if base in table:
            return table[base]
        stripped = _SUFFIX.sub("", base)
        if stripped == base:
            return None
        base = stripped


def depends_on(name: str) -> Scope:
    """The scope of a metric name: its declaration, HARDWARE for an undeclared name."""
    return declared(name) or HARDWARE
