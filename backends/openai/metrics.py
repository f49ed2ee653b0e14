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
coverage and tokens per target forward, which need every step. Per-position acceptance from counters assumes
every drafting step verified all γ positions (vLLM's fixed γ); it is reported only when the counters
show that (draft tokens = γ × drafts).
"""

from __future__ import annotations

import math
import re
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from harness.metrics.metric import Metric, ratio
from harness.metrics.records import RequestRecord

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


@dataclass(frozen=True)
class SpecCounts:
    """Speculative-decoding counts of a server (cumulative) or of a window (a difference of two scrapes)."""

    drafts: int  # (request, step) pairs that verified ≥ 1 draft
    draft_tokens: int  # drafts verified
    accepted: int  # drafts accepted
    accepted_per_pos: tuple[int, ...]  # [γ] steps that accepted drafts 1 … k+1, k = 0 … γ−1
    steps: int | None = None  # all verify steps (dspark counter); None where the server does not export it

    @classmethod
    def from_samples(cls, samples: Samples) -> SpecCounts | None:
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
        return cls(int(sums.get(DRAFTS, 0)), int(sums.get(DRAFT_TOKENS, 0)), int(sums.get(ACCEPTED, 0)),
                   tuple(int(per_pos.get(k, 0)) for k in range(gamma)),
                   int(sums[STEPS]) if STEPS in sums else None)

    @classmethod
    def from_text(cls, text: str) -> SpecCounts | None:
        return cls.from_samples(parse_prometheus(text))

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> SpecCounts:
        """What the counters would show for these requests' steps (failed requests included, as a server
        counts them): for cross-checking the two sources."""
        pairs = [(v, a) for r in records for v, a in zip(r.num_verified, r.num_accepted)]
        gamma = max((r.num_drafts for r in records), default=0)
        return cls(sum(v > 0 for v, _ in pairs), sum(v for v, _ in pairs), sum(a for _, a in pairs),
                   tuple(sum(a > k for _, a in pairs) for k in range(gamma)), len(pairs))

    def __sub__(self, before: SpecCounts) -> SpecCounts:
        """after − before, per counter (positions the earlier scrape lacked count from 0)."""
        gamma = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pad = lambda p: tuple(p) + (0,) * (gamma - len(p))  # noqa: E731
        steps = self.steps - before.steps if self.steps is not None and before.steps is not None else None
        return SpecCounts(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                          self.accepted - before.accepted,
                          tuple(a - b for a, b in zip(pad(self.accepted_per_pos), pad(before.accepted_per_pos))), steps)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpecCounts:
        """The inverse of `as_dict` (e.g. from a cell's `provenance["prometheus_spec_decode"]` JSON)."""
        return cls(int(d["drafts"]), int(d["draft_tokens"]), int(d["accepted"]),
                   tuple(int(n) for n in d["accepted_per_pos"]), None if d.get("steps") is None else int(d["steps"]))

    def as_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "accepted_per_pos": list(self.accepted_per_pos), "steps": self.steps}

    def metrics(self, num_drafts: int) -> dict[str, Metric]:
        """The acceptance metrics of `harness.metrics.summarise` that these counts determine (module
        docstring for the conventions); positions up to `num_drafts` (γ)."""
        drafts = self.drafts
        out = {
            "acceptance_length": Metric(1 + self.accepted / drafts if drafts else None, "tokens/step", drafts),
            "accepted_per_step": ratio(self.accepted, drafts, "drafts/step"),
            "verified_per_step": ratio(self.draft_tokens, drafts, "drafts/step"),
            "draft_acceptance_rate": ratio(self.accepted, self.draft_tokens, "fraction"),
            "wasted_verification_fraction": ratio(self.draft_tokens - self.accepted, self.draft_tokens, "fraction"),
        }
        if self.steps is not None:  # every step, drafting or not (our server's counter)
            out["draft_coverage"] = ratio(drafts, self.steps, "fraction")
            out["tokens_per_target_forward"] = ratio(self.accepted + self.steps, self.steps, "tokens/step")
        if num_drafts > 0 and self.drafts > 0 and self.draft_tokens == num_drafts * self.drafts:
            per_pos = tuple(self.accepted_per_pos) + (0,) * max(0, num_drafts - len(self.accepted_per_pos))
            for k in range(1, num_drafts + 1):
                out[f"position_acceptance_unconditional_k{k}"] = ratio(per_pos[k - 1], self.drafts, "fraction")
            for k in range(1, num_drafts + 1):
                below = per_pos[k - 2] if k > 1 else self.drafts
                out[f"position_acceptance_conditional_k{k}"] = ratio(per_pos[k - 1], below, "fraction")
        return out


TTFT = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True)
class ServerTTFT:
    """The server's own TTFT histogram totals (vLLM's `vllm:time_to_first_token_seconds`, our server's
    too), cumulative or a window's difference: the server-side twin of the client's `ttft_mean`."""

    sum_s: float
    count: int

    @classmethod
    def from_samples(cls, samples: Samples) -> ServerTTFT | None:
        total = sum(v for (name, _), v in samples.items() if name == TTFT + "_sum" and not math.isnan(v))
        count = [v for (name, _), v in samples.items() if name == TTFT + "_count" and not math.isnan(v)]
        return cls(float(total), int(sum(count))) if count else None

    def __sub__(self, before: ServerTTFT) -> ServerTTFT:
        return ServerTTFT(self.sum_s - before.sum_s, self.count - before.count)

    def metric(self) -> Metric:
        """`ttft_server_mean`: Σ server TTFT ÷ requests it timed (server-wide, like the spec counters)."""
        return ratio(self.sum_s, self.count, "s")


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
