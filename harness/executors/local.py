"""The default executor: cells one after another in this process, backends kept between cells.

`prepare` is the runner's one look at the backends before it plans: each cell's server config
(`server_config_key`, None for in-process backends) and, once per backend with all its cells,
`plan_servers` (so a server starts with the largest load its cells need). Both are the backend
interface agreed in TEAM.md, read with getattr defaults (None, no-op) for backends without them.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from contracts.cells import Cell
from harness.executors.cell_run import CellRun, measure_cell


class LocalExecutor:
    def __init__(self) -> None:
        self.backends: dict[str, object] = {}

    def _backend(self, cell: Cell, options_for: Callable[[Cell], dict]):
        from contracts.backend import get_backend

        if cell.backend not in self.backends:
            self.backends[cell.backend] = get_backend(cell.backend, **options_for(cell))
        return self.backends[cell.backend]

    def prepare(self, cells: Sequence[Cell], options_for: Callable[[Cell], dict]) -> dict[str, str | None]:
        """cell id → server config key (None: in process, or the backend could not be built — its cells
        then fail one by one when they run, as before)."""
        from contracts.backend import plan_servers, server_config_key

        keys: dict[str, str | None] = {}
        by_backend: dict[str, list[Cell]] = {}
        for cell in cells:
            by_backend.setdefault(cell.backend, []).append(cell)
        for name, members in by_backend.items():
            try:
                backend = self._backend(members[0], options_for)
            except Exception:  # noqa: BLE001 — recorded per cell by run()
                keys.update({cell.cell_id: None for cell in members})
                continue
            keys.update({cell.cell_id: server_config_key(backend, cell) for cell in members})
            plan_servers(backend, members)
        return keys

    def run(self, work: Sequence[tuple[Cell, int]], options_for: Callable[[Cell], dict], display,
            resources_for: Callable[[Cell], dict] | None = None, chain_for=None) -> Iterator[CellRun]:
        """Every (cell, repeat) in the order given: one chain already, so `chain_for` changes nothing."""
        from harness.run_errors import Interrupted

        for cell, repeat in work:
            display.cell_started(cell, repeat)
            try:
                backend = self._backend(cell, options_for)
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
