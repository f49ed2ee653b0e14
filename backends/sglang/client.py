"""SGLang's native streaming API (POST /generate) and its per-request `meta_info`.

SGLang's OpenAI-compatible endpoints stream no `meta_info`, so the speculative counts of a request are
read from the native API. One request is one streamed POST /generate:

    {"input_ids": [...], "sampling_params": {"max_new_tokens": N, "temperature": T, "sampling_seed": S},
     "stream": true, "rid": "<sample>:<turn>"}

sent on the load's pooled aiohttp session (`astream_generate`, the `send` of `run_openai_load`) and
answered by server-sent events `data: {"text", "output_ids", "meta_info"}` and `data: [DONE]`. By default
`text` and `output_ids` are cumulative (with `--incremental-streaming-output`, per chunk); the count of
new tokens in a chunk is the increase of `meta_info.completion_tokens`, timed on arrival. The last
`meta_info` holds the request's speculative counts (SGLang ≥ 0.5; older names in brackets):

    spec_verify_ct                    verify steps (the first token comes from prefill, not a step)
    spec_num_correct_drafts           drafts accepted                  [spec_accepted_drafts, spec_accept_token_num]
    spec_num_proposed_drafts          drafts verified = steps × γ      [spec_proposed_drafts, spec_draft_token_num]
    spec_correct_drafts_histogram     [γ+1] steps that accepted k drafts   [spec_accept_histogram]
    spec_accept_length                completion_tokens / spec_verify_ct (counts the prefill token: not τ)
    completion_tokens, prompt_tokens, finish_reason {"type": "stop"|"length"|"abort", …}

`spec_usage` turns them into the per-request spec extension of `backends.openai.metrics` (one (γ, k)
step per histogram count: SGLang reports the histogram, not the order of the steps, which no acceptance
metric depends on), so `StreamedResponse.record()` fills `num_verified`/`num_accepted` as for any
OpenAI server. The histogram is required: averages alone (`spec_accept_length`) do not make steps.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Mapping, Sequence

from backends.openai.client import (NETWORK_ERRORS, ApiRequest, Clock, Endpoint, StreamedResponse, network_error,
                                   sse_events)

HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")
ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")


def _first(meta: Mapping[str, Any], keys: Sequence[str]) -> Any:
    return next((meta[k] for k in keys if meta.get(k) is not None), None)


def spec_usage(meta: Mapping[str, Any], num_drafts: int) -> dict[str, Any] | None:
    """The per-request spec extension (`spec_num_drafts`, `spec_verify_ct`, `spec_verified_per_step`,
    `spec_accepted_per_step`) from a final `meta_info`; None without speculative counts. ValueError when
    they contradict each other (histogram vs step count or accepted total, proposed ≠ steps × γ)."""
    steps = meta.get("spec_verify_ct")
    histogram = _first(meta, HISTOGRAM_KEYS)
    if steps is None and histogram is None:
        return None
    steps = int(steps or 0)
    if histogram is None:
        if steps == 0:
            return {"spec_num_drafts": num_drafts, "spec_verify_ct": 0, "spec_accepted_per_step": [],
                    "spec_verified_per_step": []}
        raise ValueError("meta_info has spec_verify_ct but no accept histogram: per-step counts are unknown")
    histogram = [int(n) for n in histogram]
    if len(histogram) > num_drafts + 1 and any(histogram[num_drafts + 1:]):
        raise ValueError(f"accept histogram {histogram} has steps accepting more than γ={num_drafts} drafts")
    if sum(histogram) != steps:
        raise ValueError(f"accept histogram {histogram} counts {sum(histogram)} steps, spec_verify_ct says {steps}")
    accepted = [k for k, n in enumerate(histogram) for _ in range(n)]
    total = _first(meta, ACCEPTED_KEYS)
    if total is not None and int(total) != sum(accepted):
        raise ValueError(f"accept histogram {histogram} sums to {sum(accepted)} accepted drafts, meta_info says {total}")
    proposed = _first(meta, PROPOSED_KEYS)
    if proposed is not None and steps and int(proposed) != steps * num_drafts:
        raise ValueError(f"{proposed} drafts proposed over {steps} steps is not γ={num_drafts} per step "
                         "(ragged verification: per-step verified counts are unknown)")
    return {"spec_num_drafts": num_drafts, "spec_verify_ct": steps, "spec_accepted_per_step": accepted,
            "spec_verified_per_step": [num_drafts] * steps}


def generate_body(request: ApiRequest) -> dict[str, Any]:
    if isinstance(request.prompt, str):
        prompt: dict[str, Any] = {"text": request.prompt}
    else:
        prompt = {"input_ids": [int(t) for t in request.prompt]}
    sampling = {"max_new_tokens": request.max_tokens, "temperature": request.temperature}
    if request.seed is not None:
        sampling["sampling_seed"] = request.seed
    return {**prompt, "sampling_params": sampling, "stream": True, "rid": request.request_id,
            **dict(request.extra_body)}


async def astream_generate(session, endpoint: Endpoint, request: ApiRequest, clock: Clock = time.perf_counter,
                           arrival_s: float | None = None, num_drafts: int = 0) -> StreamedResponse:
    """One streamed POST /generate on `session` (the load's pooled aiohttp session, `run_openai_load`);
    never raises for what the server or network does (`error` is set)."""
    out = StreamedResponse(request, clock() if arrival_s is None else arrival_s)
    if not isinstance(request.prompt, str):
        out.prompt_ids = [int(t) for t in request.prompt]
    meta: dict[str, Any] = {}
    try:
        body = json.dumps(generate_body(request)).encode()
        async with session.post(endpoint.url("/generate"), data=body, headers=endpoint.headers()) as response:
            if response.status != 200:
                raise _Failed(f"HTTP {response.status} {response.reason}: {(await response.content.read(4096))[:300]!r}")
            done, seen, ids = False, 0, []
            async for data in sse_events(response.content):
                now = clock()
                if data.strip() == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    raise _Failed(f"server error: {chunk['error']}")
                meta = chunk.get("meta_info") or meta
                count = int(meta.get("completion_tokens", seen)) - seen
                chunk_ids = [int(t) for t in chunk.get("output_ids") or ()]
                ids = chunk_ids if len(chunk_ids) == seen + count else ids + chunk_ids  # cumulative or incremental
                text = chunk.get("text") or ""
                out.text = text if text.startswith(out.text) else out.text + text
                if count > 0:
                    seen += count
                    out.emissions.append((now, count))
                    if out.first_token_s is None:
                        out.first_token_s = now
                reason = meta.get("finish_reason")
                if isinstance(reason, Mapping) and reason.get("type"):
                    out.finish_reason = str(reason["type"])
                    if reason["type"] == "abort":
                        raise _Failed(f"request aborted: {reason.get('message', reason)}")
        if not done and out.finish_reason is None:
            raise _Failed("the stream ended before [DONE] or a finish reason")
        out.token_ids = ids if len(ids) == seen else []
        out.token_source = "completion_tokens"
        usage = {k: meta[k] for k in ("prompt_tokens", "completion_tokens") if isinstance(meta.get(k), int)}
        spec = spec_usage(meta, num_drafts)
        out.usage = usage | (spec or {})
    except _Failed as exc:
        out.error = str(exc)
    except NETWORK_ERRORS as exc:
        out.error = network_error(exc)
    out.finish_s = clock() if out.error is not None else (out.emissions[-1][0] if out.emissions else clock())
    return out


def stream_generate(endpoint: Endpoint, request: ApiRequest, clock: Clock = time.perf_counter,
                    arrival_s: float | None = None, num_drafts: int = 0) -> StreamedResponse:
    """`astream_generate` from synchronous code, on a session of its own."""

    async def once() -> StreamedResponse:
        async with endpoint.session(1) as session:
            return await astream_generate(session, endpoint, request, clock, arrival_s, num_drafts)

    return asyncio.run(once())


class _Failed(Exception):
    pass
