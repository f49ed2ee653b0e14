"""What the vLLM and SGLang backends share: a server process per command, reused across cells, measured over
HTTP, with the server's own words kept whenever a cell fails.

A subclass says what its server is (`label`, `build_argv`, `identity_flags`, which options section it reads)
and how a cell is measured against the running server (`measure`); this class owns the options every server
backend takes (python, host, port, startup_timeout_s, env, log_path, timeout_s), the process lifecycle
(`ReusedServer`), the failure handling, and the target tokenizers.

Server configurations: a cell's server is its argv less the client load (`server_config_key`); cells that
differ only in concurrency or rate share one, started once for the largest load among them (`plan_servers`,
called by the runner with all of a backend's cells before any runs). The argv is built for the engine version
the configured interpreter reports (`backends.engine_version`); what that version lacks is left out, and the
note goes to the cell's log. Each start is told a served-model name of its own, and only a server that lists
it in /v1/models is taken for the one launched; a port already in use is refused before launching.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import shlex
import sys
from typing import Any, Callable

from backends.server_args import interpreter
from contracts.backend import BackendError
from backends.engine_version import EngineVersion, engine_version
from backends.process import DIRECT, ReusedServer, ServerError
from inputs import model_refs
from contracts.cells import Cell, CellResult


class ServerBackend:
    name = ""  # the suite's backend name, and the section of backend_options it reads
    label = ""  # how messages name the server ("vLLM", "SGLang")
    default_port = 8000
    default_startup_timeout_s = 900.0

    def __init__(self, **options: Any):
        """`options`: the suite's `backend_options.<name>` (server flags and the adapter's own keys)."""
        self.options = dict(options)
        self.host = str(self.options.get("host") or "127.0.0.1")
        self.port = int(self.options.get("port", self.default_port))
        self.startup_timeout_s = float(self.options.get("startup_timeout_s", self.default_startup_timeout_s))
        env = self.options.get("env") or []
        env = [env] if isinstance(env, str) else env
        bad = [e for e in env if not isinstance(e, str) or "=" not in e]
        if bad:
            raise BackendError(f"backend_options.{self.name}.env entries are NAME=value strings, got {bad}")
        self.env = dict(e.split("=", 1) for e in env)
        self.python = interpreter(self.options) or sys.executable or "python3"
        self._servers = ReusedServer(f"{self.name} server")
        self._tokenizers: dict[str, Any] = {}
        self._planned: dict[str, int] = {}  # server config key → the load it is started for

    # ------------------------------------------------------------------ for subclasses

    def build_argv(self, cell: Cell, load: int, version: EngineVersion | None, notes: list[str]) -> list[str]:
        """The server argv for `cell` started for `load` in-flight requests on `version`; notes go to `notes`."""
        raise NotImplementedError

    def identity_flags(self, cell: Cell, name: str) -> list[str]:
        """Flags that make this start serve under `name` (listed by /v1/models)."""
        raise NotImplementedError

    def cell_load(self, cell: Cell) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------ server configurations

    def engine_version(self) -> EngineVersion:
        """The engine version of the configured interpreter (with the server's environment), asked once."""
        return engine_version(self.python, self.name, tuple(sorted(self.env.items())))

    def server_config_key(self, cell: Cell) -> str:
        """What identifies the cell's server: its argv with the load left at 0, and the environment."""
        argv = self.build_argv(cell, 0, None, [])
        return json.dumps([argv, sorted(self.env.items())])

    def plan_servers(self, cells) -> None:
        """Remember, per server config, the largest load among this backend's `cells` (cells it cannot run are
        left to fail when they run)."""
        self._planned = {}
        for cell in cells:
            if cell.backend != self.name:
                continue
            try:
                key = self.server_config_key(cell)
            except BackendError:
                continue
            self._planned[key] = max(self._planned.get(key, 0), self.cell_load(cell))

    def command(self, cell: Cell) -> tuple[list[str], list[str]]:
        """(the argv the cell's server is started with, notes on flags the engine version decided)."""
        try:
            load = max(self._planned.get(self.server_config_key(cell), 0), self.cell_load(cell))
        except BackendError:
            load = self.cell_load(cell)
        notes: list[str] = []
        return self.build_argv(cell, load, self.engine_version(), notes), notes

    def server_argv(self, cell: Cell) -> list[str]:
        return self.command(cell)[0]

    def server_command(self, cell: Cell) -> list[str] | None:
        return self.server_argv(cell)

    def dry_run_warnings(self, cells) -> list[str]:
        """What cannot be verified offline for these cells: the engine's interpreter or version, flags."""
        version = self.engine_version()
        warnings = [] if version.version else [f"{self.label}: cannot check flags against the engine version: "
                                               f"{version.problem}"]
        for cell in cells:
            try:
                warnings += [f"{self.label}: {note}" for note in self.command(cell)[1]]
            except BackendError:
                pass
        return list(dict.fromkeys(warnings))

    # ------------------------------------------------------------------ running a cell

    def run_on_server(self, cell: Cell, measure: Callable[[Any, list[str]], CellResult]) -> CellResult:
        """Start (or reuse) the cell's server, then `measure(server, argv)`. A failure becomes a BackendError
        that ends with the server's log tail (a server that died is forgotten, so the next cell starts a new
        one); a cell with failed requests keeps the tail in its log, after the version notes."""
        argv, notes = self.command(cell)
        server = self._ensure_server(cell, argv)
        try:
            result = measure(server, argv)
            server.check_alive()
        except BackendError as exc:
            raise BackendError(f"{exc}{self._tail(server)}") from None
        except Exception as exc:  # noqa: BLE001 — any failure of the cell: keep what the server said
            if not server.running:
                self._stop()
            raise BackendError(f"{self.label} cell failed: {type(exc).__name__}: {exc}{self._tail(server)}") from exc
        if any(r.record.failed for r in result.requests):
            result.log = server.log_tail()
        if notes:
            result.log = "".join(f"{self.label} version: {note}\n" for note in notes) + result.log
        return result

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def timeout_s(self) -> float:
        return float(self.options.get("timeout_s", 600.0))

    def close(self) -> None:
        self._stop()
        self._tokenizers.clear()

    # ------------------------------------------------------------------ lifecycle

    def _ensure_server(self, cell: Cell, argv: list[str]):
        """The running server for `argv`, reused when the previous cell had the same one; a new start serves
        under a name of its own, which /v1/models must then list."""
        name = f"harness-{secrets.token_hex(6)}"
        try:
            return self._servers.ensure(argv, f"{self.base_url}/health", env=self.env,
                                        startup_timeout_s=self.startup_timeout_s, log_path=self.options.get("log_path"),
                                        address=(self.host, self.port), launch_flags=self.identity_flags(cell, name),
                                        identify=lambda: name in self._served_names())
        except ServerError as exc:
            raise BackendError(f"{self.label} server did not start ({shlex.join(argv)}): {exc}") from None

    def _served_names(self) -> list[str]:
        try:
            with DIRECT.open(f"{self.base_url}/v1/models", timeout=5.0) as response:
                return [str(m.get("id")) for m in json.loads(response.read()).get("data") or []]
        except (OSError, ValueError, AttributeError):
            return []

    @property
    def _server(self):
        """The server process now running for this backend, if any."""
        return self._servers.process

    def _stop(self) -> None:
        self._servers.stop()

    def _tail(self, server) -> str:
        tail = server.log_tail() if server is not None else ""
        return f"\n--- {self.label} server log (tail) ---\n{tail}" if tail else ""

    def _tokenizer(self, text: str):
        if text not in self._tokenizers:
            from transformers import AutoTokenizer

            self._tokenizers[text] = AutoTokenizer.from_pretrained(model_refs.resolve(text).location)
        return self._tokenizers[text]


def installed(name: str) -> bool:
    """Whether `name` is an installed package here (a directory that merely shares its name, seen as a
    namespace package — tests/backends/vllm when tests/backends is on sys.path — does not count)."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None
