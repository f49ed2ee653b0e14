"""The default executor: cells one after another in this process, backends kept between cells."""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from harness.cells import Cell
from harness.executors.cell_run import CellRun, measure_cell


class LocalExecutor:
    def __init__(self) -> None:
        self.backends: dict[str, object] = {}

    def run(self, work: Sequence[tuple[Cell, int]], options_for: Callable[[Cell], dict], display,
            resources_for: Callable[[Cell], dict] | None = None) -> Iterator[CellRun]:
        from backends.base import get_backend, plan_servers
        from harness.runner import Interrupted

        for cell, repeat in work:
            display.cell_started(cell, repeat)
            try:
                if cell.backend not in self.backends:
                    self.backends[cell.backend] = get_backend(cell.backend, **options_for(cell))
                    plan_servers(self.backends[cell.backend], [c for c, _ in work if c.backend == cell.backend])
                backend = self.backends[cell.backend]
            except Exception as exc:  # noqa: BLE001 — e.g. an unknown backend option: this cell fails
                import traceback
                from datetime import datetime, timezone

                now = datetime.now(timezone.utc)
                yield CellRun(cell, repeat, None, f"{type(exc).__name__}: {exc}", traceback.format_exc(), now, now, 0.0)
                continue
            cell_run = measure_cell(cell, repeat, backend, progress=display.requests, interrupt=(Interrupted,))
            cell_run.resources = resources_for(cell) if resources_for else None
            yield cell_run

    def close(self) -> None:
        for backend in self.backends.values():
            try:
                backend.close()
            except Exception:  # noqa: BLE001 — closing must not mask the run's outcome
                pass
        self.backends.clear()
