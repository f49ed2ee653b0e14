"""What /metrics exports: vLLM's spec-decode counter names (see `backends.openai.metrics`), token counters,
and request counters that add up at every scrape:

    requests_received = requests_failed + Σ request_success{finished_reason} + requests_in_flight

Request outcomes are counted by the HTTP side only (one `begin` when a request to a completion route
arrives, before its body is read; one `end` when its answer is over, whatever happened), so a bad body, a
timeout or a client that leaves moves a request from in flight to exactly one outcome. The engine thread
counts steps and tokens. All under one lock, so a scrape sees a consistent snapshot.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # vLLM's buckets for the same histogram


@dataclass
class Counters:
    num_drafts: int  # γ: the positions of the per-position counter
    drafts: int = 0  # (request, step) pairs that verified ≥ 1 draft (vLLM's num_drafts)
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    steps: int = 0  # every verify step, drafts or not
    prompt_tokens: int = 0
    generation_tokens: int = 0
    received: int = 0
    in_flight: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason → requests
    failed: int = 0
    # TTFT as the server sees it (vLLM's histogram): POST received → first token chunk written, streams only
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS_S))  # per bucket, not cumulative
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.num_drafts

    # ---------------------------------------------------------------- request outcomes (HTTP side)

    def begin(self) -> None:
        with self.lock:
            self.received += 1
            self.in_flight += 1

    def end(self, finish_reason: str | None) -> None:
        """The request is over: finished with `finish_reason` (stop, length, abort), or failed (None)."""
        with self.lock:
            self.in_flight -= 1
            if finish_reason is None:
                self.failed += 1
            else:
                self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1

    def observe_ttft(self, seconds: float) -> None:
        with self.lock:
            self.ttft_sum_s += seconds
            self.ttft_count += 1
            bucket = next((i for i, le in enumerate(TTFT_BUCKETS_S) if seconds <= le), None)
            if bucket is not None:
                self.ttft_counts[bucket] += 1

    # ---------------------------------------------------------------- engine side

    def observe_steps(self, verified: list[int], accepted: list[int]) -> None:
        with self.lock:
            for v, a in zip(verified, accepted):
                self.steps += 1
                self.drafts += v > 0
                self.draft_tokens += v
                self.accepted += a
                for k in range(a):
                    self.accepted_per_pos[k] += 1

    def add_tokens(self, prompt: int = 0, generated: int = 0) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated

    # ---------------------------------------------------------------- export

    def prometheus(self, model: str, running: int, waiting: int, connections: int) -> str:
        m = f'model_name="{_escape(model)}"'
        with self.lock:
            rows = [
                ("vllm:spec_decode_num_drafts_total", "counter", "Verify steps (per request) with at least one draft.",
                 [(m, self.drafts)]),
                ("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.", [(m, self.draft_tokens)]),
                ("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", [(m, self.accepted)]),
                ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                 "Accepted draft tokens per position (from 0).",
                 [(f'{m},position="{k}"', n) for k, n in enumerate(self.accepted_per_pos)]),
                ("dspark:spec_decode_num_steps_total", "counter", "Verify steps (per request), with or without drafts.",
                 [(m, self.steps)]),
                ("vllm:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", [(m, self.prompt_tokens)]),
                ("vllm:generation_tokens_total", "counter", "Generated tokens.", [(m, self.generation_tokens)]),
                ("vllm:request_success_total", "counter", "Finished requests by finish reason.",
                 [(f'{m},finished_reason="{r}"', n) for r, n in sorted(self.finished.items())]),
                ("dspark:requests_received_total", "counter", "Requests received (valid or not).", [(m, self.received)]),
                ("dspark:requests_failed_total", "counter", "Requests rejected or failed.", [(m, self.failed)]),
                ("dspark:requests_in_flight", "gauge", "Requests received and not yet answered.", [(m, self.in_flight)]),
                ("vllm:num_requests_running", "gauge", "Requests in the engine's batch.", [(m, running)]),
                ("vllm:num_requests_waiting", "gauge", "Requests waiting for a slot.", [(m, waiting)]),
                ("dspark:http_connections", "gauge", "Open HTTP connections.", [(m, connections)]),
            ]
            cumulative = list(itertools.accumulate(self.ttft_counts))
            ttft_sum_s, ttft_count = self.ttft_sum_s, self.ttft_count
        lines = []
        for name, kind, help_text, samples in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{labels}}} {float(value)}" for labels, value in samples]
        name = "vllm:time_to_first_token_seconds"
        lines += [f"# HELP {name} Time to first token (request received to first token chunk written).",
                  f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{{m},le="{le}"}} {float(n)}' for le, n in zip(TTFT_BUCKETS_S, cumulative)]
        lines += [f'{name}_bucket{{{m},le="+Inf"}} {float(ttft_count)}',
                  f"{name}_sum{{{m}}} {ttft_sum_s}", f"{name}_count{{{m}}} {float(ttft_count)}"]
        return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
