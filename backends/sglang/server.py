"""The exact argv of the SGLang server a cell runs on (an argv list, never a shell string).

SGLang names speculative algorithms in capitals; a chain (top-k 1) of γ draft steps verifies γ + 1
tokens. DFlash needs an SGLang with DFlash support (upstream PR #16818 and later); DSpark needs a build
with the DSpark worker. A `draft_model` drafter (a separate small causal LM with the target's vocabulary)
is SGLang's STANDALONE algorithm, the same chain flags with `--speculative-draft-model-path` naming the LM.
SGLang has no confidence-scheduled verification: scheduler policies are in-house / vLLM only. The draft's
architecture picks the algorithm as for vLLM (`backends.draft_methods`: DeepSpec's DFlash drafts are
`Qwen3DSparkModel`, so DSPARK). Algorithms not every SGLang has are checked against the version the adapter
found (`ALGORITHM_SINCE`); where no release is known to have one, the note says it is unverified.
`--max-running-requests` is the largest load of the cells sharing the server (`ServerBackend.plan_servers`).
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from backends.server_args import option_flags
from contracts.backend import BackendError
from backends.draft_methods import method_for
from backends.engine_version import EngineVersion, Since, keep
from inputs import model_refs
from contracts.cells import Cell

ALGORITHMS = {"dspark": "DSPARK", "dflash": "DFLASH", "eagle3": "EAGLE3", "ngram": "NGRAM",
              "draft_model": "STANDALONE"}
DEFAULT_PORT = 30000
OPEN_LOOP_MAX_RUNNING = 256  # an open-loop (rate) cell's load
ALGORITHM_SINCE = {
    "DFLASH": Since(None, "SGLang PR 22077 (was 16818), merged 2026-04"),
    "DSPARK": Since(None, "a build with the DSpark worker"),
}
# The adapter's own options (backends/sglang/adapter.py), never passed to the server as flags.
# served_model_name is replaced by each start's own (identity_flags): /generate takes no model name.
ADAPTER_OPTIONS = ("python", "port", "host", "env", "startup_timeout_s", "log_path", "timeout_s", "served_model_name")


def server_argv(cell: Cell, options: Mapping[str, Any] | None = None, *, max_running: int | None = None,
                version: EngineVersion | None = None, notes: list[str] | None = None) -> list[str]:
    """argv for the cell's server. `max_running`: the load it is started for (default: the cell's own);
    `version`: the SGLang found (an algorithm it lacks is a BackendError; unverified ones go to `notes`)."""
    options, notes = dict(options or {}), notes if notes is not None else []
    port = int(options.get("port", DEFAULT_PORT))
    python = str(options.get("python") or sys.executable or "python3")
    load = max_running if max_running is not None else cell_load(cell)
    argv = [python, "-m", "sglang.launch_server",
            "--model-path", model_refs.resolve(cell.target.path).location,
            "--dtype", cell.target.dtype, "--port", str(port), "--random-seed", str(cell.seed),
            "--max-running-requests", str(load)]
    d = cell.drafter
    if d.method != "none":
        if d.method not in ALGORITHMS:
            raise BackendError(f"SGLang has no {d.method!r} drafter; valid: {', '.join(ALGORITHMS)}")
        if cell.policy.name not in ("full",):
            raise BackendError(f"SGLang verifies every draft: policy {cell.policy.name!r} is in-house/vLLM only")
        algorithm = ALGORITHMS[method_for(d.checkpoint, d.method)]
        if algorithm in ALGORITHM_SINCE and not keep(f"--speculative-algorithm {algorithm}", ALGORITHM_SINCE[algorithm],
                                                     version, notes):
            raise BackendError(f"{notes[-1]}: this cell cannot run on it")
        argv += ["--speculative-algorithm", algorithm,
                 "--speculative-num-steps", str(cell.num_drafts),
                 "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(cell.num_drafts + 1)]
        if d.method != "ngram":
            argv += ["--speculative-draft-model-path", model_refs.resolve(d.checkpoint or "").location]
    return argv + option_flags(options, skip=ADAPTER_OPTIONS)


def cell_load(cell: Cell) -> int:
    """The requests a cell keeps running: its concurrency (closed loop), else OPEN_LOOP_MAX_RUNNING."""
    return max(cell.concurrency, 1) if cell.concurrency is not None else OPEN_LOOP_MAX_RUNNING


def identity_flags(cell: Cell, name: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """Serve under this start's `name`: /v1/models then shows it (the native /generate takes no model)."""
    return ["--served-model-name", name]
