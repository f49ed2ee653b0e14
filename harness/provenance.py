"""Where and with what a measurement ran: git state, host, package versions, and the comparability key.

Why: a number without its circumstances cannot be compared. Two cells are comparable — the gate may
judge one against the other — only if they measured the same thing (the cell parameters), on the same
kind of machine (host fingerprint), with the same engine stack (torch, transformers, vllm, sglang,
triton) and the same content (target, draft and dataset hashes, backend version). `comparability_key`
hashes exactly those parts; `comparability_parts` returns them unhashed, so a gate that finds two keys
different can say which part differs. Metrics that do not depend on the machine's speed (acceptance,
ECE) compare on `content_parts` alone: the same parts without the host
(`harness.metrics.dependencies`). Everything else recorded here (hostname, free memory, the
versions of duckdb and numpy, git state) describes a run without changing what its numbers mean.

Nothing here fails: outside a git checkout, without torch or without a GPU the fields are None/empty.
torch is imported only inside `host_info`, so `import harness.provenance` stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

PACKAGES = ("torch", "transformers", "duckdb", "numpy", "vllm", "sglang", "triton")
# Packages whose version can change what a cell measures; duckdb and numpy only store and summarise.
ENGINE_PACKAGES = ("torch", "transformers", "vllm", "sglang", "triton")
PROVENANCE_KEYS = ("target_hash", "draft_hash", "dataset_hash", "backend_version")
# What a content-only metric (harness.metrics.dependencies.CONTENT) depends on besides params and packages:
# the provenance hashes and the device kind the kernels ran on (cpu / cuda), never the host.
CONTENT_PROVENANCE_KEYS = (*PROVENANCE_KEYS, "device")
# The host fields that change performance; the hostname, free memory and the platform string do not.
FINGERPRINT_KEYS = ("cpu_model", "cores", "gpus", "driver", "cuda")


def _git(repo_dir: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo_dir), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_info(repo_dir: str | Path = ".") -> tuple[str | None, str | None, bool | None]:
    """(sha, branch, dirty) of the checkout containing `repo_dir`; (None, None, None) outside one.

    branch is None on a detached HEAD (CI checkouts); dirty means tracked files differ from HEAD
    (untracked files are ignored: results/ and caches would otherwise make every run dirty)."""
    repo_dir = Path(repo_dir)
    sha = _git(repo_dir, "rev-parse", "HEAD")
    if sha is None:
        return None, None, None
    branch = _git(repo_dir, "rev-parse", "--abbrev-ref", "HEAD")
    status = _git(repo_dir, "status", "--porcelain", "--untracked-files=no")
    return sha, (branch if branch and branch != "HEAD" else None), (bool(status) if status is not None else None)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gpu_info() -> dict[str, Any]:
    """GPU names, driver and CUDA/HIP versions via torch (if importable) and nvidia-smi (if on PATH)."""
    out: dict[str, Any] = {"gpus": [], "driver": None, "cuda": None}
    try:
        import torch
    except ImportError:
        return out
    out["cuda"] = torch.version.cuda or getattr(torch.version, "hip", None)
    try:
        if torch.cuda.is_available():
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 — a broken driver must not stop a CPU run from being stamped
        pass
    if out["gpus"] and shutil.which("nvidia-smi"):
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=False,
            )
            versions = sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})
            out["driver"] = ",".join(versions) or None
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def host_info() -> dict[str, Any]:
    """What machine this is: cpu_model, cores (usable by this process), cpu_count (the machine's),
    memory_bytes, gpus (names), driver, cuda (torch's CUDA or HIP version), platform, machine,
    python, hostname."""
    cores: int | None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cores": cores,
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        **_gpu_info(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }


def _digest(value: Any, length: int) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def host_fingerprint(host: Mapping[str, Any]) -> str:
    """12 hex of sha256 over the performance-relevant host fields (FINGERPRINT_KEYS): the same on two
    identical machines, different when the CPU, core count, GPUs, driver or CUDA version differ."""
    return _digest({key: host.get(key) for key in FINGERPRINT_KEYS}, 12)


def package_versions() -> dict[str, str]:
    """{name: version} of python and of the PACKAGES installed here (absent ones are left out)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def comparability_parts(
    cell_params: Mapping[str, Any], provenance: Mapping[str, Any], host_fingerprint: str | None,
    packages: Mapping[str, str],
) -> dict[str, Any]:
    """The parts the comparability key hashes: {"host": fingerprint, "packages": {ENGINE_PACKAGES
    installed}, "provenance": {PROVENANCE_KEYS, None where unreported}, "params": the cell's parameters}.

    Everything is recoverable from the store (cells.params, cells.provenance, runs.host_fingerprint,
    runs.packages), so a gate can recompute the parts of a stored cell and diff them."""
    return {
        "host": host_fingerprint,
        "packages": {name: packages[name] for name in ENGINE_PACKAGES if name in packages},
        "provenance": {key: provenance.get(key) for key in PROVENANCE_KEYS},
        "params": dict(cell_params),
    }


def content_parts(
    cell_params: Mapping[str, Any], provenance: Mapping[str, Any], packages: Mapping[str, str],
) -> dict[str, Any]:
    """The parts a content-only metric (acceptance, ECE, greedy outputs) depends on: the comparability
    parts without the host, with the device kind. Recomputed by the gate from the stored rows."""
    kept = {key: provenance.get(key) for key in CONTENT_PROVENANCE_KEYS}
    if kept["device"] is not None:  # the kind (cuda), not the ordinal (cuda:1)
        kept["device"] = str(kept["device"]).split(":", 1)[0]
    return {
        "packages": {name: packages[name] for name in ENGINE_PACKAGES if name in packages},
        "provenance": kept,
        "params": dict(cell_params),
    }


def comparability_key(
    cell_params: Mapping[str, Any], provenance: Mapping[str, Any], host_fingerprint: str | None,
    packages: Mapping[str, str],
) -> str:
    """16 hex of sha256 over the canonical JSON of `comparability_parts(...)`: equal iff the parts are."""
    return _digest(comparability_parts(cell_params, provenance, host_fingerprint, packages), 16)
