"""Which samples a run uses, and a fingerprint of exactly that data.

Subsets: each sample is ranked by sha256(f"{seed}:{sample.id}") and the n lowest ranks are kept, returned
in dataset order. The ranking depends only on (seed, id) — not on Python's hash seed, dict ordering or the
`random` module's algorithm — so the same (n_samples, seed) always picks the same samples, and for a fixed
seed a larger n is a superset of a smaller one. `n_samples=None` (or more than there are) keeps all.

Content hash: sha256 over canonical JSON (sorted keys, no whitespace) of the task version, the prompt
template and the selected samples (id, user turns, references, metadata) in order. It does not include the
task's name or where the data was read from, so a local copy and the hub's copy of the same data agree.
"""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from inputs.tasks.spec import TaskSample, TaskSpec

HASH_FORMAT = "harness.tasks/1"  # bump if what goes into content_hash changes


def select_subset(samples: Sequence[TaskSample], n_samples: int | None, seed: int = 0) -> tuple[TaskSample, ...]:
    if n_samples is None or n_samples >= len(samples):
        return tuple(samples)
    if not isinstance(n_samples, int) or isinstance(n_samples, bool) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive integer or None, got {n_samples!r}")
    ranks = sorted(range(len(samples)), key=lambda i: hashlib.sha256(f"{seed}:{samples[i].id}".encode()).digest())
    return tuple(samples[i] for i in sorted(ranks[:n_samples]))


def content_hash(spec: TaskSpec, samples: Sequence[TaskSample]) -> str:
    """Hex sha256 of the data a run actually uses (see module docstring)."""
    payload = {
        "format": HASH_FORMAT,
        "version": spec.version,
        "prompt_template": spec.prompt_template,
        "samples": [{"id": s.id, "turns": list(s.turns), "references": list(s.references),
                     "metadata": dict(s.metadata)} for s in samples],
    }
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
