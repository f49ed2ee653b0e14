"""A server process for the length of a benchmark: start it, wait until it is healthy, stop all of it.

    with ServerProcess([sys.executable, "-m", "backends.inhouse.server", "--port", "8123"],
                       "http://127.0.0.1:8123/health") as server:
        ...                                   # measure; server.log_tail() is what it printed lately

The argv is a list, never a shell string. The server runs in its own session (`start_new_session`), so
its process group holds it and whatever it spawns (vLLM's engine cores, SGLang's schedulers); stopping
sends SIGTERM to the whole group, then SIGKILL to whatever is left after `stop_timeout_s`. Its stdout
and stderr go, merged, to a rotating tail of the last `tail_lines` lines (and, if `log_path` is given,
to that file in full). Any failure to start — the process exits, or /health does not answer 200
within `startup_timeout_s` — stops the group and raises `ServerError` with the log tail in its message.
Servers still running when the interpreter exits are stopped then.

What answers must be what was launched: `identify` (e.g. "/v1/models lists the served-model name given to
this start") is asked once /health answers, and a server that answers but is not ours fails the start
(`ReusedServer` also refuses a port that is already in use before launching anything).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Callable, Mapping, Sequence

from contracts.redaction import redact


DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local server: never via $http_proxy


class ServerError(RuntimeError):
    """The server failed to start or died; the message ends with its log tail (`.log_tail` alone)."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message + (f"\n--- server log (tail) ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


class ServerProcess:
    def __init__(self, argv: Sequence[str], health_url: str, *, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, startup_timeout_s: float = 600.0, stop_timeout_s: float = 15.0,
                 tail_lines: int = 200, log_path: str | Path | None = None, name: str = "server",
                 identify: Callable[[], bool] | None = None):
        if isinstance(argv, (str, bytes)) or not argv:
            raise TypeError("argv must be a non-empty list of arguments, not a shell string")
        self.argv = [str(a) for a in argv]
        self.health_url, self.env, self.cwd = health_url, dict(env) if env is not None else None, cwd
        self.startup_timeout_s, self.stop_timeout_s = startup_timeout_s, stop_timeout_s
        self.name, self.log_path = name, Path(log_path) if log_path is not None else None
        self.identify = identify
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self.pgid: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> ServerProcess:
        """Launch and wait until healthy; ServerError (group stopped, log tail included) if it does not get there."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} was started already")
        try:
            self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=self.env, cwd=self.cwd,
                                          start_new_session=True)
        except OSError as exc:
            raise ServerError(f"{self.name}: cannot launch {self.argv[0]!r}: {exc}") from None
        self.pgid = self._proc.pid  # a new session's leader leads its process group: pgid = pid
        atexit.register(self.close)
        self._reader = threading.Thread(target=self._read_log, name=f"{self.name}-log", daemon=True)
        self._reader.start()
        try:
            self.wait_healthy(self.startup_timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                self._reader.join(timeout=2)  # the last lines it wrote
                raise ServerError(f"{self.name} exited with code {code} before it was healthy", self.log_tail())
            if self._healthy():
                if self.identify is not None and not self.identify():
                    raise ServerError(f"{self.name}: {self.health_url} answers, but not as the process just launched "
                                      "(another server on that port?)", self.log_tail())
                return
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name}: {self.health_url} did not answer 200 within {timeout_s:g} s",
                                  self.log_tail())
            time.sleep(0.25)

    def _healthy(self) -> bool:
        try:
            with DIRECT.open(self.health_url, timeout=2.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def check_alive(self) -> None:
        """ServerError with the log tail if the server has died (call between cells)."""
        if self._proc is None or self._proc.poll() is not None:
            code = None if self._proc is None else self._proc.returncode
            raise ServerError(f"{self.name} is not running (exit code {code})", self.log_tail())

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after stop_timeout_s. Idempotent."""
        atexit.unregister(self.close)
        if self._proc is None or self.pgid is None:
            return
        if _group_alive(self.pgid):
            _signal_group(self.pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            while time.monotonic() < deadline:
                self._proc.poll()  # reap the leader so it does not linger as a zombie
                if not _group_alive(self.pgid):
                    break
                time.sleep(0.05)
            else:
                _signal_group(self.pgid, signal.SIGKILL)
        try:
            self._proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5.0  # SIGKILLed members vanish once the kernel has reaped them
        while _group_alive(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._reader is not None:
            self._reader.join(timeout=2)

    def __enter__(self) -> ServerProcess:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ log

    def log_tail(self) -> str:
        return "".join(self._tail)

    def _read_log(self) -> None:
        out = self.log_path.open("a", encoding="utf-8") if self.log_path is not None else None
        try:
            for raw in iter(self._proc.stdout.readline, b""):
                line = redact(raw.decode("utf-8", errors="replace"))  # a server may log what it was sent
                self._tail.append(line)
                if out is not None:
                    out.write(line)
                    out.flush()
        finally:
            self._proc.stdout.close()
            if out is not None:
                out.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still exists
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def port_in_use(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts connections on host:port now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class ReusedServer:
    """One server process at a time, kept while consecutive cells need the same command and environment (a
    vLLM or SGLang start costs minutes); a cell needing another command stops the old server first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process: ServerProcess | None = None
        self._key: tuple | None = None

    def ensure(self, argv: Sequence[str], health_url: str, *, env: Mapping[str, str], startup_timeout_s: float,
               log_path: str | None = None, address: tuple[str, int] | None = None, launch_flags: Sequence[str] = (),
               identify: Callable[[], bool] | None = None) -> ServerProcess:
        """The running server for `argv` with `env` added to this process's environment, started if needed;
        raises ServerError (with its log tail) when it does not come up. A new start refuses an `address`
        something already listens on, appends `launch_flags` (this start's identity; not part of the key)
        and must pass `identify` once healthy."""
        key = (tuple(argv), tuple(sorted(env.items())))
        if self.process is not None and self._key == key and self.process.running:
            return self.process
        self.stop()
        if address is not None and port_in_use(*address):
            raise ServerError(f"{self.name}: port {address[1]} on {address[0]} is already in use by a process this run "
                              "did not start (a server left by an earlier run?); stop it, or set another port")
        process = ServerProcess([*argv, *launch_flags], health_url, env={**os.environ, **env},
                                startup_timeout_s=startup_timeout_s, log_path=log_path, name=self.name, identify=identify)
        process.start()
        self.process, self._key = process, key
        return process

    def stop(self) -> None:
        if self.process is not None:
            self.process.close()
        self.process, self._key = None, None
