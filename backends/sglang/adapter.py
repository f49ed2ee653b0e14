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

import functools
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from backends.base import BackendError, BackendUnavailable, Progress
from backends.sglang.server import ADAPTER_OPTIONS, DEFAULT_PORT, server_argv
from harness import model_refs
from harness.cells import Cell, CellResult


class SGLangBackend:
    name = "sglang"

    def __init__(self, **options: Any):
        self.options = dict(options)
        self.host = str(self.options.get("host") or "127.0.0.1")
        self.port = int(self.options.get("port", DEFAULT_PORT))
        self.startup_timeout_s = float(self.options.get("startup_timeout_s", 1200.0))
        env = self.options.get("env") or []
        env = [env] if isinstance(env, str) else env
        bad = [e for e in env if not isinstance(e, str) or "=" not in e]
        if bad:
            raise BackendError(f"backend_options.sglang.env entries are NAME=value strings, got {bad}")
        self.env = dict(e.split("=", 1) for e in env)
        self._server = None
        self._server_key: tuple | None = None
        self._tokenizers: dict[str, Any] = {}

    # ------------------------------------------------------------------ protocol

    def check(self, cell: Cell) -> None:
        server_argv(cell, self.options)  # BackendError for what SGLang cannot run
        python = self.options.get("python")
        if python and not Path(str(python)).exists():
            raise BackendUnavailable(f"backend_options.sglang.python {python!r} does not exist")
        if not python:
            import importlib.util

            spec = importlib.util.find_spec("sglang")  # origin None: a same-named directory, not the package
            if spec is None or spec.origin is None:
                raise BackendUnavailable("sglang is not installed in this interpreter (it has no CPU build); "
                                         "set backend_options.sglang.python to an interpreter that has it")
        for text in (cell.target.path, cell.drafter.checkpoint):
            if text is not None:
                missing = model_refs.missing_files(model_refs.resolve(text), ())
                if missing:
                    raise BackendError(f"{text!r}: {missing[0]} does not exist")

    def server_command(self, cell: Cell) -> list[str] | None:
        return server_argv(cell, self.options)

    def run_cell(self, cell: Cell, progress: Progress | None = None) -> CellResult:
        from backends.openai.client import Endpoint

        self.check(cell)
        argv = server_argv(cell, self.options)
        server = self._ensure_server(argv)
        endpoint = Endpoint(f"http://{self.host}:{self.port}", timeout_s=float(self.options.get("timeout_s", 600.0)))
        provenance = {"backend_version": f"sglang/{server_version(endpoint)}", "server_argv": shlex.join(argv),
                      "device": "cuda"}
        try:
            result = run_cell_native(endpoint, cell, progress, tokenizer=self._tokenizer(cell.target.path),
                                     provenance=provenance)
            server.check_alive()
        except Exception as exc:  # noqa: BLE001 — keep what the server said with whatever went wrong
            if not server.running:
                self._stop()
            raise BackendError(f"SGLang cell failed: {type(exc).__name__}: {exc}{_tail(server)}") from exc
        if any(r.record.failed for r in result.requests):
            result.log = server.log_tail()
        return result

    def close(self) -> None:
        self._stop()
        self._tokenizers.clear()

    # ------------------------------------------------------------------ server

    def _ensure_server(self, argv: list[str]):
        from backends.process import ServerError, ServerProcess

        key = (tuple(argv), tuple(sorted(self.env.items())))
        if self._server is not None and self._server_key == key and self._server.running:
            return self._server
        self._stop()
        server = ServerProcess(argv, f"http://{self.host}:{self.port}/health", env={**os.environ, **self.env},
                               startup_timeout_s=self.startup_timeout_s, log_path=self.options.get("log_path"),
                               name="sglang server")
        try:
            server.start()
        except ServerError as exc:
            raise BackendError(f"SGLang server did not start ({shlex.join(argv)}): {exc}") from None
        self._server, self._server_key = server, key
        return server

    def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._server, self._server_key = None, None

    def _tokenizer(self, text: str):
        if text not in self._tokenizers:
            from transformers import AutoTokenizer

            self._tokenizers[text] = AutoTokenizer.from_pretrained(model_refs.resolve(text).location)
        return self._tokenizers[text]


def _tail(server) -> str:
    tail = server.log_tail() if server is not None else ""
    return f"\n--- SGLang server log (tail) ---\n{tail}" if tail else ""


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
    load, with per-request acceptance from `meta_info`. (Once `run_cell_at` takes a `send` function this
    becomes `run_cell_at(endpoint, cell, progress, tokenizer=…, scrape_metrics=False, send=…)`.)"""
    from backends.openai.adapter import _result
    from backends.openai.client import ApiRequest, Load, StreamedResponse
    from backends.sglang.client import run_load, stream_generate
    from harness.tasks import load_task, prompt_ids

    data = load_task(cell.task.name, n_samples=cell.task.n_samples, seed=cell.seed)
    spec, samples = data.spec, data.samples
    turns = spec.turns if cell.task.multi_turn else 1
    answers: list[list[str]] = [[] for _ in samples]
    send = functools.partial(_send, num_drafts=cell.num_drafts, stream=stream_generate)

    def request(sample: int, turn: int) -> ApiRequest:
        ids = prompt_ids(tokenizer, spec, samples[sample], answers[sample])
        seed = (cell.seed * 1_000_003 + sample * 1_009 + turn) % (2**63)  # as the in-house adapter
        return ApiRequest(f"{sample}:{turn}", ids, cell.task.max_new_tokens, cell.task.temperature, seed)

    def next_turn_from(offset: int):
        def next_turn(conv: int, turn: int, done: StreamedResponse) -> ApiRequest | None:
            conv += offset
            answers[conv].append(tokenizer.decode(done.token_ids, skip_special_tokens=True) if done.token_ids else done.text)
            return request(conv, turn + 1) if turn + 1 < turns else None
        return next_turn

    first_turns = [request(i, 0) for i in range(len(samples))]
    total, finished = len(samples) * turns, 0

    def on_response(_: StreamedResponse) -> None:
        nonlocal finished
        finished += 1
        if progress is not None:
            progress(finished, total)

    warm = min(cell.warmup, len(first_turns) - 1)
    warmup = []
    if warm > 0:
        warmup = run_load(send, endpoint, first_turns[:warm], Load(concurrency=cell.concurrency or warm),
                          next_turn_from(0), on_response=on_response)
    measured = run_load(send, endpoint, first_turns[warm:], Load(cell.concurrency, cell.rate, cell.seed),
                        next_turn_from(warm), on_response=on_response)
    for r in measured:
        r.conversation += warm
    extra = {"api": "sglang /generate", **(provenance or {})}
    return _result(cell, endpoint, data.content_hash, warmup, measured, None, extra, "")


def _send(endpoint, request, clock, arrival, *, num_drafts: int, stream):
    return stream(endpoint, request, clock, arrival, num_drafts=num_drafts)


__all__ = ["SGLangBackend", "run_cell_native", "ADAPTER_OPTIONS"]
