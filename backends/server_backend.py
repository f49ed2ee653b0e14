"""What the vLLM and SGLang backends share: a server process per command, reused across cells, measured over
HTTP, with the server's own words kept whenever a cell fails.

A subclass says what its server is (`label`, `server_argv`, which options section it reads) and how a cell
is measured against the running server (`measure`); this class owns the options every server backend
takes (host, port, startup_timeout_s, env, log_path, timeout_s), the process lifecycle (`ReusedServer`),
the failure handling, and the target tokenizers.
"""

from __future__ import annotations

import importlib.util
import shlex
from typing import Any, Callable

from backends.base import BackendError
from backends.process import ReusedServer, ServerError
from harness import model_refs
from harness.cells import Cell, CellResult


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
        self._servers = ReusedServer(f"{self.name} server")
        self._tokenizers: dict[str, Any] = {}

    # ------------------------------------------------------------------ for subclasses

    def server_argv(self, cell: Cell) -> list[str]:
        raise NotImplementedError

    def server_command(self, cell: Cell) -> list[str] | None:
        return self.server_argv(cell)

    def run_on_server(self, argv: list[str], measure: Callable[[Any], CellResult]) -> CellResult:
        """Start (or reuse) the server for `argv`, then `measure(server)`. A failure becomes a BackendError that
        ends with the server's log tail (a server that died is forgotten, so the next cell starts a new one);
        a cell with failed requests keeps the tail in its log."""
        server = self._ensure_server(argv)
        try:
            result = measure(server)
            server.check_alive()
        except BackendError as exc:
            raise BackendError(f"{exc}{self._tail(server)}") from None
        except Exception as exc:  # noqa: BLE001 — any failure of the cell: keep what the server said
            if not server.running:
                self._stop()
            raise BackendError(f"{self.label} cell failed: {type(exc).__name__}: {exc}{self._tail(server)}") from exc
        if any(r.record.failed for r in result.requests):
            result.log = server.log_tail()
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

    def _ensure_server(self, argv: list[str]):
        """The running server for `argv`, reused when the previous cell had the same one."""
        try:
            return self._servers.ensure(argv, f"{self.base_url}/health", env=self.env,
                                        startup_timeout_s=self.startup_timeout_s, log_path=self.options.get("log_path"))
        except ServerError as exc:
            raise BackendError(f"{self.label} server did not start ({shlex.join(argv)}): {exc}") from None

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
