"""One cell measured by its backend, its metrics derived, failures captured: what every executor runs for each cell.

The backend returns raw records; `harness.metrics.derive` turns them into metrics here, in the worker that
ran the cell, so a Ray worker ships back a result the driver only stores."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone

from contracts.cells import Cell, CellResult
from harness.metrics.derive import derive


@dataclass
class CellRun:
    """The outcome of one (cell, repeat), ready for `Store.record_cell`."""

    cell: Cell
    repeat: int
    result: CellResult | None  # None when it failed
    error: str | None
    log: str
    started_at: datetime
    finished_at: datetime
    wall_s: float
    attempts: int = 1
    resources: dict | None = None  # what the executor reserved for it (cpus, gpus), for cost accounting


class CellInterrupted(Exception):
    """Raised through `measure_cell` so that Ctrl-C is never recorded as a failed cell."""


def measure_cell(cell: Cell, repeat: int, backend, progress=None, interrupt: tuple[type[BaseException], ...] = ()) -> CellRun:
    """Run `cell` on `backend`, turning any failure into an error string (the suite goes on).

    A cell whose every request failed is a failed cell: nothing it measured would mean anything.
    Exceptions in `interrupt` propagate (the executor's stop signal)."""
    started = datetime.now(timezone.utc)
    clock = time.perf_counter()
    result: CellResult | None = None
    error = log = None
    try:
        result = derive(cell, backend.run_cell(cell, progress=progress))
        failed = [r for r in result.requests if r.record.failed]
        if result.requests and len(failed) == len(result.requests):
            raise RuntimeError(f"every request failed; first: {failed[0].record.error}")
    except interrupt:
        raise
    except Exception as exc:  # noqa: BLE001 — any failure of one cell is recorded and the suite goes on
        error = f"{type(exc).__name__}: {exc}"
        log = traceback.format_exc()
    return CellRun(cell, repeat, result if error is None else None, error,
                   log or (result.log if result else ""), started, datetime.now(timezone.utc),
                   time.perf_counter() - clock)
