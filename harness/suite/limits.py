"""`check_limits`: no cell may ask more of a machine than the suite's `limits:` allow (`schema.Limits`).

Why at load and by ceiling rather than by type alone: `max_new_tokens: 1000000000` and
`concurrency: [1000000000]` are well-typed integers that try to allocate hundreds of GB once a cell
starts, after other cells have run. A ceiling turns them into a line at the suite's own line before
anything runs; a suite that needs more writes its own ceiling, visibly, under `limits:`.
"""

from __future__ import annotations

import math
from typing import Iterable

from harness.suite.document import DocPath, Locations
from harness.suite.schema import AXES, SuiteDoc


def check_limits(doc: SuiteDoc, locations: Locations) -> None:
    """Raise a SuiteError at the first value above its ceiling, naming the `limits:` key that raises it."""
    limits = doc.limits
    for path, name, value in _sized(doc):
        ceiling = getattr(limits, name)
        if value > ceiling:
            raise locations.error(path, f"{value} is above the ceiling of {ceiling} for {name}; if this suite "
                                        f"really needs it, raise the ceiling with `limits: {{{name}: {value}}}`")
    cells = math.prod(len(getattr(doc.matrix, axis) or [None]) for axis in AXES if axis != "rate")
    cells = cells * max(1, len(doc.matrix.rate or [])) + len(doc.matrix.include)
    if cells > limits.cells:
        raise locations.error(("matrix",), f"the matrix has {cells} combinations, above the ceiling of {limits.cells} "
                                           f"for cells; raise it with `limits: {{cells: {cells}}}` if that is meant")


def _sized(doc: SuiteDoc) -> Iterable[tuple[DocPath, str, float]]:
    """(path, limit name, value) of every value a ceiling applies to."""
    for key, task in doc.tasks.items():
        yield ("tasks", key, "n_samples"), "n_samples", task.n_samples
        yield ("tasks", key, "max_new_tokens"), "max_new_tokens", task.max_new_tokens
    for name in ("concurrency", "rate"):
        if getattr(doc.defaults, name) is not None:
            yield ("defaults", name), name, getattr(doc.defaults, name)
        for i, value in enumerate(getattr(doc.matrix, name) or []):
            yield ("matrix", name, i), name, value
        for n, entry in enumerate(doc.matrix.include):
            if getattr(entry, name) is not None:
                yield ("matrix", "include", n, name), name, getattr(entry, name)
    yield ("defaults", "repeats"), "repeats", doc.defaults.repeats
    yield ("defaults", "warmup"), "warmup", doc.defaults.warmup
    for metric, gate in doc.gates.items():
        yield ("gates", metric, "resamples"), "resamples", gate.resamples
