"""Where cells run: `local` (this process, one cell at a time) or `ray` (a Ray cluster, many at once).

An executor takes the work list and yields a `CellRun` per cell as each finishes; the runner (the
driver) is the only writer of the store, so executors never touch DuckDB. Both executors produce the
same records for the same suite: a cell's measurement depends only on the cell.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, Sequence

from contracts.cells import Cell
from harness.executors.cell_run import CellRun, measure_cell

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    def run(self, work: Sequence[tuple[Cell, int]], options_for: Callable[[Cell], dict], display,
            resources_for: Callable[[Cell], dict] | None = None) -> Iterator[CellRun]:
        """Run every (cell, repeat); yield each CellRun as it finishes (any order). `resources_for(cell)`:
        what to reserve for it (`reserved`), stamped on its CellRun for cost accounting. An executor that
        runs cells concurrently also takes `chain_for(cell)` (the runner passes it where the signature
        has it): cells of one chain run one at a time, in the order given (interleaved rounds)."""

    def close(self) -> None:
        """Free backends, cancel what is still running."""


def reserved(entry) -> dict[str, float]:
    """What a cell reserves, from the suite's `resources.<backend>` entry (None: not declared): num_cpus
    (default 1, as Ray's) and num_gpus (default 0), and memory_gb where declared."""
    declared = entry.model_dump(exclude_none=True) if entry is not None else {}
    return {"num_cpus": 1.0, "num_gpus": 0.0, **{name: float(value) for name, value in declared.items()}}


def get_executor(name: str, **options) -> Executor:
    if name == "local":
        from harness.executors.local import LocalExecutor

        return LocalExecutor()
    if name == "ray":
        from harness.executors.ray import RayExecutor

        return RayExecutor(**options)
    raise ValueError(f"unknown executor {name!r}; valid: {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "CellRun", "Executor", "get_executor", "measure_cell", "reserved"]
