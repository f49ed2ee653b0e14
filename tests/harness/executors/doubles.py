"""Test doubles for the Ray executor, passed as `RayExecutor(backend_factory=...)` (never registered as
backends, so no suite can name them):

- `crash_once`: the first attempt of one cell kills its worker process (`os._exit(1)`, as the OOM killer
  or a lost node would; a marker file, seen by every worker on this machine, remembers the crash); every
  other attempt runs on the real backend (or on `Empty`).
- `sleeper`: cells that take long and load nothing, one of them failing at once.
- `Empty`: an ok cell without requests, instantly, without torch.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path


class Empty:
    name = "empty"

    def run_cell(self, cell, progress=None):
        from contracts.cells import CellResult
        from harness.metrics import MeasurementWindow

        return CellResult(requests=[], steps=[], window=MeasurementWindow(0.0, 0.0))

    def close(self):
        pass


class CrashOnce:
    def __init__(self, name: str, options: dict, *, cell_id: str, marker: str, real: bool):
        self.name, self.options, self.cell_id, self.marker, self.real = name, options, cell_id, Path(marker), real
        self.inner = None

    def run_cell(self, cell, progress=None):
        if cell.cell_id == self.cell_id and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os._exit(1)
        if self.inner is None:
            from contracts.backend import get_backend

            self.inner = get_backend(self.name, **self.options) if self.real else Empty()
        return self.inner.run_cell(cell, progress=progress)

    def close(self):
        if self.inner is not None:
            self.inner.close()


def crash_once(cell_id: str, marker: str, real: bool = True):
    """A `backend_factory(name, options)` whose backends crash the first attempt of `cell_id`."""
    return functools.partial(CrashOnce, cell_id=cell_id, marker=marker, real=real)


class Sleeper:
    """The cell `quick` fails at once (a first result to arrive); every other cell sleeps `seconds`, long
    enough to still be running, or queued, when the executor is closed."""

    def __init__(self, name: str, options: dict, *, quick: str, seconds: float):
        self.name, self.quick, self.seconds = name, quick, seconds

    def run_cell(self, cell, progress=None):
        if cell.cell_id != self.quick:
            time.sleep(self.seconds)
        raise RuntimeError(f"{cell.cell_id} is a test double")

    def close(self):
        pass


def sleeper(quick: str, seconds: float):
    return functools.partial(Sleeper, quick=quick, seconds=seconds)
