"""The `openai` backend: suite cells against any OpenAI-compatible server at a user-given base URL.

The server is the user's (vLLM, SGLang, `python -m backends.inhouse.server`, a hosted API); the cell's
target, drafter, γ and policy describe it but cannot change it. Options (the suite's
`backend_options.openai`):

    base_url      http(s)://host:port (a trailing /v1 is fine)                     required
    model         the body's `model`                                            default: the server's first model
    api_key_env   name of the environment variable holding the API key (the key itself never appears
                  in a suite, the store or a log)
    chat          true: /v1/chat/completions with the task's messages (the server applies its chat
                  template); false (default): /v1/completions with token ids from the target's tokenizer
    tokenizer     tokenizer path or hub id for chat: false; default: the cell's target
    timeout_s     socket timeout per read (600)
    logprobs      ask for logprobs to count tokens per chunk (true); see `client.py` for the rule
    metrics       scrape GET /metrics before and after the measured phase (true)

Per cell: the task's conversations (MT-Bench turn by turn, each next turn built from the model's own
answer) run as in the in-house adapter — a warm-up phase of `cell.warmup` conversations to completion,
then the measured load (closed loop or Poisson, `client.run_openai_load`). Throughput and latency come
from the client's timings (and `ttft_server_mean`, the server's own TTFT histogram over the measured
phase, where /metrics has vLLM's `vllm:time_to_first_token_seconds`: the client's TTFT held against
it); acceptance from the responses' per-request spec extension if every measured
response has it, else from the server's Prometheus counters (`metrics.py`), else none —
`provenance["acceptance_source"]` says which. The result holds raw records and counters only; the
executor derives every metric from them (`harness.metrics.derive`).

`run_cell_at(endpoint, cell, ...)` is the whole measurement given an endpoint: server backends (vLLM,
SGLang) start their server, then call it.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from contracts.backend import BackendError, Progress
from backends.openai.client import ApiRequest, Endpoint, Load, Send, StreamedResponse, run_openai_load
from backends.openai.metrics import DIRECT, parse_prometheus, per_request_steps, scrape, server_ttft, spec_counts
from contracts import redaction
from inputs import model_refs
from contracts.cells import Cell, CellResult, RequestResult
from contracts.records import MeasurementWindow, SpecCounts

OPTIONS = ("base_url", "model", "api_key_env", "chat", "tokenizer", "timeout_s", "logprobs", "metrics")


class OpenAIBackend:
    name = "openai"

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key_env: str | None = None,
                 chat: bool = False, tokenizer: str | None = None, timeout_s: float = 600.0, logprobs: bool = True,
                 metrics: bool = True, **unknown):
        if unknown:
            raise BackendError(f"unknown openai backend option(s) {', '.join(sorted(unknown))}; valid: {', '.join(OPTIONS)}")
        self.base_url, self.model, self.api_key_env = base_url, model, api_key_env
        self.chat, self.tokenizer_ref, self.timeout_s = bool(chat), tokenizer, float(timeout_s)
        self.logprobs, self.scrape_metrics = bool(logprobs), bool(metrics)
        self._tokenizers: dict[str, Any] = {}

    # ------------------------------------------------------------------ protocol

    def check(self, cell: Cell) -> None:
        if not self.base_url:
            raise BackendError("backend openai needs backend_options.openai.base_url (e.g. http://127.0.0.1:8000)")
        try:
            Endpoint(self.base_url)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        if self.api_key_env and not os.environ.get(self.api_key_env):
            raise BackendError(f"api_key_env names ${self.api_key_env}, which is not set")
        if not self.chat:
            ref = model_refs.resolve(self.tokenizer_ref or cell.target.path)
            missing = model_refs.missing_files(ref, ())
            if missing:
                raise BackendError(f"tokenizer {ref.text!r}: {missing[0]} does not exist (or set chat: true)")

    def server_command(self, cell: Cell) -> list[str] | None:
        return None

    def close(self) -> None:
        self._tokenizers.clear()

    def run_cell(self, cell: Cell, progress: Progress | None = None) -> CellResult:
        self.check(cell)
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        redaction.register(key)  # an endpoint that echoes it (in an error body, a log) leaves it in no row
        endpoint = Endpoint(self.base_url, self.model, self.chat, key, self.timeout_s, self.logprobs)
        if endpoint.model is None:
            endpoint = Endpoint(self.base_url, served_model(endpoint), self.chat, key, self.timeout_s, self.logprobs)
        tokenizer = None if self.chat else self._tokenizer(self.tokenizer_ref or cell.target.path)
        return run_cell_at(endpoint, cell, progress, tokenizer=tokenizer, scrape_metrics=self.scrape_metrics)

    def _tokenizer(self, text: str):
        if text not in self._tokenizers:
            from transformers import AutoTokenizer

            self._tokenizers[text] = AutoTokenizer.from_pretrained(model_refs.resolve(text).location)
        return self._tokenizers[text]


# ------------------------------------------------------------------ a cell against an endpoint


def run_cell_at(endpoint: Endpoint, cell: Cell, progress: Progress | None = None, *, tokenizer=None,
                scrape_metrics: bool = True, provenance: dict[str, str] | None = None, log: str = "",
                send: Send | None = None) -> CellResult:
    """Measure `cell` against a running server. Completions (`endpoint.chat` false) need the target's
    `tokenizer` (prompt ids, and answers decoded for the next turn); chat sends messages. `provenance`
    adds to / overrides what this function reports (a server backend knows its version and device).
    `send`: another API for the same conversations and load (SGLang's /generate; default the OpenAI API)."""
    from inputs.tasks import load_task, prompt_ids, render_messages

    if not endpoint.chat and tokenizer is None:
        raise BackendError("completions with token ids need the target's tokenizer (or chat: true)")
    data = load_task(cell.task.name, n_samples=cell.task.n_samples, seed=cell.seed)
    spec, samples = data.spec, data.samples
    turns = spec.turns if cell.task.multi_turn else 1
    answers: list[list[str]] = [[] for _ in samples]

    def request(sample: int, turn: int) -> ApiRequest:
        if endpoint.chat:
            prompt: Any = render_messages(spec, samples[sample], answers[sample])
        else:
            prompt = prompt_ids(tokenizer, spec, samples[sample], answers[sample])
        return ApiRequest(f"{sample}:{turn}", prompt, cell.task.max_new_tokens, cell.task.temperature,
                          cell.request_seed(sample, turn))

    def next_turn_from(offset: int):
        def next_turn(conv: int, turn: int, done: StreamedResponse) -> ApiRequest | None:
            conv += offset
            if tokenizer is not None and done.token_ids:
                answers[conv].append(tokenizer.decode(done.token_ids, skip_special_tokens=True))
            else:
                answers[conv].append(done.text)
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
    warmup: list[StreamedResponse] = []
    if warm > 0:  # a phase of its own, run to completion first, as in the in-house adapter
        warmup = run_openai_load(endpoint, first_turns[:warm], Load(concurrency=cell.concurrency or warm),
                                 next_turn_from(0), on_response=on_response, send=send)
    before = _scrape(endpoint) if scrape_metrics else None
    measured = run_openai_load(endpoint, first_turns[warm:], Load(cell.concurrency, cell.rate, cell.seed),
                               next_turn_from(warm), on_response=on_response, send=send)
    after = _scrape(endpoint) if scrape_metrics else None
    for r in measured:
        r.conversation += warm
    counts = ttft = None
    if before is not None and after is not None:
        spec = [spec_counts(before), spec_counts(after)]
        counts = spec[1] - spec[0] if None not in spec else None
        times = [server_ttft(before), server_ttft(after)]
        ttft = times[1] - times[0] if None not in times else None
    result = _result(cell, endpoint, data.content_hash, warmup, measured, counts, provenance or {}, log)
    result.server_ttft = ttft
    return result


def _result(cell: Cell, endpoint: Endpoint, dataset_hash: str, warmup: list[StreamedResponse],
            measured: list[StreamedResponse], counts: SpecCounts | None, extra: dict[str, str], log: str) -> CellResult:
    for r in warmup + measured:  # what a server answered can hold what it was sent (the bearer token)
        r.error = redaction.redact(r.error, [endpoint.api_key or ""])
    log = redaction.redact(log, [endpoint.api_key or ""]) or ""
    ok = [r for r in measured if r.error is None]
    per_request = bool(ok) and all(per_request_steps(r.usage, cell.num_drafts) is not None for r in ok)
    source = "per_request" if per_request else "prometheus" if counts is not None and counts.drafts > 0 else "none"
    requests = []
    for r, is_warmup in [(r, True) for r in warmup] + [(r, False) for r in measured]:
        record = r.record(cell.num_drafts) if per_request else _without_steps(r, cell.num_drafts)
        requests.append(RequestResult(record, f"{cell.task.name}:{r.conversation}:{r.turn}", r.conversation, r.turn,
                                      is_warmup, tuple(r.token_ids), tuple(r.prompt_ids)))
    window = MeasurementWindow.after_warmup_phase(
        [r.record for r in requests if not r.warmup], [r.record for r in requests if r.warmup])
    provenance = {
        "target_hash": _fingerprint(cell.target.path),
        "draft_hash": _fingerprint(cell.drafter.checkpoint) if cell.drafter.checkpoint else "",
        "dataset_hash": dataset_hash,
        "backend_version": f"openai/{server_version(endpoint)}",
        "device": "remote",
        "server": endpoint.root,
        "model": endpoint.model or "",
        "acceptance_source": source,
        "token_count": "+".join(sorted({s for r in ok for s in r.token_source.split("+") if s})),
    }
    if counts is not None:
        provenance["prometheus_spec_decode"] = json.dumps(counts.as_dict(), sort_keys=True)
    return CellResult(requests, [], window, provenance | extra, log=log,
                      spec_counts=counts if source == "prometheus" else None)


def _without_steps(response: StreamedResponse, num_drafts: int):
    usage = {k: v for k, v in response.usage.items() if not k.startswith("spec_")}
    stripped = StreamedResponse(**{**response.__dict__, "usage": usage})
    return stripped.record(num_drafts)


def _fingerprint(text: str) -> str:
    ref = model_refs.resolve(text)
    return model_refs.fingerprint(ref) if not model_refs.missing_files(ref, ()) else ""


def _get_json(endpoint: Endpoint, path: str) -> Any:
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    request = urllib.request.Request(endpoint.url(path), headers=headers)
    with DIRECT.open(request, timeout=min(endpoint.timeout_s, 30.0)) as response:
        return json.loads(response.read())


def served_model(endpoint: Endpoint) -> str:
    """The first model of GET /v1/models (what a one-model server serves)."""
    try:
        models = _get_json(endpoint, "/v1/models")["data"]
        return str(models[0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        why = redaction.redact(f"{type(exc).__name__}: {exc}", [endpoint.api_key or ""])
        raise BackendError(f"{endpoint.root}/v1/models: cannot tell the served model ({why}); "
                           "set backend_options.openai.model") from None


def server_version(endpoint: Endpoint) -> str:
    """GET /version's `version` (vLLM, our server), else "unknown"."""
    try:
        return redaction.redact(str(_get_json(endpoint, "/version").get("version", "unknown")), [endpoint.api_key or ""])
    except (OSError, ValueError, AttributeError):
        return "unknown"


def _scrape(endpoint: Endpoint):
    """The server's /metrics samples (`metrics.parse_prometheus`), or None where it has none."""
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    try:
        return parse_prometheus(scrape(endpoint.root, min(endpoint.timeout_s, 30.0), headers))
    except (OSError, urllib.error.URLError, ValueError):
        return None
