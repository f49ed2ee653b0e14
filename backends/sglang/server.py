"""The exact argv of the SGLang server a cell runs on (an argv list, never a shell string).

SGLang names speculative algorithms in capitals; a chain (top-k 1) of γ draft steps verifies γ + 1
tokens. DFlash needs an SGLang with DFlash support (upstream PR #16818 and later); DSpark needs a build
with the DSpark worker. A `draft_model` drafter (a separate small causal LM with the target's vocabulary)
is SGLang's STANDALONE algorithm, the same chain flags with `--speculative-draft-model-path` naming the LM.
SGLang has no confidence-scheduled verification: scheduler policies are in-house / vLLM only.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from backends.base import BackendError, option_flags
from harness import model_refs
from harness.cells import Cell

ALGORITHMS = {"dspark": "DSPARK", "dflash": "DFLASH", "eagle3": "EAGLE3", "ngram": "NGRAM",
              "draft_model": "STANDALONE"}
DEFAULT_PORT = 30000
# The adapter's own options (backends/sglang/adapter.py), never passed to the server as flags.
ADAPTER_OPTIONS = ("python", "port", "host", "env", "startup_timeout_s", "log_path", "timeout_s")


def server_argv(cell: Cell, options: Mapping[str, Any] | None = None) -> list[str]:
    options = dict(options or {})
    port = int(options.get("port", DEFAULT_PORT))
    python = str(options.get("python") or sys.executable or "python3")
    argv = [python, "-m", "sglang.launch_server",
            "--model-path", model_refs.resolve(cell.target.path).location,
            "--dtype", cell.target.dtype, "--port", str(port), "--random-seed", str(cell.seed),
            "--max-running-requests", str(max(cell.concurrency or 256, 1))]
    d = cell.drafter
    if d.method != "none":
        if d.method not in ALGORITHMS:
            raise BackendError(f"SGLang has no {d.method!r} drafter; valid: {', '.join(ALGORITHMS)}")
        if cell.policy.name not in ("full",):
            raise BackendError(f"SGLang verifies every draft: policy {cell.policy.name!r} is in-house/vLLM only")
        argv += ["--speculative-algorithm", ALGORITHMS[d.method],
                 "--speculative-num-steps", str(cell.num_drafts),
                 "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(cell.num_drafts + 1)]
        if d.method != "ngram":
            argv += ["--speculative-draft-model-path", model_refs.resolve(d.checkpoint or "").location]
    return argv + option_flags(options, skip=ADAPTER_OPTIONS)
