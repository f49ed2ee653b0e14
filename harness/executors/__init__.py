"""Where cells run: `local` (this process, one cell at a time) or `ray` (a Ray cluster, many at once).

An executor takes the work list and yields a `CellRun` per cell as each finishes; the runner (the
driver) is the only writer of the store, so executors never touch DuckDB. Both executors produce the
same records for the same suite: a cell's measurement depends only on the cell.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, Sequence

from harness.cells import Cell
from harness.executors.cell_run import CellRun, measure_cell

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    def run(self, work: Sequence[tuple[Cell, int]], options_for: Callable[[Cell], dict], display) -> Iterator[CellRun]:
        """Run every (cell, repeat); yield each CellRun as it finishes (any order)."""

    def close(self) -> None:
        """Free backends, cancel what is still running."""


def get_executor(name: str, **options) -> Executor:
    if name == "local":
        from harness.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from harness.executors.ray import RayExecutor

        return RayExecutor(**options)
    raise ValueError(f"unknown executor {name!r}; valid: {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "CellRun", "Executor", "get_executor", "measure_cell"]
