"""Raw records a backend reports: one `RequestRecord` per request, one `StepRecord` per engine step, and the
`MeasurementWindow` they are counted in.

The one form of each concept between a backend and the store: engines fill these (the in-house engine
appends `StepRecord`s itself), the store keeps them row for row, and `harness.metrics` derives every
ratio from them, once. Records hold counts and timestamps only. Timestamps
are seconds on one monotonic clock per run (e.g. `time.perf_counter()` of the process that drives the
engine), so only differences between them mean anything.

Words (as in `dspark_core.verification`): at a verify step a request sends its anchor and
`num_verified` of its drafts (0 … γ) to the target; `num_accepted` (0 … num_verified) of them are accepted
as a run from the start, and the target adds one recovered (after a rejection) or bonus (all accepted)
token, so a step emits `num_accepted + 1` tokens (fewer where a stop token or the token budget cuts the
last step). Drafts proposed but not verified are never counted. A *drafting* step verified ≥ 1 draft; a
step with `num_verified = 0` drafted nothing (no n-gram match, a policy that chose not to draft, plain
decoding) and emits exactly one token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class RequestRecord:
    """One request: token counts, timestamps and per-step verification counters.

    A request is failed iff `error` is set; then `finish_s` is when it failed, and the counts and times
    hold whatever it produced before. The per-step tuples are aligned, one entry per verify step (the
    first output token comes from prefill and is no verify step).
    """

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival_s: float  # handed to the engine
    first_token_s: float | None  # first output token emitted (None: failed before it)
    finish_s: float  # last token emitted, or the failure; this time places the request in a window
    # [output_tokens] emission time of each token; all tokens of one step carry the same time; () if unreported
    token_times_s: tuple[float, ...] = ()
    num_drafts: int = 0  # γ of the run (0: plain decoding)
    num_verified: tuple[int, ...] = ()  # [steps] drafts verified per step, 0 … γ
    num_accepted: tuple[int, ...] = ()  # [steps] drafts accepted per step, 0 … num_verified
    confidence_logits: tuple[tuple[float, ...], ...] = ()  # [steps][num_verified] raw head logits; () without a head
    finish_reason: str = "length"  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    # True: the steps are every verify step, drafting or not (in-house engine, our server); False: only the
    # drafting steps (num_verified ≥ 1) are known — vLLM reports no others — so the metrics over all steps
    # (tokens per target forward, draft coverage) leave this request out
    all_steps: bool = True

    def __post_init__(self) -> None:
        for name in ("token_times_s", "num_verified", "num_accepted"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "confidence_logits", tuple(tuple(c) for c in self.confidence_logits))
        self._check()

    def _check(self) -> None:
        where = f"request {self.request_id!r}"
        if self.prompt_tokens < 0 or self.output_tokens < 0 or self.num_drafts < 0:
            raise ValueError(f"{where}: prompt_tokens, output_tokens and num_drafts must be >= 0")
        if len(self.num_verified) != len(self.num_accepted):
            raise ValueError(f"{where}: num_verified and num_accepted must have one entry per step")
        for v, a in zip(self.num_verified, self.num_accepted):
            if not 0 <= a <= v <= self.num_drafts:
                raise ValueError(f"{where}: need 0 <= accepted <= verified <= γ={self.num_drafts}, got ({v}, {a})")
        if self.confidence_logits:
            if len(self.confidence_logits) != len(self.num_verified):
                raise ValueError(f"{where}: confidence_logits must have one entry per step (or none)")
            if any(len(c) != v for c, v in zip(self.confidence_logits, self.num_verified)):
                raise ValueError(f"{where}: each step needs one confidence logit per verified draft")
        if self.first_token_s is not None and not self.arrival_s <= self.first_token_s <= self.finish_s:
            raise ValueError(f"{where}: need arrival_s <= first_token_s <= finish_s")
        if self.finish_s < self.arrival_s:
            raise ValueError(f"{where}: finish_s is before arrival_s")
        times = self.token_times_s
        if times:
            if len(times) != self.output_tokens:
                raise ValueError(f"{where}: token_times_s needs one time per output token ({self.output_tokens})")
            if any(b < a for a, b in zip(times, times[1:])):
                raise ValueError(f"{where}: token_times_s must be non-decreasing")
            if times[0] != self.first_token_s or times[-1] > self.finish_s:
                raise ValueError(f"{where}: token_times_s must start at first_token_s and end by finish_s")
        if self.error is None and (self.first_token_s is None or self.output_tokens < 1):
            raise ValueError(f"{where}: a request that did not fail needs a first token")

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def num_steps(self) -> int:
        return len(self.num_verified)

    @property
    def num_drafting_steps(self) -> int:
        """Steps that verified ≥ 1 draft (vLLM's `num_drafts`); the others drafted nothing."""
        return sum(v > 0 for v in self.num_verified)

    @property
    def num_drafted(self) -> int:
        """Drafts verified over the request (the vLLM `num_draft_tokens`)."""
        return sum(self.num_verified)

    @property
    def num_accepted_drafts(self) -> int:
        return sum(self.num_accepted)

    @property
    def accepted_histogram(self) -> tuple[int, ...]:
        """[γ+1]: entry k = steps that accepted exactly k drafts."""
        hist = [0] * (self.num_drafts + 1)
        for a in self.num_accepted:
            hist[a] += 1
        return tuple(hist)

    def position_counts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per draft position k = 1 … γ: (steps that verified position k, steps that accepted drafts 1 … k)."""
        k_range = range(1, self.num_drafts + 1)
        verified = tuple(sum(v >= k for v in self.num_verified) for k in k_range)
        accepted = tuple(sum(a >= k for a in self.num_accepted) for k in k_range)
        return verified, accepted


@dataclass(frozen=True)
class StepRecord:
    """One engine step (one target forward over the verify batch), summed over its active requests."""

    step: int  # index in the run, from 0
    t_s: float  # end of the step (its tokens committed); this time places the step in a window
    batch_size: int  # active requests; each verifies its anchor, so each emits >= 1 token
    num_verified: int  # drafts verified over the batch; target tokens in the forward = num_verified + batch_size
    num_accepted: int  # drafts accepted over the batch; tokens emitted = num_accepted + batch_size
    wall_s: float  # wall time of the step (admission and prefill + draft + verify + commit)
    # tokens drafted per request this step, 0 … γ (0: no draft forward: a policy that chose not to draft, plain
    # decoding); one number for the whole batch, since a draft-length policy plans the step before any draft
    draft_length: int = 0
    num_prefilled: int = 0  # requests admitted (prefilled) at the start of the step

    def __post_init__(self) -> None:
        if self.batch_size < 0 or not 0 <= self.num_accepted <= self.num_verified or self.wall_s < 0:
            raise ValueError(f"step {self.step}: need batch_size >= 0, 0 <= accepted <= verified, wall_s >= 0")
        if self.draft_length < 0 or self.num_prefilled < 0:
            raise ValueError(f"step {self.step}: need draft_length >= 0 and num_prefilled >= 0")

    @property
    def start_s(self) -> float:
        return self.t_s - self.wall_s


@dataclass(frozen=True)
class MeasurementWindow:
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not self.end_s >= self.start_s:
            raise ValueError(f"window end {self.end_s} is before its start {self.start_s}")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def contains(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    @classmethod
    def after_warmup(cls, records: Sequence[RequestRecord], warmup_s: float = 0.0) -> MeasurementWindow:
        """From `warmup_s` after the first arrival to just past the last finish (so the last one counts)."""
        if not records:
            raise ValueError("no records to place a window on")
        start = min(r.arrival_s for r in records) + warmup_s
        end = math.nextafter(max(r.finish_s for r in records), math.inf)
        return cls(start, max(start, end))

    @classmethod
    def after_warmup_phase(cls, measured: Sequence[RequestRecord], warmup: Sequence[RequestRecord] = ()) -> MeasurementWindow:
        """For a warm-up run as its own phase before the measured load: from just after the last warm-up
        finish (else the first measured arrival) to just past the last measured finish, so every measured
        request counts and no warm-up request does."""
        measured = list(measured) or list(warmup)
        if not measured:
            raise ValueError("no records to place a window on")
        start = math.nextafter(max(r.finish_s for r in warmup), math.inf) if warmup else min(r.arrival_s for r in measured)
        end = math.nextafter(max(r.finish_s for r in measured), math.inf)
        return cls(start, max(start, end))


@dataclass(frozen=True)
class SpecCounts:
    """Speculative-decoding counts of a server (cumulative) or of a window (a difference of two scrapes): the raw
    record of a server that reports no per-request steps (vLLM's Prometheus counters; metrics:
    `harness.metrics.server_counts`)."""

    drafts: int  # (request, step) pairs that verified ≥ 1 draft
    draft_tokens: int  # drafts verified
    accepted: int  # drafts accepted
    accepted_per_pos: tuple[int, ...]  # [γ] steps that accepted drafts 1 … k+1, k = 0 … γ−1
    steps: int | None = None  # all verify steps (dspark counter); None where the server does not export it

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


@dataclass(frozen=True)
class ServerTTFT:
    """The server's own TTFT histogram totals (vLLM's `vllm:time_to_first_token_seconds`, our server's
    too), cumulative or a window's difference: the server-side twin of the client's `ttft_mean`."""

    sum_s: float
    count: int

    def __sub__(self, before: ServerTTFT) -> ServerTTFT:
        return ServerTTFT(self.sum_s - before.sum_s, self.count - before.count)
