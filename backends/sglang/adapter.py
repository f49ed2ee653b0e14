"""The SGLang backend: `python -m sglang.launch_server` per server configuration, measured over /generate.

Lifecycle as the vLLM backend: the argv from `server.server_argv` (the suite's `backend_options.sglang`),
the server in its own process group (`backends.process.ServerProcess`) until /health answers, reused by
consecutive cells with the same argv and environment, the whole group stopped on `close()`; a failure
raises BackendError ending with the server's log tail.

Requests go to SGLang's native streaming POST /generate (`client.stream_generate`): its OpenAI endpoints
stream no `meta_info`, and acceptance is read per request from the final `meta_info`
(`spec_verify_ct`, the accept histogram, `completion_tokens`, …) — never from /server_info's running
averages, which mix every request the server has seen. Conversations, warm-up phase, closed-loop /
Poisson load and the result's shape are those of `backends.openai.adapter.run_cell_at`.

SGLang has no CPU build: tests replay SGLang-shaped responses from a local HTTP server;
`scripts/gpu_sglang_check.sh` runs the real thing on a GPU machine. SPS tables written by SGLang's
`dspark_sps_profiler` convert to ours with `backends.sglang.sps`.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from pathlib import Path

from contracts.backend import BackendError, BackendUnavailable, Progress
from backends.server_backend import ServerBackend, installed
from backends.sglang import server
from backends.sglang.server import ADAPTER_OPTIONS, DEFAULT_PORT
from inputs import model_refs
from contracts.cells import Cell, CellResult


class SGLangBackend(ServerBackend):
    """`backend_options.sglang`: server flags and the adapter's own keys (see `backends.sglang.server`)."""

    name, label, default_port, default_startup_timeout_s = "sglang", "SGLang", DEFAULT_PORT, 1200.0

    # ------------------------------------------------------------------ protocol

    def check(self, cell: Cell) -> None:
        server.server_argv(cell, self.options)  # BackendError for what SGLang cannot run
        python = self.options.get("python")
        if python and not Path(str(python)).exists():
            raise BackendUnavailable(f"backend_options.sglang.python {python!r} does not exist")
        if not python and not installed("sglang"):
            raise BackendUnavailable("sglang is not installed in this interpreter (it has no CPU build); "
                                     "set backend_options.sglang.python to an interpreter that has it")
        for text in (cell.target.path, cell.drafter.checkpoint):
            if text is not None:
                missing = model_refs.missing_files(model_refs.resolve(text), ())
                if missing:
                    raise BackendError(f"{text!r}: {missing[0]} does not exist")

    def build_argv(self, cell: Cell, load: int, version, notes: list[str]) -> list[str]:
        return server.server_argv(cell, self.options, max_running=load, version=version, notes=notes)

    def identity_flags(self, cell: Cell, name: str) -> list[str]:
        return server.identity_flags(cell, name, self.options)

    def cell_load(self, cell: Cell) -> int:
        return server.cell_load(cell)

    def run_cell(self, cell: Cell, progress: Progress | None = None) -> CellResult:
        from backends.openai.client import Endpoint

        self.check(cell)

        def measure(process, argv: list[str]) -> CellResult:
            endpoint = Endpoint(self.base_url, timeout_s=self.timeout_s)
            provenance = {"backend_version": f"sglang/{server_version(endpoint)}", "server_argv": shlex.join(argv),
                          "device": "cuda"}
            return run_cell_native(endpoint, cell, progress, tokenizer=self._tokenizer(cell.target.path),
                                   provenance=provenance)

        return self.run_on_server(cell, measure)


def server_version(endpoint) -> str:
    """GET /get_server_info's `version` (SGLang), else "unknown"."""
    import json
    import urllib.request

    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(endpoint.url(path), timeout=10) as response:
                return str(json.loads(response.read()).get("version", "unknown"))
        except (OSError, ValueError, AttributeError):
            continue
    return "unknown"


def run_cell_native(endpoint, cell: Cell, progress: Progress | None = None, *, tokenizer,
                    provenance: dict[str, str] | None = None) -> CellResult:
    """`backends.openai.adapter.run_cell_at` over SGLang's /generate: the same conversations (token-id
    prompts from the target's tokenizer; MT-Bench turns built from the model's answers), warm-up phase and
    load, with per-request acceptance from `meta_info` (no Prometheus scrape: /server_info is cumulative)."""
    from backends.openai.adapter import run_cell_at
    from backends.sglang.client import astream_generate

    send = functools.partial(_send, num_drafts=cell.num_drafts, stream=astream_generate)
    endpoint = dataclasses.replace(endpoint, chat=False)
    return run_cell_at(endpoint, cell, progress, tokenizer=tokenizer, scrape_metrics=False,
                       provenance={"api": "sglang /generate", **(provenance or {})}, send=send)


async def _send(session, endpoint, request, clock, arrival, *, num_drafts: int, stream):
    return await stream(session, endpoint, request, clock, arrival, num_drafts=num_drafts)


__all__ = ["SGLangBackend", "run_cell_native", "ADAPTER_OPTIONS"]
