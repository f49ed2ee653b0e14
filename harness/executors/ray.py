"""The Ray executor: every (cell, repeat) is a Ray task, run on whichever node has what the suite reserves.

    harness run suites/h100.yaml --executor ray                  # a local Ray instance, started and stopped here
    harness run suites/h100.yaml --executor ray --address auto   # a running cluster (`ray start --head`, KubeRay, …)

Placement. A task reserves the suite's `resources:` for its cell's backend (`num_cpus`, `num_gpus`,
`memory_gb`; unset: 1 CPU, no GPU) and builds the backend in its worker. One cell is one task, so one
node: a server backend (vLLM, SGLang) starts its server inside the task, on the GPUs Ray assigned to it
(CUDA_VISIBLE_DEVICES), and the load generator that drives it runs in the same task — server and client
always share a node and a reservation. Server backends are closed when their task ends, so no server
outlives its reservation. In-process backends on CPUs are kept per worker process (`_WORKER_BACKENDS`):
a worker loads a model once for all the cells it runs. GPU tasks get a fresh worker each (Ray's
default for GPU tasks, which returns their memory), so on GPUs a model loads per cell.

Every node needs the project installed at the same version (the task is this module's function) and the
models and data at the paths the suite names; the driver's HARNESS_*, HF_*, TRANSFORMERS_* and
TOKENIZERS_* variables and its working directory (where it exists on the node) are set in each task.

Rounds. The runner passes `chain_for(cell)`: the family of cells that share a plain baseline (its
interleaved rounds, harness.runner). A family's tasks run as a chain — one at a time, in the runner's
rotated round order — so the plain and speculative cells of a round stay paired in time on one
reservation's worth of machine; different families run in parallel. Without `chain_for`, every task
is its own chain.

Results. The head of every chain is submitted at once — Ray queues what does not fit — and each `CellRun` is yielded
as its task finishes (`ray.wait`), in completion order, and the next task of its chain is submitted; the runner, the driver, records it, so only the
driver writes the store. Progress is per cell: `cell_started` and `cell_finished` when a result arrives.

Failures. A failure inside the cell (the backend raised, every request failed) is captured by
`measure_cell` in the worker and recorded as the cell's error, not retried: it would fail again. A lost
task — its worker process died (a crash, the OOM killer), its node died or was preempted — is submitted
again, up to `max_retries` times, then recorded as failed with the reason. Ray's own retries are off,
so attempts are counted here (`CellRun.attempts`). A cell that no node of the cluster could ever hold
(more GPUs than any node has) fails at once instead of waiting forever.

Stopping. Ctrl-C or SIGTERM raises `Interrupted` in the driver's loop; `close()` then shuts Ray down if
this executor started it (its workers go with it), or else cancels what is still queued or running on the
cluster (`ray.cancel(force=True)`, repeated for any task that did not end).
Finished cells are recorded already; `--resume RUN_ID` runs the rest, on Ray or locally.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import traceback
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Sequence

from contracts.cells import Cell
from harness.executors.cell_run import CellRun, measure_cell

DEFAULT_RESOURCES = {"num_cpus": 1.0, "num_gpus": 0.0}
ENV_PREFIXES = ("HARNESS_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
# ray.exceptions that mean the task was lost rather than failed: its worker, node or objects are gone.
LOST = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "OwnerDiedError", "ObjectLostError",
        "OutOfMemoryError", "RaySystemError")

# Backends built in this worker process, reused by its later tasks: (factory, backend, options) → backend.
_WORKER_BACKENDS: dict[tuple[str, str, str], Any] = {}


@dataclass(frozen=True)
class _Task:
    cell: Cell
    repeat: int
    options: dict
    resources: dict
    attempt: int = 1
    chain: Any = None  # the family it runs in sequence with (chain_for); None: a chain of its own


class RayExecutor:
    def __init__(self, address: str | None = None, max_retries: int = 2, init_options: dict | None = None,
                 backend_factory: Callable[[str, dict], Any] | None = None, poll_s: float = 1.0):
        """`address`: a running cluster ("auto", "ray://host:10001", "host:6379"); None starts a local Ray
        instance (`init_options` go to `ray.init`, e.g. num_cpus) unless Ray is initialised already.
        `max_retries`: resubmissions of a task whose worker or node was lost. `backend_factory(name,
        options)` builds a backend in the worker (default: contracts.backend.get_backend); picklable."""
        from harness.run_errors import RunError

        try:
            import ray  # noqa: F401
        except ImportError:
            raise RunError("--executor ray needs Ray: pip install 'dspark-harness[ray]'") from None
        self.address = address
        self.max_retries = max_retries
        self.init_options = dict(init_options or {})
        self.backend_factory = backend_factory
        self.poll_s = poll_s
        self._started = False  # this executor called ray.init, so close() shuts Ray down
        self._pending: dict[Any, _Task] = {}  # ObjectRef → its task
        self._remote = None

    # ---- driver ---------------------------------------------------------------------------------

    def run(self, work: Sequence[tuple[Cell, int]], options_for: Callable[[Cell], dict], display,
            resources_for: Callable[[Cell], dict] | None = None,
            chain_for: Callable[[Cell], Any] | None = None) -> Iterator[CellRun]:
        try:
            yield from self._stream(work, options_for, display, resources_for, chain_for)
        except SystemError as exc:  # a signal while Ray's C code ran (submit, wait): see _reraise_signal
            _reraise_signal(exc)
            raise

    def _stream(self, work, options_for, display, resources_for, chain_for=None) -> Iterator[CellRun]:
        try:
            ray = self._connect()
            nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        except Exception as exc:  # noqa: BLE001 — no cluster: every cell fails with why (--resume reruns them)
            _reraise_signal(exc)
            ray, nodes = None, []
            unreachable = f"cannot start or reach Ray ({self.address or 'local'}): {_first_line(exc)}"
            unreachable_log = traceback.format_exc()
        chains: dict[Any, deque[_Task]] = {}
        for index, (cell, repeat) in enumerate(work):
            chain = ("chain", chain_for(cell)) if chain_for else ("task", index)
            resources = dict(resources_for(cell) if resources_for else DEFAULT_RESOURCES)
            chains.setdefault(chain, deque()).append(_Task(cell, repeat, options_for(cell), resources, chain=chain))

        def submit_next(chain) -> Iterator[CellRun]:
            """Submit the chain's next task that can run; yield those that cannot, as failed."""
            queue = chains[chain]
            while queue:
                task = queue.popleft()
                if ray is None:
                    display.cell_started(task.cell, task.repeat)
                    yield _failed(task, unreachable, unreachable_log)
                    continue
                if not _fits(nodes, task.resources):
                    display.cell_started(task.cell, task.repeat)
                    yield _failed(task, f"no node of the Ray cluster can hold {_shown(task.resources)} "
                                        f"(nodes: {'; '.join(_shown(_as_resources(n)) for n in nodes) or 'none'})")
                    continue
                self._submit(task)
                return

        for chain in list(chains):
            yield from submit_next(chain)
        while self._pending:
            ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=self.poll_s)
            for ref in ready:
                task = self._pending.pop(ref)
                try:
                    cell_run = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 — the task was lost, or Ray could not run it
                    _reraise_signal(exc)
                    reason = f"{type(exc).__name__}: {_first_line(exc)}"
                    if _lost(exc) and task.attempt <= self.max_retries:
                        self._submit(replace(task, attempt=task.attempt + 1))
                        continue
                    cell_run = _failed(task, f"{reason} (attempt {task.attempt} of {self.max_retries + 1})", str(exc))
                display.cell_started(task.cell, task.repeat)
                yield cell_run
                yield from submit_next(task.chain)

    def close(self) -> None:
        """Cancel every task still queued or running; shut Ray down if this executor started it."""
        try:
            import ray
        except ImportError:
            return
        # A cluster this executor started goes down whole with ray.shutdown() (its workers with it). Cancelling
        # its tasks one by one first only invites a race inside Ray (a force-cancel whose task's reply is in
        # flight aborts the driver: "Tried to complete task that was not pending"), so only a cluster that
        # outlives this run gets its tasks cancelled.
        if ray.is_initialized() and not self._started:
            _cancel_until_done(ray, list(self._pending))
        self._pending.clear()
        if self._started:
            ray.shutdown()
            self._started = False

    def _connect(self):
        import ray

        if not ray.is_initialized():
            options = {"log_to_driver": False, "logging_level": logging.WARNING, **self.init_options}
            if self.address is None:
                options.setdefault("include_dashboard", False)
            else:
                options["address"] = self.address
            # ray.init installs its own SIGTERM handler (sys.exit); the runner's turns SIGTERM into Interrupted.
            previous = signal.getsignal(signal.SIGTERM)
            ray.init(**options)
            if previous is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
            self._started = True
        if self._remote is None:
            self._remote = ray.remote(_run_task)
        return ray

    def _submit(self, task: _Task) -> None:
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
        options = {"num_cpus": task.resources.get("num_cpus", 1.0), "num_gpus": task.resources.get("num_gpus", 0.0),
                   "max_retries": 0, "retry_exceptions": False,
                   "name": f"cell {task.cell.cell_id} #{task.repeat} try {task.attempt}"}
        if task.resources.get("memory_gb"):
            options["memory"] = int(task.resources["memory_gb"] * 2**30)
        ref = self._remote.options(**options).remote(task.cell, task.repeat, task.options, task.resources,
                                                     task.attempt, env, os.getcwd(), self.backend_factory)
        self._pending[ref] = task


def _reraise_signal(exc: BaseException) -> None:
    """Ctrl-C / SIGTERM (the runner's handler raises `Interrupted`) inside Ray's C code surfaces as a
    SystemError caused by it: raise what the handler raised, never record it as the cell's failure."""
    from harness.run_errors import Interrupted

    for error in (exc, exc.__cause__, exc.__context__):
        if isinstance(error, (Interrupted, KeyboardInterrupt)):
            raise error from None


def _lost(exc: BaseException) -> bool:
    """The task did not fail, it was lost (worker, node or its objects gone): worth running again."""
    import ray.exceptions as rex

    lost = tuple(getattr(rex, name) for name in LOST if hasattr(rex, name))  # some are newer than Ray 2.9
    return isinstance(exc, lost) or (isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, lost))


def _fits(nodes: list[dict], resources: dict) -> bool:
    """Some node could hold the task (ray.nodes() totals; no node known: assume an autoscaler adds one)."""
    if not nodes:
        return True
    need = _ray_demand(resources)
    return any(all(node.get(name, 0.0) >= amount for name, amount in need.items() if amount) for node in nodes)


def _ray_demand(resources: dict) -> dict[str, float]:
    return {"CPU": resources.get("num_cpus", 1.0), "GPU": resources.get("num_gpus", 0.0),
            "memory": resources.get("memory_gb", 0.0) * 2**30}


def _as_resources(node: dict) -> dict:
    return {"num_cpus": node.get("CPU", 0.0), "num_gpus": node.get("GPU", 0.0),
            "memory_gb": round(node.get("memory", 0.0) / 2**30, 1)}


def _shown(resources: dict) -> str:
    return ", ".join(f"{name} {value:g}" for name, value in resources.items() if value is not None)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _failed(task: _Task, error: str, log: str = "") -> CellRun:
    now = datetime.now(timezone.utc)
    return CellRun(task.cell, task.repeat, None, error, log, now, now, 0.0, attempts=task.attempt,
                   resources=task.resources)


# ---- worker ---------------------------------------------------------------------------------------


def _run_task(cell: Cell, repeat: int, options: dict, resources: dict, attempt: int, env: dict, cwd: str,
              backend_factory: Callable[[str, dict], Any] | None) -> CellRun:
    """One cell in a Ray worker: the backend (cached unless it starts a server or holds GPUs), then
    `measure_cell`, which turns any failure of the cell into its error."""
    from contracts.backend import SERVER_COMMANDS, get_backend

    os.environ.update(env)
    if os.path.isdir(cwd):
        os.chdir(cwd)
    keep = cell.backend not in SERVER_COMMANDS and not resources.get("num_gpus")
    key = (repr(backend_factory), cell.backend, json.dumps(options, sort_keys=True, default=str))
    backend = _WORKER_BACKENDS.get(key) if keep else None
    if backend is None:
        try:
            backend = backend_factory(cell.backend, options) if backend_factory else get_backend(cell.backend, **options)
        except Exception as exc:  # noqa: BLE001 — e.g. an unknown backend option: this cell fails
            now = datetime.now(timezone.utc)
            return CellRun(cell, repeat, None, f"{type(exc).__name__}: {exc}", traceback.format_exc(), now, now, 0.0,
                           attempts=attempt, resources=resources)
        if keep:
            _WORKER_BACKENDS[key] = backend
    try:
        cell_run = measure_cell(cell, repeat, backend)
    finally:
        if not keep:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 — closing must not mask the cell's outcome
                pass
    cell_run.attempts, cell_run.resources = attempt, resources
    return cell_run


def _cancel_until_done(ray, refs: list, rounds: int = 10, grace_s: float = 1.0) -> None:
    """Force-cancel tasks on a cluster that outlives this run, and cancel again those that did not end.

    A single `ray.cancel` is sometimes lost when several tasks are cancelled at once: the task keeps its
    slot and runs to the end (one close in five lost one in `test_close_cancels_queued_and_running_tasks`
    on 2 CPUs, Ray 2.60). Cancelling again what has not ended after a grace period has caught every such
    case seen (a second round was needed once in 32 closes).
    """
    for _ in range(rounds):
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 — finished meanwhile, or its node is gone
                pass
        try:
            _, refs = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        except Exception:  # noqa: BLE001 — the cluster went away: nothing is left to cancel
            return
        if not refs:
            return
