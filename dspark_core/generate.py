"""The speculative generation loop, written once: draft → verify → accept/bonus → commit → roll back.

Every decoding mode in the project is this loop: plain decoding is the `none` drafter (zero
drafts, so each step emits the target's own next token), and a verification policy (the engine's
scheduler) only chooses how many of each request's drafts to verify. The choice may use the drafts'
confidences but is made before verification, and a policy sees position j's confidence only as one
number of the proposal: keeping it lossless (never depending on token j or later) is the policy's
contract, tested in the engine.

A policy may also decide, *before* the draft forward, how many tokens to draft this step
(`DraftLengthPolicy.draft_length`, 0 … γ): with 0 the step skips the draft forward and is a plain
decoding step (the target's next token from the anchor alone). Being asked before any draft of the step
exists, that decision cannot depend on them. The drafter still gets every committed token with its
features, so later drafts see a complete context, but lazily: a drafter needs its context only when it
drafts, so steps without drafts park the new positions (`PendingObservations`) and the next draft step
(or a full buffer) hands them over in one batched `observe`.

The target verifies a right-padded [R, 1 + longest verify length] block, so a step costs what its
longest verification costs; the drafter observes only up to the longest accepted run.

Counters are raw (steps, drafted, accepted per step, confidences with outcomes); ratios are
derived elsewhere, once.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from dspark_core.drafters.base import DraftProposal, DraftStep, Drafter
from dspark_core.target import TargetModel
from dspark_core.verification import verify

# policy(proposal, step) → [R] number of drafts to verify per row (≤ num_drafts)
VerifyPolicy = Callable[[DraftProposal, DraftStep], Tensor]


@runtime_checkable
class DraftLengthPolicy(Protocol):
    """A verify policy that also chooses how many tokens to draft, before the draft forward runs, and
    learns from what earlier steps accepted."""

    def draft_length(self, step: DraftStep) -> int:
        """Tokens to draft for every row this step, 0 … step.num_drafts (0: no draft forward). `step` holds
        the committed tokens only: this step's drafts do not exist yet."""

    def observe_outcomes(self, num_verified: Tensor, num_accepted: Tensor) -> None:
        """After verification of a step that drafted: [R] drafts verified and accepted per row."""

    def __call__(self, proposal: DraftProposal, step: DraftStep) -> Tensor: ...


def planner_of(policy: VerifyPolicy | None, num_drafts: int) -> DraftLengthPolicy | None:
    """The policy as a planner of draft lengths, when it is one and there is anything to draft (γ > 0)."""
    return policy if num_drafts > 0 and isinstance(policy, DraftLengthPolicy) else None


# Optional on a DraftLengthPolicy: `observe_step_seconds(num_rows, draft_length, width, seconds)`, told the wall
# time of every step it planned (after the step's results reached the host), so it can price steps from
# this machine's real costs rather than only from a table measured beforehand.


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    num_drafts: int = 7  # γ: draft tokens proposed per step (γ + 1 tokens verified)
    temperature: float = 0.0  # 0: greedy
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class RequestCounters:
    """Raw per-request counters; per-step lists are aligned (one entry per verify step)."""

    num_drafts: int  # γ of the run, the length of the histograms below
    accepted_histogram: list[int] = field(default_factory=list)  # [γ+1]: steps that accepted k drafts
    num_verified: list[int] = field(default_factory=list)  # drafts verified at each step
    num_accepted: list[int] = field(default_factory=list)  # drafts accepted at each step
    confidence_logits: list[list[float]] = field(default_factory=list)  # verified positions' logits per step

    def __post_init__(self) -> None:
        if not self.accepted_histogram:
            self.accepted_histogram = [0] * (self.num_drafts + 1)

    @property
    def num_steps(self) -> int:
        return len(self.num_verified)

    @property
    def num_drafted(self) -> int:
        """Draft tokens verified over the whole request (proposed but unverified ones never count)."""
        return sum(self.num_verified)

    def position_counts(self) -> tuple[list[int], list[int]]:
        """Per draft position k = 1 … γ: (steps that verified position k, steps that accepted it).

        Accepted at k means drafts 1 … k all accepted, so the ratio is the unconditional per-position
        acceptance; dividing by the previous position's accepted count gives the conditional one.
        """
        verified = [sum(1 for v in self.num_verified if v >= k) for k in range(1, self.num_drafts + 1)]
        accepted = [sum(1 for a in self.num_accepted if a >= k) for k in range(1, self.num_drafts + 1)]
        return verified, accepted

    def confidence_outcomes(self) -> list[tuple[int, float, int]]:
        """(position k, confidence logit, realised survival: 1 if drafts 1 … k were all accepted) for every
        verified position that carried a confidence."""
        return [
            (k + 1, logit, int(accepted > k))
            for logits, accepted in zip(self.confidence_logits, self.num_accepted)
            for k, logit in enumerate(logits)
        ]

    def record(self, verified: int, accepted: int, confidences: Sequence[float] | None) -> None:
        self.num_verified.append(verified)
        self.num_accepted.append(accepted)
        self.accepted_histogram[accepted] += 1
        if confidences is not None:
            self.confidence_logits.append(list(confidences))


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens (first token from prefill, then every step's emission)
    finish_reason: str  # "stop" | "length"
    counters: RequestCounters


MAX_PENDING = 64  # positions a slot may hold back from the drafter before they are handed over


@dataclass
class PendingObservations:
    """Committed positions the drafter has not observed yet, per slot, in order (steps without drafts)."""

    token_ids: Tensor  # [num_slots, MAX_PENDING]
    features: Tensor  # [num_slots, MAX_PENDING, F] the target's features of those positions
    count: Tensor  # [num_slots] long

    @classmethod
    def allocate(cls, num_slots: int, num_features: int, dtype: torch.dtype, device) -> "PendingObservations":
        return cls(
            torch.zeros(num_slots, MAX_PENDING, dtype=torch.long, device=device),
            torch.zeros(num_slots, MAX_PENDING, num_features, dtype=dtype, device=device),
            torch.zeros(num_slots, dtype=torch.long, device=device),
        )


@dataclass
class BatchState:
    """Committed tokens and caches of a batch of request slots."""

    token_ids: Tensor  # [num_slots, capacity]
    num_tokens: Tensor  # [num_slots]: committed; the last is the anchor (its target forward not yet run)
    target_cache: object
    draft_state: object
    last_draft_length: int = 0  # tokens drafted per row by the last speculative step (0: no draft forward)
    has_confidences: bool | None = None  # whether the drafter's proposals carry confidences (None: none seen yet)
    pending: PendingObservations | None = None  # held back from the drafter (allocated on first use)
    # Prompts held back from the drafter (a planning policy may never draft for them): slot → (tokens [L],
    # target features [L, F]); handed over before the slot's pending positions, by `hand_over_pending`.
    deferred_prompts: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)


def new_batch_state(target: TargetModel, drafter: Drafter, num_slots: int, capacity: int) -> BatchState:
    """Empty slots for `num_slots` requests of up to `capacity` tokens (prompt + output + γ + 2)."""
    device = target.device
    return BatchState(
        token_ids=torch.zeros(num_slots, capacity, dtype=torch.long, device=device),
        num_tokens=torch.zeros(num_slots, dtype=torch.long, device=device),
        target_cache=target.new_cache(num_slots, capacity),
        draft_state=drafter.start(num_slots, capacity),
    )


def release_slots(state: BatchState, drafter: Drafter, rows: Tensor) -> None:
    """Free slots for new requests (continuous batching): lengths to zero, nothing copied."""
    state.num_tokens[rows] = 0
    state.target_cache.lengths[rows] = 0
    if state.pending is not None:
        state.pending.count[rows] = 0
    for row in rows.tolist():
        state.deferred_prompts.pop(row, None)
    drafter.reset(state.draft_state, rows)


def generate(
    target: TargetModel,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig,
    generators: Sequence[torch.Generator] | None = None,
    seed: int = 0,
    policy: VerifyPolicy | None = None,
) -> list[GenerationResult]:
    """Generate for every prompt at once; request i's randomness comes only from generators[i]."""
    device = target.device
    num = len(prompts)
    if generators is None:
        generators = [torch.Generator(device="cpu").manual_seed(seed + i) for i in range(num)]
    num_drafts = config.num_drafts if drafter.name != "none" else 0
    capacity = max(len(p) for p in prompts) + config.max_new_tokens + num_drafts + 2
    state = new_batch_state(target, drafter, num, capacity)
    temperatures = torch.full((num,), float(config.temperature), device=device)
    rows = torch.arange(num, device=device)
    outputs: list[list[int]] = [[] for _ in range(num)]
    counters = [RequestCounters(num_drafts) for _ in range(num)]
    finish: list[str | None] = [None] * num

    first = prefill(target, drafter, state, rows, prompts, temperatures, list(generators),
                    defer_drafter=planner_of(policy, num_drafts) is not None)
    for i, token in enumerate(first.tolist()):
        finish[i] = emit(outputs[i], [token], config.max_new_tokens, config.stop_token_ids)

    while True:
        active = [i for i in range(num) if finish[i] is None]
        if not active:
            break
        act = torch.tensor(active, device=device)
        # γ drafts up to the last step, whatever the token budget left; `emit` drops what overshoots (vLLM's
        # rule, so acceptance counts are the same thing on both engines: harness.metrics.acceptance)
        emitted, verified, accepted, confs = speculative_step(
            target, drafter, state, act, temperatures[act], [generators[i] for i in active],
            num_drafts, None, policy,
        )
        for j, i in enumerate(active):
            counters[i].record(verified[j], accepted[j], confs[j] if confs is not None else None)
            finish[i] = emit(outputs[i], emitted[j], config.max_new_tokens, config.stop_token_ids)

    return [
        GenerationResult(list(p), outputs[i], finish[i] or "length", counters[i]) for i, p in enumerate(prompts)
    ]


@torch.no_grad()
def prefill(
    target: TargetModel,
    drafter: Drafter,
    state: BatchState,
    rows: Tensor,
    prompts: Sequence[Sequence[int]],
    temperatures: Tensor,
    generators: list[torch.Generator],
    defer_drafter: bool = False,
) -> Tensor:
    """Run the prompts, sample each first token from the target (a zero-draft verify), commit it.

    `defer_drafter` (a policy that plans draft lengths, and may plan none for these requests): the drafter
    gets the prompts at the first step that drafts for them, not now; under a load where drafting does not
    pay that is never, and the draft model's pass over every prompt (≈ 15% of a prefill on the embedded
    default) is not paid at all."""
    device = target.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    if bool((lengths == 0).any()):
        raise ValueError("empty prompt: every request needs at least one token")
    padded = torch.zeros(len(prompts), int(lengths.max()), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    last = (lengths - 1)[:, None]  # [R, 1]: only the last prompt position's logits are needed
    if _accepts_logits_at(target):
        out = target.forward(state.target_cache, rows, padded, lengths, logits_at=last)
        last_logits = out.logits[:, 0]  # [R, vocab]
    else:
        out = target.forward(state.target_cache, rows, padded, lengths)
        last_logits = out.logits[torch.arange(len(prompts), device=device), lengths - 1]  # [R, vocab]
    if defer_drafter:
        for i, (row, n) in enumerate(zip(rows.tolist(), lengths.tolist())):
            state.deferred_prompts[row] = (padded[i, :n].clone(), out.features[i, :n].clone())
    else:
        drafter.observe(state.draft_state, rows, padded, out.features, lengths)
    no_drafts = torch.zeros(len(prompts) + 1, dtype=torch.long, device=device)
    first = verify(last_logits, no_drafts[:0], no_drafts, None, temperatures, generators).next_token_ids
    state.token_ids[rows, : padded.shape[1]] = padded
    state.token_ids[rows, lengths] = first
    state.num_tokens[rows] = lengths + 1
    return first


@torch.no_grad()
def speculative_step(
    target: TargetModel,
    drafter: Drafter,
    state: BatchState,
    rows: Tensor,
    temperatures: Tensor,
    generators: list[torch.Generator],
    num_drafts: int,
    max_verify: Tensor | None = None,
    policy: VerifyPolicy | None = None,
    verifier: Callable | None = None,
) -> tuple[list[list[int]], list[int], list[int], list[list[float]] | None]:
    """One step for slots `rows`: returns per row the emitted tokens, drafts verified, drafts accepted,
    and the verified positions' confidence logits (None if the drafter has no confidence head).

    `max_verify` [R] caps the drafts verified per row (None: no cap). The engine loops pass None: a draft is
    verified even where the token budget cannot take all it would emit, as vLLM does. A
    `DraftLengthPolicy` first picks how many of the `num_drafts` tokens to draft (0: no draft forward), and
    afterwards hears what was verified and accepted. `verifier` replaces `verify` (same signature) for the
    drafts: only `verification.synthetic_verifier` does, to measure the engine at a fixed acceptance.
    """
    started = time.perf_counter()
    device = target.device
    num_rows = len(rows)
    step = DraftStep(rows, state.token_ids, state.num_tokens, num_drafts, temperatures, generators)
    anchors = step.anchor_ids
    planner = planner_of(policy, num_drafts)
    if planner is not None:
        num_drafts = step.num_drafts = max(0, min(num_drafts, int(planner.draft_length(step))))  # no draft exists yet
    handover_s = 0.0
    if num_drafts > 0:
        handover_s = time.perf_counter()
        hand_over_pending(drafter, state, rows)  # the drafter's context must be complete before it drafts
        handover_s = time.perf_counter() - handover_s
        proposal = drafter.propose(state.draft_state, step)
        state.has_confidences = proposal.confidence_logits is not None
    else:
        proposal = DraftProposal(torch.empty(num_rows, 0, dtype=torch.long, device=device), None, None)
    state.last_draft_length = num_drafts
    if max_verify is None:
        max_verify = torch.full((num_rows,), num_drafts, dtype=torch.long, device=device)
    n_verify = torch.clamp(max_verify, min=0, max=num_drafts)
    if proposal.num_valid is not None:
        n_verify = torch.minimum(n_verify, proposal.num_valid)
    if policy is not None and num_drafts > 0:
        n_verify = torch.minimum(n_verify, policy(proposal, step))

    # Target forward over [anchor, d_1 … d_n] for each row, right-padded to the longest n + 1.
    width = int(n_verify.max()) + 1 if num_rows else 1
    inputs = torch.cat([anchors[:, None], proposal.token_ids[:, : width - 1]], dim=1)  # [R, width]
    cache_len_before = state.target_cache.lengths[rows].clone()
    out = target.forward(state.target_cache, rows, inputs, n_verify + 1)

    offsets = torch.arange(width, device=device)
    target_valid = offsets[None, :] <= n_verify[:, None]  # [R, width]
    draft_valid = target_valid[:, 1:]  # [R, width − 1]: drafts 1 … n verified
    cu_num_drafts = torch.zeros(num_rows + 1, dtype=torch.long, device=device)
    cu_num_drafts[1:] = n_verify.cumsum(0)
    draft_tokens = inputs[:, 1:]
    draft_probs = proposal.draft_probs[:, : width - 1][draft_valid] if proposal.draft_probs is not None else None
    result = (verifier or verify)(
        out.logits[target_valid], draft_tokens[draft_valid], cu_num_drafts, draft_probs, temperatures, generators,
    )
    num_accepted = result.num_accepted
    num_emitted = num_accepted + 1
    if planner is not None and num_drafts > 0:
        planner.observe_outcomes(n_verify, num_accepted)

    # Commit accepted drafts + recovered/bonus token; roll the target cache back to anchor + accepted.
    state.target_cache.rollback(rows, cache_len_before + num_emitted)
    if planner is not None and num_drafts == 0:
        hold_back(drafter, state, rows, inputs[:, 0], out.features[:, 0])  # one committed position per row
    else:
        observed = int(num_emitted.max()) if num_rows else 1  # the drafter sees only committed positions
        drafter.observe(state.draft_state, rows, inputs[:, :observed], out.features[:, :observed], num_emitted)
    emitted_t = torch.cat([draft_tokens, torch.zeros(num_rows, 1, dtype=torch.long, device=device)], dim=1)
    emitted_t[torch.arange(num_rows, device=device), num_accepted] = result.next_token_ids
    write = offsets[None, :] < num_emitted[:, None]  # [R, width]
    slot = rows[:, None].expand(-1, width)[write]
    pos = (state.num_tokens[rows][:, None] + offsets[None, :])[write]
    state.token_ids[slot, pos] = emitted_t[write]
    state.num_tokens[rows] += num_emitted

    counts = num_emitted.tolist()  # (a device sync: the step's work is done past this line)
    emitted = [row[:n] for row, n in zip(emitted_t.tolist(), counts)]
    verified, accepted = n_verify.tolist(), [n - 1 for n in counts]
    observe_seconds = getattr(planner, "observe_step_seconds", None)
    if observe_seconds is not None and num_rows:
        # Without the hand-over of positions parked by earlier plain steps: their deferred observe is the price of
        # those steps' tokens (a drafting step observes its own tokens, and that is in its price), and charging it
        # to the first drafting step after a plain stretch would make drafting look dearer the rarer it is.
        observe_seconds(num_rows, num_drafts, width, time.perf_counter() - started - handover_s)
    confs = None
    if proposal.confidence_logits is not None:
        conf_rows = proposal.confidence_logits.tolist()
        confs = [conf_rows[j][: verified[j]] for j in range(num_rows)]
    elif num_drafts == 0 and state.has_confidences:
        confs = [[] for _ in range(num_rows)]  # a step without drafts: nothing verified, nothing to calibrate
    return emitted, verified, accepted, confs


def hold_back(drafter: Drafter, state: BatchState, rows: Tensor, token_ids: Tensor, features: Tensor) -> None:
    """Park one committed position per row ([R] tokens, [R, F] features) for the drafter; a slot whose buffer
    is full first hands everything pending over."""
    pending = state.pending
    if pending is None:
        num_slots = state.token_ids.shape[0]
        pending = state.pending = PendingObservations.allocate(num_slots, features.shape[-1], features.dtype,
                                                                features.device)
    if bool((pending.count[rows] >= MAX_PENDING).any()):
        hand_over_pending(drafter, state, rows)
    pos = pending.count[rows]
    pending.token_ids[rows, pos] = token_ids
    pending.features[rows, pos] = features
    pending.count[rows] += 1


def hand_over_pending(drafter: Drafter, state: BatchState, rows: Tensor) -> None:
    """`observe` every position held back for slots `rows`: deferred prompts first, then the positions parked by
    steps without drafts, each in one batched call."""
    deferred = [row for row in rows.tolist() if row in state.deferred_prompts] if state.deferred_prompts else []
    if deferred:
        token_ids, features = zip(*(state.deferred_prompts.pop(row) for row in deferred))
        lengths = torch.tensor([len(t) for t in token_ids], device=rows.device)
        drafter.observe(state.draft_state, torch.tensor(deferred, device=rows.device),
                        pad_sequence(token_ids, batch_first=True), pad_sequence(features, batch_first=True), lengths)
    pending = state.pending
    if pending is None:
        return
    counts = pending.count[rows]
    has = counts > 0
    if not bool(has.any()):
        return
    rows, counts = rows[has], counts[has]
    width = int(counts.max())
    drafter.observe(state.draft_state, rows, pending.token_ids[rows, :width], pending.features[rows, :width], counts)
    pending.count[rows] = 0


def _accepts_logits_at(target) -> bool:
    """Whether `target.forward` takes `logits_at` (a `TargetModel` does; a test double may not)."""
    try:
        return "logits_at" in inspect.signature(target.forward).parameters
    except (TypeError, ValueError):
        return False


def emit(output: list[int], tokens: list[int], max_new_tokens: int, stop_token_ids: Sequence[int]) -> str | None:
    """Append tokens up to a stop token or the budget; returns the finish reason once finished."""
    for token in tokens:
        output.append(token)
        if token in stop_token_ids:
            return "stop"
        if len(output) >= max_new_tokens:
            return "length"
    return None
