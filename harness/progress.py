"""What `harness run` shows while it works: cells done, requests of the cell in flight, finished cells.

Two displays with one interface: `RichDisplay` (a terminal: progress bars and a live table of the
latest finished cells) and `PlainDisplay` (CI logs, pipes, tests: one line per cell). Both end with the
same summary table, which the runner's outcome also carries, so nothing is only on screen.
"""

from __future__ import annotations

import sys
from typing import TextIO

from harness.cells import Cell

COLUMNS = (("τ", "acceptance_length", "{:.2f}"), ("tok/s", "throughput", "{:.0f}"),
           ("×plain", "speedup", "{:.2f}"), ("ECE cal", "ece_calibrated", "{:.3f}"),
           ("TTFT p50", "ttft_p50", "{:.3f}"), ("TPOT p50", "tpot_p50", "{:.4f}"))


def plain_group(cell: Cell) -> tuple:
    """Cells that plain decoding is compared with: same everything but the drafter, γ and policy."""
    return (cell.backend, cell.target, cell.task, cell.concurrency, cell.rate, cell.seed, cell.warmup)


def summary_rows(outcomes) -> list[tuple[str, str, list[str]]]:
    """(label, status, formatted metric columns) per recorded cell, with speedup over plain decoding in
    the same run and repeat where that cell was measured."""
    plain = {(plain_group(o.cell), o.repeat): o.metrics.get("throughput")
             for o in outcomes if o.status == "ok" and o.cell.is_plain}
    rows = []
    for o in outcomes:
        if o.status == "skipped":
            continue
        values = dict(o.metrics)
        base = plain.get((plain_group(o.cell), o.repeat))
        if base and values.get("throughput") is not None and not o.cell.is_plain:
            values["speedup"] = values["throughput"] / base
        cols = [fmt.format(values[key]) if values.get(key) is not None else "" for _, key, fmt in COLUMNS]
        label = o.cell.label() + (f" #{o.repeat}" if o.repeat else "")
        rows.append((label, o.status if o.status == "ok" else f"FAILED: {o.error}", cols))
    return rows


class PlainDisplay:
    def __init__(self, out: TextIO | None = None):
        self.out = out if out is not None else sys.stdout
        self.index = 0
        self.total = 0

    def start(self, run_id: str, suite, total: int, resumed: bool = False) -> None:
        self.total = total
        verb = "resuming" if resumed else "run"
        print(f"{verb} {run_id}: suite {suite.name}, {total} cells", file=self.out, flush=True)

    def cell_started(self, cell: Cell, repeat: int) -> None:
        self.index += 1

    def requests(self, done: int, total: int) -> None:
        pass

    def cell_skipped(self, cell: Cell, repeat: int) -> None:
        self.index += 1

    def cell_finished(self, outcome) -> None:
        label, status, cols = summary_rows([outcome])[0]
        shown = "  ".join(f"{name}={c}" for (name, _, _), c in zip(COLUMNS, cols) if c)
        print(f"[{self.index}/{self.total}] {label}: {status} ({outcome.wall_s:.1f} s) {shown}", file=self.out, flush=True)

    def finish(self, outcome) -> None:
        print(format_summary(outcome), file=self.out, flush=True)


def format_summary(outcome) -> str:
    rows = summary_rows(outcome.outcomes)
    header = ["cell", "status", *(name for name, _, _ in COLUMNS)]
    table = [header] + [[label, status.split(":")[0], *cols] for label, status, cols in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    failed = [(label, status) for label, status, _ in rows if status != "ok"]
    lines += [f"{label}: {status}" for label, status in failed]
    from harness.metrics.speedup import summary_lines  # h4a: paired per-round speedups and notes

    lines += summary_lines(getattr(outcome, "speedups", [])) + list(getattr(outcome, "notes", []))
    lines.append(f"cost: {outcome.gpu_seconds:.1f} GPU-seconds, {outcome.cpu_seconds:.1f} CPU-seconds "
                 "(wall time × reserved resources)")
    state = "interrupted — finish it with --resume " + str(outcome.run_id) if outcome.interrupted else "finished"
    lines.append(f"run {outcome.run_id}: {len(rows) - len(failed)} ok, {len(failed)} failed; {state}")
    return "\n".join(lines)


class RichDisplay(PlainDisplay):
    """Progress bars (cells, requests of the current cell) and the last finished cells, live."""

    def __init__(self, console=None, rows_shown: int = 12):
        from rich.console import Console

        super().__init__()
        self.console = console or Console()
        self.rows_shown = rows_shown
        self.finished: list = []
        self.live = None

    def start(self, run_id: str, suite, total: int, resumed: bool = False) -> None:
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = total
        self.run_id = run_id
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=self.console)
        self.cells_task = self.progress.add_task(f"{'resume' if resumed else 'run'} {run_id} · {suite.name}", total=total)
        self.requests_task = self.progress.add_task("requests", total=1)
        self.live = Live(self._render(), console=self.console, refresh_per_second=4)
        self.live.start()

    def _render(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False)
        for name in ("cell", "status", *(n for n, _, _ in COLUMNS)):
            table.add_column(name, justify="left" if name in ("cell", "status") else "right")
        for label, status, cols in summary_rows(self.finished)[-self.rows_shown:]:
            table.add_row(label, status if status == "ok" else f"[red]{status[:60]}", *cols)
        return Group(self.progress, table)

    def cell_started(self, cell: Cell, repeat: int) -> None:
        super().cell_started(cell, repeat)
        self.progress.update(self.requests_task, description=cell.label(), completed=0, total=1)

    def requests(self, done: int, total: int) -> None:
        self.progress.update(self.requests_task, completed=done, total=total)

    def cell_skipped(self, cell: Cell, repeat: int) -> None:
        super().cell_skipped(cell, repeat)
        self.progress.advance(self.cells_task)

    def cell_finished(self, outcome) -> None:
        self.finished.append(outcome)
        self.progress.advance(self.cells_task)
        self.live.update(self._render())

    def finish(self, outcome) -> None:
        if self.live is not None:
            self.live.stop()
        self.console.print(format_summary(outcome), highlight=False)
