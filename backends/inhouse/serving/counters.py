"""What /metrics exports: vLLM's spec-decode counter names (see `backends.openai.metrics`), token counters,
and request counters that add up at every scrape:

    requests_received = requests_failed + Σ request_success{finished_reason} + requests_in_flight

Request outcomes are counted by the HTTP side only (one `begin` when a request to a completion route
arrives, before its body is read; one `end` when its answer is over, whatever happened), so a bad body, a
timeout or a client that leaves moves a request from in flight to exactly one outcome. The engine thread
counts steps and tokens. All under one lock, so a scrape sees a consistent snapshot.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


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
        lines = []
        for name, kind, help_text, samples in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{labels}}} {float(value)}" for labels, value in samples]
        return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
