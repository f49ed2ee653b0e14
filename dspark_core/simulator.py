"""Scheduler simulator: a verification policy at production scale, without running any model.

Users plan past the machine they have: record acceptance traces once (per request and step, the
confidence logits of γ drafts and how many of them the target accepted with all γ verified), take an
SPS table of the hardware they plan for (measured, or loaded from a file such as an H100 curve), and
replay thousands of concurrent requests through the policy. Each simulated step: every active request
offers its next recorded step; the policy picks verify lengths v_r; the request accepts
min(acceptable, v_r) drafts and emits that plus the bonus; the step takes 1 / SPS(B) seconds with
B = Σ (v_r + 1) tokens verified. Finished requests are replaced (closed loop) until `num_requests`
have run.

The approximation, stated: after a truncated verification the real drafter would continue from a
different anchor; replaying the trace's next recorded step instead keeps acceptance statistics, not
token identity. Good for comparing policies and hardware, not for predicting outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from dspark_core.drafters.base import DraftProposal, DraftStep
from dspark_core.generate import RequestCounters
from dspark_core.policy import Policy
from dspark_core.costs import SPSTable


@dataclass(frozen=True)
class Trace:
    conf_logits: Tensor  # [steps, γ] confidence logits of the drafts at each recorded step
    num_acceptable: Tensor  # [steps] drafts the target accepted with all γ verified
    output_tokens: int


def traces_from_counters(counters: Sequence[RequestCounters]) -> list[Trace]:
    """Traces from requests generated with every draft verified (a full-γ static policy).

    A request's last steps may verify fewer drafts because its token budget ran out; those are left
    out, and the trace's length is what its kept steps emitted (prefill token + Σ (accepted + 1)).
    A short step followed by a full one means a policy truncated it: refused, since the trace would
    not say how many drafts the target would have accepted.
    """
    traces = []
    for c in counters:
        if not c.confidence_logits:
            continue
        full = [v == c.num_drafts for v in c.num_verified]
        kept = full.index(False) if False in full else len(full)
        if any(full[kept:]):
            raise ValueError("record traces with every draft verified (static γ = num_drafts): "
                             "a truncated step hides how many drafts the target would have accepted")
        if kept == 0:
            continue
        rows = [list(r) for r in c.confidence_logits[:kept]]
        accepted = c.num_accepted[:kept]
        traces.append(Trace(torch.tensor(rows), torch.tensor(accepted), 1 + sum(a + 1 for a in accepted)))
    if not traces:
        raise ValueError("no traces with confidences and a fully verified step: record them with a DSpark draft")
    return traces


@dataclass(frozen=True)
class SimResult:
    num_requests: int
    concurrency: int
    seconds: float  # simulated wall time
    output_tokens: int
    num_steps: int
    verified_tokens: int  # Σ B over steps
    accepted_drafts: int

    @property
    def throughput(self) -> float:
        """Output tokens per simulated second, the whole system."""
        return self.output_tokens / self.seconds

    @property
    def tokens_per_verified(self) -> float:
        return self.output_tokens / self.verified_tokens

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per request-step, bonus included (the project's τ)."""
        return (self.accepted_drafts + self.request_steps) / self.request_steps

    request_steps: int = 0


def simulate(
    traces: Sequence[Trace],
    policy: Policy,
    sps: SPSTable,
    *,
    concurrency: int,
    num_requests: int,
) -> SimResult:
    """Replay `num_requests` requests (traces taken round-robin) at `concurrency` through `policy`."""
    if concurrency < 1 or num_requests < 1:
        raise ValueError("concurrency and num_requests must be ≥ 1")
    gamma = traces[0].conf_logits.shape[1]
    next_trace = 0
    active: list[list] = []  # [trace, step index, tokens emitted]
    seconds = 0.0
    out_tokens = steps = verified = accepted_total = request_steps = 0
    dummy_history = torch.zeros(1, 1, dtype=torch.long)

    def start() -> None:
        nonlocal next_trace
        active.append([traces[next_trace % len(traces)], 0, 1])  # the prefill token counts as emitted
        next_trace += 1

    while next_trace < min(concurrency, num_requests):
        start()
    while active:
        rows = len(active)
        conf = torch.stack([t.conf_logits[k % t.conf_logits.shape[0]] for t, k, _ in active])  # [R, γ]
        acceptable = torch.tensor([int(t.num_acceptable[k % t.num_acceptable.shape[0]]) for t, k, _ in active])
        proposal = DraftProposal(torch.zeros(rows, gamma, dtype=torch.long), None, conf)
        step = DraftStep(torch.arange(rows), dummy_history, torch.ones(1, dtype=torch.long), gamma,
                         torch.ones(rows), [])
        lengths = policy.choose(proposal, step).clamp(0, gamma)
        accepted = torch.minimum(acceptable, lengths)
        batch_tokens = int((lengths + 1).sum())
        seconds += 1.0 / float(sps(batch_tokens))
        steps += 1
        verified += batch_tokens
        accepted_total += int(accepted.sum())
        request_steps += rows
        still = []
        for entry, a in zip(active, accepted.tolist()):
            entry[1] += 1
            entry[2] += a + 1
            if entry[2] >= entry[0].output_tokens:
                out_tokens += entry[0].output_tokens
            else:
                still.append(entry)
        active = still
        while len(active) < concurrency and next_trace < num_requests:
            start()
    return SimResult(num_requests, concurrency, seconds, out_tokens, steps, verified, accepted_total, request_steps)
