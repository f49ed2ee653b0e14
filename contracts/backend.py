"""The one interface every backend implements, and the lazy registry that finds them.

Here, in the leaf `contracts` package, because both sides need it: the harness calls backends through it and
backends implement it, and neither may import the other's internals (harness → backends is the only arrow).

The harness talks to engines only through `Backend`: `check` a cell before anything runs (so a
suite that cannot run fails before it measures), `run_cell` to measure one, `server_command` to show
what a server backend would launch (`harness run --dry-run`), `close` to free what it holds. Server
backends also say which server a cell needs (`server_config_key`) and are told every cell before any runs
(`plan_servers`), so that cells differing only in client load share one server started for the largest
load among them; `server_config_key` and `plan_servers` below give every backend those (None, no-op). Backends
are found by name through `"module:Class"` strings and imported only when a cell needs them, so
`import harness` never imports vllm or sglang and CPU machines run without them.
"""

from __future__ import annotations

import importlib
from typing import Callable, Protocol

from contracts.cells import Cell, CellResult

# progress(requests finished, requests in the cell)
Progress = Callable[[int, int], None]

BACKENDS: dict[str, str] = {
    "inhouse": "backends.inhouse.adapter:InhouseBackend",
    "vllm": "backends.vllm.adapter:VLLMBackend",
    "sglang": "backends.sglang.adapter:SGLangBackend",
    "openai": "backends.openai.adapter:OpenAIBackend",
}


# server backends: name → "module:function" building a cell's server argv (no engine import); the dry run
# asks the backend itself (`server_command`, after `plan_servers`) for the argv it will launch
SERVER_COMMANDS: dict[str, str] = {
    "vllm": "backends.vllm.server:server_argv",
    "sglang": "backends.sglang.server:server_argv",
}


class BackendError(RuntimeError):
    """A cell this backend cannot run as specified (the message says why and what would work)."""


class BackendUnavailable(BackendError):
    """The backend's engine is not installed or cannot start on this machine."""


class Backend(Protocol):
    name: str

    def check(self, cell: Cell) -> None:
        """Raise BackendError if the cell cannot run here (missing checkpoint, unsupported option)."""

    def run_cell(self, cell: Cell, progress: Progress | None = None) -> CellResult:
        """Run the cell's load and return its raw records, nothing derived (`harness.metrics.derive` does that for
        every backend alike); raise on failure (the runner records it)."""

    def server_command(self, cell: Cell) -> list[str] | None:
        """The argv of the server this cell would start, or None for an in-process engine."""

    def close(self) -> None:
        """Free models, servers and caches."""

    # optional (see `server_config_key` / `plan_servers` below for the defaults):
    #   server_config_key(cell) -> str | None   the server process the cell needs: its argv less client load
    #   plan_servers(cells) -> None              all of this backend's cells, once before any runs


def server_config_key(backend, cell: Cell) -> str | None:
    """The server configuration `cell` runs on (cells with equal keys share a server); None: in process."""
    key = getattr(backend, "server_config_key", None)
    return key(cell) if key is not None else None


def plan_servers(backend, cells) -> None:
    """Tell `backend` every cell it will run, so each server starts once, for the largest load it serves."""
    plan = getattr(backend, "plan_servers", None)
    if plan is not None:
        plan(list(cells))


def backend_class(name: str) -> type:
    """The backend class registered as `name`, imported now; BackendUnavailable if its engine is missing."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; valid: {', '.join(sorted(BACKENDS))}")
    module_name, _, class_name = BACKENDS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(f"backend {name!r} is not available here: {exc}") from exc
    return getattr(module, class_name)


def get_backend(name: str, **options) -> Backend:
    return backend_class(name)(**options)
