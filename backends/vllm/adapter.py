"""The vLLM backend: a vLLM OpenAI server per server configuration, driven with streaming requests.

Per cell: build the server argv (`server.server_argv`; the suite's `backend_options.vllm`), export the
draft first if it is in our format (`python -m backends.vllm.export`, into a content-addressed
directory, once), start the server in its own process group (`backends.process.ServerProcess`) and wait
for /health — or keep the one already running when the previous cell had the same argv and environment
— then measure the cell through `backends.openai.adapter.run_cell_at`: the task's conversations at the
cell's concurrency (closed loop) or rate (Poisson), streamed over /v1/completions with token-id prompts
from the target's tokenizer, as the in-house adapter builds them.

Acceptance is scoped to the cell: from each response's per-request counts when every measured response
has them (`acceptance_source` = per_request; vLLM ≥ 0.32 sends them as `metrics.speculative_decoding` on
the final chunk, asked for with `--per-request-spec-decode-metrics detailed`, and the OpenAI client reads
them, `backends.openai.metrics.per_request_usage`), else from the difference of vLLM's Prometheus
counters scraped just before and just after the measured phase (prometheus; server-wide, so nothing else
may use the server meanwhile; an older vLLM, or option `per_request_spec_decode_metrics: false`).
`provenance["prometheus_spec_decode"]` keeps the counters' difference either way. vLLM counts only steps
that verified at least one draft, in both sources (its requests' `all_steps` is false), and drafts γ up to
the last step even when fewer tokens remain, as our engine does: one acceptance definition on both
(`harness.metrics.acceptance`).

Any failure — the server does not start, dies, or the load raises — becomes a BackendError whose message
ends with the server's log tail; failed requests keep the tail in `CellResult.log`. `close()` stops the
whole process group (the API server, its engine core and workers).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from contracts.backend import BackendError, BackendUnavailable, Progress
from backends.openai.metrics import per_request_usage  # vLLM's per-request block → our spec extension
from backends.server_backend import ServerBackend, installed
from backends.vllm import server
from backends.vllm.server import ADAPTER_OPTIONS, DEFAULT_PORT, draft_location, interpreter, speculative_config
from inputs import model_refs
from contracts.cells import Cell, CellResult

EXPORT_TIMEOUT_S = 600.0


class VLLMBackend(ServerBackend):
    """`backend_options.vllm`: server flags and the adapter's own keys (see `backends.vllm.server`)."""

    name, label, default_port = "vllm", "vLLM", DEFAULT_PORT

    # ------------------------------------------------------------------ protocol

    def check(self, cell: Cell) -> None:
        speculative_config(cell, self.options)  # raises BackendError for what vLLM cannot run
        python = interpreter(self.options)
        if python is not None:
            if not Path(python).exists():
                where = f"${self.options['python_env']}" if os.environ.get(str(self.options.get("python_env"))) else \
                    "backend_options.vllm.python"
                raise BackendUnavailable(f"{where} {python!r} does not exist")
        elif not installed("vllm"):
            raise BackendUnavailable("vllm is not installed in this interpreter; install it, or set "
                                     "backend_options.vllm.python to an interpreter that has it")
        missing = model_refs.first_missing((cell.target.path, cell.drafter.checkpoint))
        if missing:
            raise BackendError(missing)

    def build_argv(self, cell: Cell, load: int, version, notes: list[str]) -> list[str]:
        return server.server_argv(cell, self.options, max_num_seqs=load, version=version, notes=notes)

    def identity_flags(self, cell: Cell, name: str) -> list[str]:
        return server.identity_flags(cell, name, self.options)

    def cell_load(self, cell: Cell) -> int:
        return server.cell_load(cell)

    def run_cell(self, cell: Cell, progress: Progress | None = None) -> CellResult:
        from backends.openai.adapter import run_cell_at, served_model, server_version
        from backends.openai.client import Endpoint

        self.check(cell)
        draft = self._export(cell)

        def measure(process, argv: list[str]) -> CellResult:
            # return_token_ids: each chunk carries its token ids (exact counts, and outputs the audit compares)
            endpoint = Endpoint(self.base_url, timeout_s=self.timeout_s, extra_body={"return_token_ids": True})
            endpoint = Endpoint(endpoint.base_url, served_model(endpoint), timeout_s=endpoint.timeout_s,
                                extra_body=endpoint.extra_body)
            provenance: dict[str, Any] = {
                "backend_version": f"vllm/{server_version(endpoint)}",
                "device": "cuda" if _has_cuda() else "cpu",
                "server_argv": shlex.join(argv),
            }
            if draft is not None:
                provenance["vllm_draft"] = draft
            if cell.is_synthetic:  # not lossless: accepted by the suite's law (the argv's speculative config)
                provenance["synthetic_acceptance"] = list(cell.drafter.synthetic_acceptance or ())
            return run_cell_at(endpoint, cell, progress, tokenizer=self._tokenizer(cell.target.path),
                               scrape_metrics=True, provenance=provenance)

        return self.run_on_server(cell, measure)

    # ------------------------------------------------------------------ draft

    def _export(self, cell: Cell) -> str | None:
        """Export a draft of ours into vLLM's layout once (content-addressed); returns the vLLM draft dir."""
        if cell.drafter.method in ("none", "ngram"):
            return None
        draft, source = draft_location(cell, self.options)
        if source is None or (Path(draft) / "config.json").is_file():
            return draft
        target = model_refs.resolve(cell.target.path)
        if not target.is_local:
            raise BackendError(f"exporting {source} for vLLM needs the target's files locally; {target.text!r} is a hub id")
        argv = [sys.executable, "-m", "backends.vllm.export", source, draft, "--target", target.location, "--overwrite"]
        if self.options.get("draft_layout") == "dflash":
            argv += ["--layout", "dflash", "--allow-fill-in"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BackendError(f"exporting {source} for vLLM took over {EXPORT_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            raise BackendError(f"cannot export {source} for vLLM: {(done.stderr or done.stdout).strip()}")
        return draft


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


__all__ = ["VLLMBackend", "ADAPTER_OPTIONS", "per_request_usage"]
