"""What `harness run` shows while it works: cells done, requests of the cell in flight, an ETA, finished
cells, and at the end one table and a closing block (where the results went, what to run next).

Two displays with one interface: `RichDisplay` (a terminal: progress bars with an ETA, the latest
finished cells live; the live part is cleared at the end so the table is printed once) and
`PlainDisplay` (CI logs, pipes, tests, `--no-progress`: one line per cell, `--quiet`: none). Both end with
the same table and block, built from the runner's outcome, so nothing is only on screen.

The ETA is the dry-run estimate's idea applied while running: the newest run of the same suite gives
each cell id's wall time; once cells finish here, those times are scaled by how fast this run is
against that one (Σ actual / Σ historic of the cells done), and cells without history are given the
mean of the cells finished so far. Latencies are shown in ms, as the HTML report shows them.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence, TextIO

from contracts.cells import Cell

if TYPE_CHECKING:
    from rich.live import Live
    from rich.progress import ProgressColumn

# (header with its unit, metric, format, factor): one table, the same units as the HTML report
COLUMNS = (("τ (tok/step)", "acceptance_length", "{:.2f}", 1.0), ("tok/s", "throughput", "{:.1f}", 1.0),
           ("×plain", "speedup", "{:.2f}", 1.0), ("ECE cal", "ece_calibrated", "{:.3f}", 1.0),
           ("TTFT p50 (ms)", "ttft_p50", "{:.1f}", 1e3), ("TPOT p50 (ms)", "tpot_p50", "{:.2f}", 1e3))


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
        cols = [fmt.format(values[key] * factor) if values.get(key) is not None else ""
                for _, key, fmt, factor in COLUMNS]
        label = o.cell.label() + (f" #{o.repeat}" if o.repeat else "")
        rows.append((label, o.status if o.status == "ok" else f"FAILED: {o.error}", cols))
    return rows


def unpaired_warning(cells: Sequence[Cell]) -> str | None:
    """A sentence naming the speculative cells with no plain-decoding cell in their comparison group (their
    ×plain and speedup stay empty), or None when every one has a partner."""
    plain = {plain_group(c) for c in cells if c.is_plain}
    lonely = [c for c in cells if not c.is_plain and plain_group(c) not in plain]
    if not lonely:
        return None
    groups = list(dict.fromkeys(f"{c.backend}/{c.target.name}/{c.task.name}/"
                                + (f"c{c.concurrency}" if c.concurrency is not None else f"r{c.rate:g}") for c in lonely))
    shown = ", ".join(groups[:6]) + (f" and {len(groups) - 6} more" if len(groups) > 6 else "")
    return (f"{len(lonely)} speculative cell(s) have no plain-decoding cell to compare with ({shown}): their "
            "×plain and speedup stay empty; add drafter `none` to the matrix (or an include) for those groups")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass
class Eta:
    """Remaining wall time of the planned cells (module docstring: history first, finished cells else)."""

    history: dict[str, float] = field(default_factory=dict)  # cell id → seconds in the newest run of the suite
    history_run: str | None = None
    remaining: dict[tuple[str, int], str] = field(default_factory=dict)  # (cell id, repeat) → cell id, to run
    done: list[tuple[float, float | None]] = field(default_factory=list)  # (actual, historic) of finished cells
    current_started: float | None = None

    def planned(self, work: Iterable[tuple[Cell, int]]) -> None:
        self.remaining = {(cell.cell_id, repeat): cell.cell_id for cell, repeat in work}

    def started(self, cell: Cell, repeat: int) -> None:
        self.current_started = time.monotonic()

    def finished(self, cell: Cell, repeat: int, wall_s: float) -> None:
        self.remaining.pop((cell.cell_id, repeat), None)
        self.done.append((wall_s, self.history.get(cell.cell_id)))
        self.current_started = None

    def skipped(self, cell: Cell, repeat: int) -> None:
        self.remaining.pop((cell.cell_id, repeat), None)

    def seconds(self) -> float | None:
        """Seconds left, or None before anything can be said (no history and no finished cell)."""
        if not self.remaining:
            return 0.0
        known = [(a, h) for a, h in self.done if h]
        speed = sum(a for a, _ in known) / sum(h for _, h in known) if known else 1.0
        mean_done = sum(a for a, _ in self.done) / len(self.done) if self.done else None
        if mean_done is None and self.history:
            mean_done = sum(self.history.values()) / len(self.history) * speed
        if mean_done is None:
            return None
        total = sum(self.history[c] * speed if c in self.history else mean_done for c in self.remaining.values())
        if self.current_started is not None:  # the cell in flight has already used some of its share
            first = next(iter(self.remaining.values()))
            share = self.history[first] * speed if first in self.history else mean_done
            total -= min(share, time.monotonic() - self.current_started)
        return total

    def text(self) -> str:
        seconds = self.seconds()
        if seconds is None:
            return "ETA ?"
        return f"ETA {_duration(seconds)}" + (" (from history)" if self.history and not self.done else "")


@dataclass
class RunContext:
    """What the closing block and the ETA need from the store, read before the run opens it for writing."""

    db_path: Path | None = None
    previous_run: str | None = None  # the newest earlier run of the same suite (for compare/gate)
    history: dict[str, float] = field(default_factory=dict)
    history_run: str | None = None


def run_context(db_path, suite_name: str | None) -> RunContext:
    """The previous run of `suite_name` and its cells' wall times; empty where the store has none."""
    from harness.store import Store, StoreError

    ctx = RunContext(Path(db_path) if db_path is not None else None)
    if db_path is None or suite_name is None or not Path(db_path).exists():
        return ctx
    try:
        with Store.open(db_path, read_only=True) as store:
            _, rows = store.query(
                "SELECT run_id FROM runs WHERE suite_name = ? AND kind = 'suite' ORDER BY started_at DESC LIMIT 1",
                [suite_name])
            if not rows:
                return ctx
            ctx.previous_run = ctx.history_run = rows[0][0]
            _, rows = store.query(
                "SELECT cell_id, avg(epoch(finished_at - started_at)) FROM cells WHERE run_id = ? AND status = 'ok' "
                "AND finished_at IS NOT NULL GROUP BY cell_id", [ctx.history_run])
            ctx.history = {cell_id: float(s) for cell_id, s in rows if s is not None}
    except StoreError:
        pass  # an unreadable store is reported by the run itself
    return ctx


def display_for(quiet: bool = False, no_progress: bool = False, context: RunContext | None = None):
    """The display `harness run` uses: live on a terminal unless --no-progress/--quiet, plain lines else."""
    if sys.stdout.isatty() and not quiet and not no_progress:
        return RichDisplay(context=context)
    return PlainDisplay(quiet=quiet, context=context)


class PlainDisplay:
    def __init__(self, out: TextIO | None = None, quiet: bool = False, context: RunContext | None = None):
        self.out = out if out is not None else sys.stdout
        self.index = 0
        self.total = 0
        self.quiet = quiet
        self.context = context or RunContext()
        self.eta = Eta(history=self.context.history, history_run=self.context.history_run)

    def start(self, run_id: str, suite, total: int, resumed: bool = False) -> None:
        self.total = total
        verb = "resuming" if resumed else "run"
        if not self.quiet:
            print(f"{verb} {run_id}: suite {suite.name}, {total} cells", file=self.out, flush=True)

    def planned(self, work) -> None:
        """The (cell, repeat) pairs still to run, in order (the runner's one call for the ETA)."""
        self.eta.planned(work)

    def cell_started(self, cell: Cell, repeat: int) -> None:
        self.index += 1
        self.eta.started(cell, repeat)

    def requests(self, done: int, total: int) -> None:
        pass

    def cell_skipped(self, cell: Cell, repeat: int) -> None:
        self.index += 1
        self.eta.skipped(cell, repeat)

    def cell_finished(self, outcome) -> None:
        self.eta.finished(outcome.cell, outcome.repeat, outcome.wall_s)
        label, status, cols = summary_rows([outcome])[0]
        if self.quiet and status == "ok":
            return
        shown = "  ".join(f"{name}={c}" for (name, _, _, _), c in zip(COLUMNS, cols) if c)
        print(f"[{self.index}/{self.total}] {label}: {status} ({outcome.wall_s:.1f} s; {self.eta.text()}) {shown}",
              file=self.out, flush=True)

    def finish(self, outcome) -> None:
        if not self.quiet:
            print(format_table(outcome), file=self.out, flush=True)
        print(format_closing(outcome, self.context), file=self.out, flush=True)


def _table_rows(outcome) -> tuple[list[str], list[list[str]], list[tuple[str, str]]]:
    rows = summary_rows(outcome.outcomes)
    header = ["cell", "status", *(name for name, _, _, _ in COLUMNS)]
    body = [[label, status.split(":")[0], *cols] for label, status, cols in rows]
    failed = [(label, status) for label, status, _ in rows if status != "ok"]
    return header, body, failed


def format_table(outcome) -> str:
    """The finished cells as one aligned table, numbers right-aligned, units in the headers."""
    header, body, _ = _table_rows(outcome)
    if not body:
        return "no cells ran"
    table = [header] + body
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = []
    for n, r in enumerate(table):
        lines.append("  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_closing(outcome, context: RunContext | None = None) -> str:
    """Failures, cost, where the results are and the commands that read them."""
    context = context or RunContext()
    _, body, failed = _table_rows(outcome)
    lines = [f"FAILED {label}: {status.partition(': ')[2]}" for label, status in failed]
    from harness.metrics.speedup import summary_lines  # paired per-round speedups, their intervals and drift

    lines += summary_lines(getattr(outcome, "speedups", [])) + list(getattr(outcome, "notes", []))
    lines.append(f"cost: {outcome.gpu_seconds:.1f} GPU-seconds, {outcome.cpu_seconds:.1f} CPU-seconds "
                 "(wall time × reserved resources)")
    run_id = outcome.run_id
    state = "interrupted — finish it with --resume " + str(run_id) if outcome.interrupted else "finished"
    lines.append(f"run {run_id}: {len(body) - len(failed)} ok, {len(failed)} failed; {state}")
    if run_id is None:
        return "\n".join(lines)
    db = context.db_path
    db_flag = "" if db is None or str(db) == "results/harness.duckdb" else f" --db {db}"
    lines.append(f"store: {db if db is not None else 'the --db of the run'}  run id: {run_id}")
    lines.append("next:")
    lines.append(f"  harness report {run_id}{db_flag} --out report/      # HTML page with plots")
    if context.previous_run and context.previous_run != run_id:
        lines.append(f"  harness gate --run {run_id} --baseline {context.previous_run}{db_flag}   # judge against the previous run")
        lines.append(f"  harness compare {context.previous_run} {run_id}{db_flag}   # what changed, with intervals")
    else:
        lines.append(f"  harness gate --run {run_id} --baseline BASELINE{db_flag}   # judge against a run, branch or .json")
    lines.append(f"  harness query{db_flag} \"select label, metric, value, unit from v_metrics where run_id = '{run_id}'\"")
    return "\n".join(lines)


def format_summary(outcome) -> str:
    """The table and the closing block (what PlainDisplay.finish prints)."""
    return format_table(outcome) + "\n" + format_closing(outcome)


def _eta_column(eta: Eta) -> ProgressColumn:
    """A rich progress column whose text is the ETA at render time (it keeps counting down within a cell);
    built in a function so that rich loads only when a live display starts."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class EtaColumn(ProgressColumn):
        def render(self, task):
            return Text(eta.text() if task.fields.get("eta") else "", style="progress.remaining")

    return EtaColumn()


class RichDisplay(PlainDisplay):
    """Progress bars (cells with an ETA, requests of the current cell) and the last finished cells, live;
    the live part disappears at the end, where one table and the closing block are printed."""

    def __init__(self, console=None, rows_shown: int = 12, context: RunContext | None = None):
        from rich.console import Console

        super().__init__(context=context)
        self.console = console or Console()
        self.rows_shown = rows_shown
        self.finished: list = []
        self.live: Live | None = None

    def start(self, run_id: str, suite, total: int, resumed: bool = False) -> None:
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = total
        self.run_id = run_id
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 _eta_column(self.eta), console=self.console)
        self.cells_task = self.progress.add_task(f"{'resume' if resumed else 'run'} {run_id} · {suite.name}", total=total,
                                                 eta=True)
        self.requests_task = self.progress.add_task("requests", total=1, eta=False)
        live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
        live.start()
        self.live = live

    def _table(self, outcomes, title: str | None = None):
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False, title=title)
        for name in ("cell", "status", *(n for n, _, _, _ in COLUMNS)):
            table.add_column(name, justify="left" if name in ("cell", "status") else "right")
        for label, status, cols in summary_rows(outcomes):
            table.add_row(label, status if status == "ok" else f"[red]{status[:60]}", *cols)
        return table

    def _render(self):
        from rich.console import Group

        return Group(self.progress, self._table(self.finished[-self.rows_shown:]))

    def cell_started(self, cell: Cell, repeat: int) -> None:
        super().cell_started(cell, repeat)
        self.progress.update(self.requests_task, description=cell.label(), completed=0, total=1)

    def requests(self, done: int, total: int) -> None:
        self.progress.update(self.requests_task, completed=done, total=total)

    def cell_skipped(self, cell: Cell, repeat: int) -> None:
        super().cell_skipped(cell, repeat)
        self.progress.advance(self.cells_task)

    def cell_finished(self, outcome) -> None:
        self.eta.finished(outcome.cell, outcome.repeat, outcome.wall_s)
        self.finished.append(outcome)
        self.progress.advance(self.cells_task)
        if self.live is not None:
            self.live.update(self._render())

    def finish(self, outcome) -> None:
        if self.live is not None:
            self.live.stop()
        self.console.print(self._table(outcome.outcomes))
        self.console.print(format_closing(outcome, self.context), highlight=False, soft_wrap=True)
