"""Speculative-decoding acceptance of an OpenAI-compatible server: per request, or from its Prometheus counters.

Two sources, best first (the adapter records which one it used as `acceptance_source`):

* **per_request** — the server reports each request's steps in its `usage` (our server, in the final
  chunk; an extension of the OpenAI schema):
      spec_num_drafts          γ the request ran with (0: plain decoding)
      spec_verify_ct           verify steps (the first token, from prefill, is no step)
      spec_verified_per_step   [spec_verify_ct] drafts verified at each step (0 … γ); absent: γ each step
      spec_accepted_per_step   [spec_verify_ct] drafts accepted at each step (0 … verified)
      spec_steps               "drafting": the steps are the drafting steps only (vLLM's); absent: every step
                               (`RequestRecord.all_steps`)
  These fill `RequestRecord.num_verified/num_accepted`, and every acceptance metric follows as for the
  in-house engine. vLLM (≥ 0.32, `--per-request-spec-decode-metrics detailed`) sends the same per request
  in its own shape, a top-level `metrics.speculative_decoding` block on the final (usage) chunk; the
  client translates it into these fields (`per_request_usage`).
* **prometheus** — vLLM's cumulative counters, scraped from GET /metrics before and after the measured
  phase; their difference is the cell's acceptance (`SpecCounts`):
      vllm:spec_decode_num_drafts_total                      (request, step) pairs that verified ≥ 1 draft
      vllm:spec_decode_num_draft_tokens_total                drafts verified
      vllm:spec_decode_num_accepted_tokens_total             drafts accepted
      vllm:spec_decode_num_accepted_tokens_per_pos_total{position="k"}   steps whose draft k+1 (k from 0) was accepted
      dspark:spec_decode_num_steps_total                     all verify steps, with or without drafts (our server)
  and, beside acceptance, the server's own TTFT histogram `vllm:time_to_first_token_seconds` (`ServerTTFT`:
  its _sum and _count over the same window give `ttft_server_mean`, to hold the client's TTFT against).
  Samples are summed over every other label (engines, model names). The counters are server-wide: any
  other client's traffic in the window is counted too.

One acceptance definition (`harness.metrics.acceptance`): τ = 1 + accepted / drafting steps, which is
vLLM's `1 + accepted_tokens / drafts` from either source; the steps counter (our server) adds draft
coverage and tokens per target forward, which need every step. This module only reads the counters into the
raw records `contracts.records.SpecCounts` / `ServerTTFT`; what they mean as metrics is derived in
`harness.metrics.server_counts`, as every other metric.
"""

from __future__ import annotations

import math
import re
import urllib.request
from typing import Any, Mapping

from contracts.records import ServerTTFT, SpecCounts

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
STEPS = "dspark:spec_decode_num_steps_total"

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Samples = dict[tuple[str, Labels], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_prometheus(text: str) -> Samples:
    """Prometheus text exposition format → {(metric name, labels): value}; comments and malformed lines skipped."""
    out: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, label_text, value_text = match.groups()
        try:
            value = float(value_text)
        except ValueError:
            continue
        labels: list[tuple[str, str]] = []
        if label_text:
            body, pos = label_text[1:-1], 0
            while pos < len(body):
                m = _LABEL.match(body, pos)
                if m is None:
                    break
                value_raw = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], m.group(2))
                labels.append((m.group(1), value_raw))
                pos = m.end()
        out[(name, tuple(sorted(labels)))] = value
    return out


# Like the streaming client (http.client), GETs go straight to the server, never through $http_proxy.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(root_url: str, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None) -> str:
    """GET <root>/metrics as text (root: the server URL without /v1)."""
    request = urllib.request.Request(root_url.rstrip("/") + "/metrics", headers=dict(headers or {}))
    with DIRECT.open(request, timeout=timeout_s) as response:
        return response.read().decode("utf-8", errors="replace")


def spec_counts(samples: Samples) -> SpecCounts | None:
    """Sum each counter over its other labels; None if the server exports no spec-decode counters."""
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for (name, labels), value in samples.items():
        if math.isnan(value):
            continue
        if name == ACCEPTED_PER_POS:
            position = dict(labels).get("position")
            if position is not None and position.isdigit():
                per_pos[int(position)] = per_pos.get(int(position), 0.0) + value
        elif name in (DRAFTS, DRAFT_TOKENS, ACCEPTED, STEPS):
            sums[name] = sums.get(name, 0.0) + value
    if DRAFTS not in sums and STEPS not in sums:
        return None
    gamma = max(per_pos, default=-1) + 1
    return SpecCounts(int(sums.get(DRAFTS, 0)), int(sums.get(DRAFT_TOKENS, 0)), int(sums.get(ACCEPTED, 0)),
                      tuple(int(per_pos.get(k, 0)) for k in range(gamma)),
                      int(sums[STEPS]) if STEPS in sums else None)


def spec_counts_from_text(text: str) -> SpecCounts | None:
    return spec_counts(parse_prometheus(text))


TTFT = "vllm:time_to_first_token_seconds"


def server_ttft(samples: Samples) -> ServerTTFT | None:
    """The server's TTFT histogram totals (`vllm:time_to_first_token_seconds` _sum and _count); None: none."""
    total = sum(v for (name, _), v in samples.items() if name == TTFT + "_sum" and not math.isnan(v))
    count = [v for (name, _), v in samples.items() if name == TTFT + "_count" and not math.isnan(v)]
    return ServerTTFT(float(total), int(sum(count))) if count else None


def per_request_steps(usage: Mapping[str, Any], num_drafts: int) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """(γ, verified per step, accepted per step) from a response's `usage` spec extension; None when it
    has none or it is inconsistent (then the request has no per-step data)."""
    accepted = usage.get("spec_accepted_per_step")
    if not isinstance(accepted, list) or not all(isinstance(a, int) for a in accepted):
        return None
    gamma = usage.get("spec_num_drafts", num_drafts)
    verified = usage.get("spec_verified_per_step")
    if verified is None:
        verified = [gamma] * len(accepted)
    if not isinstance(gamma, int) or not isinstance(verified, list) or len(verified) != len(accepted):
        return None
    count = usage.get("spec_verify_ct", len(accepted))
    if count != len(accepted) or not all(isinstance(v, int) and 0 <= a <= v <= gamma for v, a in zip(verified, accepted)):
        return None
    return gamma, tuple(verified), tuple(accepted)


def per_request_confidences(usage: Mapping[str, Any], verified: tuple[int, ...]) -> tuple[tuple[float, ...], ...]:
    """The raw confidence logit of every verified draft, per step, from the usage extension
    `spec_confidence_logits_per_step` (our server, for drafts with a confidence head); () when absent or
    not shaped like `verified` (then the request has no calibration data)."""
    steps = usage.get("spec_confidence_logits_per_step")
    if not isinstance(steps, list) or len(steps) != len(verified):
        return ()
    if not all(isinstance(row, list) and len(row) == v and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                                for x in row) for row, v in zip(steps, verified)):
        return ()
    return tuple(tuple(float(x) for x in row) for row in steps)


def per_request_usage(metrics: Any) -> dict[str, Any] | None:
    """vLLM's per-request acceptance — the top-level `metrics` of a response, whose `speculative_decoding`
    block vLLM ≥ 0.32 fills with `--per-request-spec-decode-metrics` — as the `spec_*` usage extension
    above, or None without per-step data. vLLM observes only steps that verified ≥ 1 draft, so these are
    its drafting steps: `per_step_drafted` / `per_step_accepted` at level `detailed`; a request with no
    drafting step has neither (at any level), which is zero steps, not missing data; level `summary`
    (steps but no arrays) gives None."""
    spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    accepted, drafted = spec.get("per_step_accepted"), spec.get("per_step_drafted")
    if accepted is None and drafted is None and spec.get("num_spec_steps") == 0:
        accepted, drafted = [], []
    if not isinstance(accepted, list) or not isinstance(drafted, list) or len(accepted) != len(drafted):
        return None
    gamma = spec.get("num_spec_tokens", max(drafted, default=0))
    return {"spec_num_drafts": int(gamma), "spec_verify_ct": len(accepted), "spec_steps": "drafting",
            "spec_verified_per_step": [int(v) for v in drafted], "spec_accepted_per_step": [int(a) for a in accepted]}
