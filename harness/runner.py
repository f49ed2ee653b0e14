"""`harness run`: a suite's cells, each measured by its backend and recorded in the store as it finishes.

Repeats are rounds (asv's interleaved rounds). Cells that share a baseline — the plain cell and the
speculative cells of the same backend, target, task, temperature, load point and seed (`baseline_key`)
— form a family, and each round measures every cell of every family once: a family's cells back to
back, the speculative ones in an order that rotates by one per round, between two passes of the plain
cell (an ABA sandwich; the closing pass is stored as repeat R + r), so each speculative cell and its
round's plain baseline saw nearly the same machine and their ratio is paired in time
(`harness.metrics.speedup`). Every cell of round r samples from round r's seeds (`Cell.in_round`,
`Cell.request_seed`), its closing plain pass too: a round is a new draw of every sampled output, paired across
the family's cells and with the same round of another run, so repeating a T > 0 cell adds data. Server
backends interleave at the server-config level: a unit is a server config (`server_config_key`, the
backends' interface agreed with h1) with all its load points, run while its server is up; units that
share a baseline form the family and rotate. `plan` fixes the whole order up front, so a resumed run
continues at the round and cell it stopped at. At the end, every speculative cell's per-round ratios are
validated and summarised (`v_rounds`, `v_speedup_summary`), with the unstable and invalid ones named.
Each cell is one store transaction: a kill or Ctrl-C loses at most the cell in flight, and
`--resume RUN_ID` runs the cells the run has no successful record of: those never reached and those that
failed (the failed attempt's error is kept in the store's `superseded_cells`). A cell that raises is
recorded as failed with its error and the suite goes on.

Everything that can be checked before measuring is checked first — the suite parses, the cells'
files exist, the store opens — so bad input exits 2 having written nothing.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from contracts.cells import Cell
from harness.run_errors import Interrupted, RunError  # noqa: F401  (raised here; callers import them from the runner too)

EXIT_OK, EXIT_FAILED_CELLS, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass(frozen=True)
class CellOutcome:
    cell: Cell
    repeat: int
    status: str  # ok | failed | skipped (already recorded, on resume)
    error: str | None = None
    wall_s: float = 0.0
    metrics: dict[str, float | None] = field(default_factory=dict)
    gpu_seconds: float = 0.0  # wall time × reserved GPUs (CPUs): the suite's `resources:` for the backend
    cpu_seconds: float = 0.0


@dataclass
class RunOutcome:
    run_id: str | None
    outcomes: list[CellOutcome]
    interrupted: bool = False
    speedups: list[tuple[str, object]] = field(default_factory=list)  # (label, harness.metrics.speedup.PairedSpeedup)
    notes: list[str] = field(default_factory=list)  # warnings shown with the summary (gates that cannot fire)

    @property
    def gpu_seconds(self) -> float:
        return sum(o.gpu_seconds for o in self.outcomes)

    @property
    def cpu_seconds(self) -> float:
        return sum(o.cpu_seconds for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_FAILED_CELLS if any(o.status == "failed" for o in self.outcomes) else EXIT_OK


SUMMARY_METRICS = ("acceptance_length", "throughput", "ece_calibrated", "ttft_p50", "tpot_p50")


def baseline_key(cell: Cell) -> str:
    """What a speculative cell is compared with plain decoding on (the pairing of `v_speedup`): the same
    backend, target, task (its whole spec), temperature, load point and seed."""
    import json

    task = cell.params()["task"]
    return json.dumps([cell.backend, cell.target.name, task, cell.concurrency, cell.rate, cell.seed], sort_keys=True)


def families(cells: Sequence[Cell], server_key: Mapping[str, str | None] | None = None) -> list[list[list[Cell]]]:
    """Cells as families of units, in first-appearance order. A unit runs back to back: one cell, or
    every cell of one server config (`server_key[cell_id]`, None: in process). A family is the units
    linked by a shared baseline (connected components over `baseline_key`): what rotates in a round."""
    server_key = server_key or {}
    units: dict[tuple, list[Cell]] = {}
    for cell in cells:
        key = server_key.get(cell.cell_id)
        units.setdefault(("server", cell.backend, key) if key is not None else ("cell", cell.cell_id), []).append(cell)
    parent = {unit: unit for unit in units}

    def root(unit):
        while parent[unit] != unit:
            parent[unit] = parent[parent[unit]]
            unit = parent[unit]
        return unit

    first_unit: dict[str, tuple] = {}
    for unit, members in units.items():
        for cell in members:
            other = first_unit.setdefault(baseline_key(cell), unit)
            parent[root(unit)] = root(other)
    grouped: dict[tuple, list[list[Cell]]] = {}
    for unit, members in units.items():
        grouped.setdefault(root(unit), []).append(members)
    return list(grouped.values())


def _is_plain(unit: Sequence[Cell]) -> bool:
    return all(cell.drafter.method == "none" for cell in unit)


def plan(cells: Sequence[Cell], repeats: int,
         server_key: Mapping[str, str | None] | None = None) -> list[tuple[Cell, int]]:
    """(cell, repeat) in execution order: round 0, then round 1, …; in round r every family's units in
    turn. A family with plain and speculative units runs an ABA sandwich: its plain units, its
    speculative units rotated by r, its plain units again as repeat `repeats` + r (the closing pass,
    harness.metrics.speedup); any other family rotates all its units by r (module docstring). Every cell
    of round r, closing pass included, is `cell.in_round(r)`."""
    work = []
    groups = families(cells, server_key)
    for repeat in range(repeats):
        for units in groups:
            plain = [unit for unit in units if _is_plain(unit)]
            spec = [unit for unit in units if not _is_plain(unit)]
            rotating = spec if plain and spec else units
            shift = repeat % len(rotating)
            opening = plain if plain and spec else []
            for unit in opening + rotating[shift:] + rotating[:shift]:
                work += [(cell.in_round(repeat), repeat) for cell in unit]
            work += [(cell.in_round(repeat), repeats + repeat) for unit in opening for cell in unit]
    return work


def round_slots(work: Sequence[tuple[Cell, int]], repeats: int | None = None) -> dict[tuple[str, int], int]:
    """(cell id, repeat) → its position in its round (0: measured first), stored as `cells.round_slot`;
    a closing plain pass (repeat ≥ `repeats`) belongs to round repeat − `repeats`."""
    slots: dict[tuple[str, int], int] = {}
    count: dict[int, int] = {}
    for cell, repeat in work:
        round_ = repeat - repeats if repeats is not None and repeat >= repeats else repeat
        slots[(cell.cell_id, repeat)] = count.get(round_, 0)
        count[round_] = count.get(round_, 0) + 1
    return slots


def check_gates(suite, suite_path, overridden: bool = False) -> None:
    """RunError when a gate of the suite cannot reach significance with the suite's rounds (repeats),
    unless the rounds were overridden (--repeats, also `overridden` when it was written into the suite):
    a short run asked for on purpose still runs, with `gate_warnings`."""
    from harness.gate.rules import rounds_needed

    short = [(rule, need) for rule in suite.gates if (need := rounds_needed(rule)) and need > suite.repeats]
    if short and not overridden:
        raise RunError(f"{suite_path}: " + "; ".join(
            f"gate {rule.metric} ({rule.test}, alpha {rule.alpha:g}, min_samples {rule.min_samples}) needs "
            f"repeats >= {need} (rounds), the suite has {suite.repeats}" for rule, need in short))


def gate_warnings(suite, num_repeats: int) -> list[str]:
    """The gates that `num_repeats` rounds leave unable to fire, one line each, shown before the run."""
    from harness.gate.rules import rounds_needed

    return [f"warning: with {num_repeats} rounds gate {rule.metric} ({rule.test}) cannot fire: it needs {need}"
            for rule in suite.gates if (need := rounds_needed(rule)) and need > num_repeats]


def _repeats_overridden(overrides) -> bool:
    return getattr(overrides, "repeats", None) is not None


def load_cells(suite_path: str | Path, only: Sequence[str] = (), check_files: bool = True, overrides=None):
    """(suite, selected cells); RunError for anything wrong with the suite or, with `check_files`, the
    model files and task data it names (a dry run checks neither: it plans for another machine).
    `overrides`: harness.overrides.Overrides (command-line values written into the suite)."""
    from harness.overrides import load as load_overridden
    from harness.suite import SuiteError, check_paths, expand, select

    try:
        suite = load_overridden(suite_path, overrides)
        cells = select(expand(suite), list(only))
        if check_files:
            check_paths(suite, cells)
    except SuiteError as exc:
        raise RunError(str(exc)) from None
    except FileNotFoundError as exc:
        raise RunError(f"{suite_path}: {exc}") from None
    if not cells:
        raise RunError(f"{suite_path}: no cells to run" + (f" after --only {' '.join(only)}" if only else ""))
    check_gates(suite, suite_path, overridden=_repeats_overridden(overrides))
    if check_files:
        check_data(suite_path, cells)
    return suite, cells


def check_data(suite_path, cells: Sequence[Cell]) -> None:
    """Every task's data loads (data directory, else the hub) before any cell runs: missing data is
    bad input, not a row of failed cells."""
    from inputs.tasks import DataNotFoundError, TaskConfigError, load_task

    for name, n_samples, seed in sorted({(c.task.name, c.task.n_samples, c.seed) for c in cells}):
        try:
            load_task(name, n_samples=n_samples, seed=seed)
        except (DataNotFoundError, TaskConfigError) as exc:
            raise RunError(f"{suite_path}: task {name!r}: {exc}") from None


def run_suite(
    suite_path: str | Path,
    *,
    db_path: str | Path,
    only: Sequence[str] = (),
    repeats: int | None = None,
    resume: str | None = None,
    display=None,
    argv: Sequence[str] = (),
    backend_options: dict | None = None,
    executor=None,
    overrides=None,
    label: str | None = None,
    metadata: dict[str, str] | None = None,
) -> RunOutcome:
    """Run (or resume) a suite into the store at `db_path`; RunError before anything is written.
    `executor`: where cells run (harness.executors; default: this process, one at a time)."""
    from harness import provenance
    from harness.progress import PlainDisplay
    from harness.store import RunInfo, Store, StoreError

    display = display or PlainDisplay()
    suite, cells = load_cells(suite_path, only, overrides=overrides)
    num_repeats = repeats if repeats is not None else suite.repeats
    if num_repeats < 1:
        raise RunError(f"--repeats must be >= 1, got {num_repeats}")
    notes = gate_warnings(suite, num_repeats)  # load_cells refused the gates no round count could fire
    if resume is not None and not Path(db_path).is_file():  # a typo must not leave an empty store behind
        raise RunError(f"--resume {resume}: there is no store at {db_path}, so no such run (check --db)")
    try:
        store = Store.open(db_path)
    except StoreError as exc:
        raise RunError(str(exc)) from None

    with store:
        host = provenance.host_info()
        host_fp = provenance.host_fingerprint(host)
        packages = provenance.package_versions()
        done: set[tuple[str, int]] = set()
        if resume is not None:
            run_id = _check_resumable(store, resume, suite)
            done = {key for key, status in store.cell_status(run_id).items() if status == "ok"}
            if repeats is None:  # the rounds the run planned, so it continues where it stopped
                num_repeats = store.run(run_id).get("repeats") or num_repeats
            store.set_run_status(run_id, "running")
        else:
            sha, branch, dirty = provenance.git_info(Path(suite_path).resolve().parent)
            run_id = store.begin_run(RunInfo(
                suite_name=suite.name, suite_path=str(suite_path), suite_text=suite.resolved_text,
                suite_hash=suite.hash, git_sha=sha, git_branch=branch, git_dirty=dirty, host_fingerprint=host_fp,
                host=host, packages=packages, argv=list(argv), repeats=num_repeats, label=label,
                metadata=dict(metadata or {}),
            ))
        from harness.executors import get_executor, reserved

        from contracts import redaction

        def options_for(cell: Cell) -> dict:
            options = (backend_options or {}) | dict(suite.backend_options.get(cell.backend, {}))
            redaction.register_from_options(options)  # api_key_env's value never reaches a row
            return options

        outcome = RunOutcome(run_id, [], notes=notes)
        runner = executor if executor is not None else get_executor("local")
        prepare = getattr(runner, "prepare", None)  # server configs of the cells; plan_servers (TEAM.md)
        server_key = prepare(cells, options_for) if prepare else None
        work = plan(cells, num_repeats, server_key)
        slots = round_slots(work, num_repeats)
        display.start(run_id, suite, len(work), resumed=resume is not None)
        todo = []
        for cell, repeat in work:
            if (cell.cell_id, repeat) in done:
                outcome.outcomes.append(CellOutcome(cell, repeat, "skipped"))
                display.cell_skipped(cell, repeat)
            else:
                todo.append((cell, repeat))
        getattr(display, "planned", lambda work: None)(todo)  # the ETA's one hook (harness.progress)

        def resources_for(cell: Cell) -> dict:
            return reserved(suite.resources.get(cell.backend))

        family = {cell.cell_id: i for i, units in enumerate(families(cells, server_key)) for unit in units for cell in unit}
        chained = {"chain_for": lambda cell: family[cell.cell_id]} if _accepts(runner.run, "chain_for") else {}
        completed = False
        try:
            with _signals_interrupt() as held:
                for cell_run in runner.run(todo, options_for, display, resources_for=resources_for, **chained):
                    with held():  # a signal while a finished cell is written: write it, then stop
                        result = _record(store, run_id, cell_run, host_fp, packages, resources_for,
                                         slots.get((cell_run.cell.cell_id, cell_run.repeat)))
                        outcome.outcomes.append(result)
                        display.cell_finished(result)
            completed = True
        except Interrupted:
            outcome.interrupted = True
        finally:
            # not completed: stopped by a signal, even a second one that cut the `except` above short
            outcome.interrupted = outcome.interrupted or not completed
            try:
                runner.close()
                store.finish_run(run_id, "interrupted" if outcome.interrupted else "finished")
            except (Interrupted, KeyboardInterrupt):  # a second Ctrl-C while closing: stop now, --resume finishes it
                outcome.interrupted = True
        outcome.speedups = paired_speedups(store, run_id)
        display.finish(outcome)
        return outcome


def _accepts(function, name: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def paired_speedups(store, run_id: str) -> list[tuple[str, object]]:
    """(label, PairedSpeedup) per speculative cell of the run: its per-round ratios over plain decoding's
    sandwich (`v_speedup`), every round of both cells and the closing plain pass validated first
    (`v_rounds`), summarised with its interval and drift (harness.metrics.speedup; `v_speedup_summary`
    is the same in SQL)."""
    from harness.metrics.speedup import RoundPair, paired_speedup

    _, rows = store.query("""
        SELECT v.cell_id, v.plain_cell_id, v.repeat, v.throughput, v.plain_open_throughput,
               concat_ws('; ', rs.problems, 'plain: ' || rp.problems, 'closing plain pass: ' || rc.problems,
                         CASE WHEN v.sandwiched AND v.plain_close_throughput IS NULL THEN 'no closing plain pass' END)
                   AS problems,
               v.plain_close_throughput, v.sandwich_position
        FROM v_speedup v JOIN runs r ON r.run_id = v.run_id
        JOIN v_rounds rs ON rs.run_id = v.run_id AND rs.cell_id = v.cell_id AND rs.repeat = v.repeat
        JOIN v_rounds rp ON rp.run_id = v.run_id AND rp.cell_id = v.plain_cell_id AND rp.repeat = v.repeat
        LEFT JOIN v_rounds rc ON rc.run_id = v.run_id AND rc.cell_id = v.plain_cell_id AND rc.repeat = v.repeat + r.repeats
        WHERE v.run_id = ? ORDER BY v.cell_id, v.repeat""", [run_id])
    _, cells = store.query("SELECT DISTINCT cell_id, label FROM cells WHERE run_id = ? AND method <> 'none' "
                           "ORDER BY label", [run_id])
    _, failed = store.query("SELECT cell_id, repeat FROM cells WHERE run_id = ? AND status <> 'ok'", [run_id])
    planned = (store.run(run_id) or {}).get("repeats") or 1
    pairs: dict[str, list] = {}
    for cell_id, _plain, repeat, spec, plain, problems, after, position in rows:
        pairs.setdefault(cell_id, []).append(RoundPair(int(repeat), spec, plain, tuple(filter(None, [problems])), after,
                                                       0.5 if position is None else position))
    failed_rounds = {}
    for cell_id, repeat in failed:
        failed_rounds.setdefault(cell_id, []).append(int(repeat))
    out = []
    for cell_id, label in cells:
        rounds = pairs.get(cell_id, [])
        rounds += [RoundPair(r, None, None, ("failed",)) for r in failed_rounds.get(cell_id, [])]
        if rounds or failed_rounds.get(cell_id):
            out.append((label, paired_speedup(rounds, planned)))
    return out


def _check_resumable(store, run_id: str, suite) -> str:
    run = store.run(run_id)
    if run is None:
        raise RunError(f"--resume {run_id}: no such run in the store")
    if run["suite_hash"] != suite.hash:
        raise RunError(f"--resume {run_id}: the suite changed since that run (hash {run['suite_hash'][:12]} → "
                       f"{suite.hash[:12]}); start a new run instead")
    return run_id


def _record(store, run_id: str, cell_run, host_fp: str, packages: dict, resources_for,
            round_slot: int | None = None) -> CellOutcome:
    """Write one finished cell (the driver is the store's only writer) and summarise it for the display.
    Cost: the cell's wall time × what the executor reserved for it (else what the suite declares)."""
    from harness import provenance

    from contracts.redaction import redact, redact_result

    cell, result, error, log = cell_run.cell, redact_result(cell_run.result), redact(cell_run.error), redact(cell_run.log)
    key = provenance.comparability_key(cell.params(), result.provenance if result else {}, host_fp, packages)
    resources = cell_run.resources if cell_run.resources is not None else resources_for(cell)
    gpu_s, cpu_s = cell_run.wall_s * resources["num_gpus"], cell_run.wall_s * resources["num_cpus"]
    store.record_cell(run_id, cell, cell_run.repeat, result=result, error=error,
                      started_at=cell_run.started_at, finished_at=cell_run.finished_at, comparability_key=key,
                      log=log, resources=resources, gpu_seconds=gpu_s, cpu_seconds=cpu_s,
                      round_slot=round_slot)
    metrics = {m: result.metrics.value(m) for m in SUMMARY_METRICS} if result is not None else {}
    status = "failed" if error else "ok"
    return CellOutcome(cell, cell_run.repeat, status, error, cell_run.wall_s, metrics, gpu_s, cpu_s)


@contextmanager
def _signals_interrupt() -> Iterator:
    """SIGINT and SIGTERM become `Interrupted` between (or inside) cells, so the run is marked and closed.
    Yields `held`: inside `with held():` a signal waits until the block is done (a cell being written
    is written whole; DuckDB would otherwise abort the write with 'Query interrupted')."""
    holding: list[bool] = [False]
    arrived: list[str] = []

    def handler(signum, frame):
        if holding[0]:
            arrived.append(signal.Signals(signum).name)
            return
        raise Interrupted(signal.Signals(signum).name)

    @contextmanager
    def held() -> Iterator[None]:
        holding[0] = True
        try:
            yield
        finally:
            holding[0] = False
        if arrived:
            raise Interrupted(arrived[0])

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. a test runner thread): leave signals alone
            pass
    try:
        yield held
    except KeyboardInterrupt:
        raise Interrupted("SIGINT") from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def dry_run(suite_path: str | Path, only: Sequence[str] = (), repeats: int | None = None, out=None,
            db_path: str | Path | None = None, overrides=None) -> int:
    """Print the cells, one line per server start (the exact argv, for the largest load of its cells), and a
    warning for what cannot be verified offline (the engine's interpreter or version, hub ids not on this
    machine), without running anything; with a store at `db_path` holding a run of the same suite, the cost
    that run's cells suggest."""
    out = out if out is not None else sys.stdout
    suite, cells = load_cells(suite_path, only, check_files=False, overrides=overrides)
    num_repeats = repeats if repeats is not None else suite.repeats
    servers, warnings = _planned_servers(suite, cells)
    server_key = {cell_id: command for command, ids in servers.items() for cell_id in ids}
    work = plan(cells, num_repeats, server_key)  # the runs as run_suite orders them, closing plain passes too
    closing = sum(1 for _, repeat in work if repeat >= num_repeats)
    print(f"suite {suite.name} ({suite.hash[:12]}): {len(cells)} cells × {num_repeats} repeats = {len(work)} cell runs"
          + (f" ({closing} closing plain passes of speedup sandwiches)" if closing else ""), file=out)
    for cell in cells:
        print(f"  {cell.cell_id}  {cell.label()}", file=out)
    for command, ids in servers.items():
        print(f"server for {len(ids)} cells: {command}", file=out)
    for warning in warnings:
        print(f"warning: {warning}", file=out)
    if db_path is not None:
        _print_estimate(db_path, suite, cells, work, out)
    return EXIT_OK


def _planned_servers(suite, cells: Sequence[Cell]) -> tuple[dict[str, list[str]], list[str]]:
    """(server argv → the cells it serves, warnings), as the backends will plan them (`plan_servers`)."""
    import shlex

    from contracts.backend import SERVER_COMMANDS, BackendError, get_backend, plan_servers
    from backends.draft_methods import present_here

    servers: dict[str, list[str]] = {}
    warnings: list[str] = []
    for name in dict.fromkeys(c.backend for c in cells if c.backend in SERVER_COMMANDS):
        group = [c for c in cells if c.backend == name]
        backend = get_backend(name, **dict(suite.backend_options.get(name, {})))
        plan_servers(backend, group)
        for cell in group:
            try:
                argv = backend.server_command(cell) or []
            except BackendError as exc:
                argv = [f"<unavailable: {exc}>"]
            servers.setdefault(shlex.join(argv), []).append(cell.cell_id)
        warnings += backend.dry_run_warnings(group)
    models = dict.fromkeys(m for c in cells for m in (c.target.path, c.drafter.checkpoint) if m)
    warnings += [f"{m} is not on this machine (a hub id, fetched when it loads; not checked offline)"
                 for m in models if "/" in m and not m.startswith((".", "/", "~")) and not present_here(m)]
    return servers, warnings


def _print_estimate(db_path, suite, cells: Sequence[Cell], work: Sequence[tuple[Cell, int]], out) -> None:
    """GPU- and CPU-seconds of the planned runs (`work`: every cell × repeat, closing plain passes
    included) from the newest run of the same suite name that recorded costs: per cell, the mean over
    that run's passes."""
    from harness.store import Store, StoreError

    if not Path(db_path).exists():
        return
    try:
        with Store.open(db_path, read_only=True) as store:
            _, rows = store.query(
                "SELECT run_id, cell_id, avg(gpu_seconds), avg(cpu_seconds) FROM cells WHERE run_id = ("
                "  SELECT r.run_id FROM runs r JOIN cells c USING (run_id)"
                "  WHERE r.suite_name = ? AND c.gpu_seconds IS NOT NULL ORDER BY r.started_at DESC LIMIT 1"
                ") AND gpu_seconds IS NOT NULL GROUP BY run_id, cell_id", [suite.name])
    except StoreError as exc:
        print(f"no cost estimate: {exc}", file=out)
        return
    if not rows:
        return
    history = {cell_id: (gpu, cpu) for _, cell_id, gpu, cpu in rows}
    known = [cell for cell, _ in work if cell.cell_id in history]
    gpu = sum(history[c.cell_id][0] for c in known)
    cpu = sum(history[c.cell_id][1] for c in known)
    print(f"estimated cost from run {rows[0][0]}: {gpu:.1f} GPU-seconds, {cpu:.1f} CPU-seconds for {len(known)} "
          f"of {len(work)} cell runs", file=out)
    for cell in cells:
        per_repeat = history.get(cell.cell_id)
        shown = f"{per_repeat[0]:.1f} GPU-s  {per_repeat[1]:.1f} CPU-s per pass" if per_repeat else "no history"
        print(f"  {cell.cell_id}  {shown}", file=out)
