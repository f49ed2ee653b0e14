"""The speculative generation loop, written once: draft → verify → accept/bonus → commit → roll back.

Every decoding mode in the project is this loop: plain decoding is the `none` drafter (zero drafts, so each
step emits the target's own next token). A verification policy (`dspark_core.policy`) plans how many tokens
to draft before the draft forward (0: a plain decoding step) and chooses how many of each request's drafts to
verify before verification; the loops (`generate` here, the engine's `step`) tell it each step's outcome.
A choice may use the drafts' confidences, and a policy sees position j's confidence only as one number of the
proposal: keeping it lossless (never depending on token j or later) is the policy's contract, tested in the
scheduler's and the engine's tests.

The target verifies a right-padded [R, 1 + longest verify length] block, so a step costs what its longest
verification costs; the drafter observes only up to the longest accepted run. Steps never read a clock: the
engine times them (`backends/inhouse/engine.py`).

Counters are raw (steps, drafted, accepted per step, confidences with outcomes); ratios are derived
elsewhere, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from dspark_core.drafters.base import DraftProposal, DraftStep, Drafter
from dspark_core.drafters.deferred import DeferredObservations
from dspark_core.kv_slots import KVSlots
from dspark_core.policy import VERIFY_ALL, Policy, StepOutcome
from dspark_core.target import TargetModel
from dspark_core.verification import verify


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

    def record_step(self, outcome: StepOutcome, row: int) -> None:
        """Row `row`'s part of one step's outcome."""
        confidences = outcome.confidences[row] if outcome.confidences is not None else None
        self.record(outcome.num_verified[row], outcome.num_accepted[row], confidences)

    def record(self, verified: int, accepted: int, confidences: Sequence[float] | None) -> None:
        """One step. `confidences` None: the step verified nothing with a confidence (no confidence head, or no
        draft forward); once a step has them, every step has an entry ([] for those without), so the lists stay
        aligned whichever came first."""
        self.num_verified.append(verified)
        self.num_accepted.append(accepted)
        self.accepted_histogram[accepted] += 1
        if confidences is not None:
            self.confidence_logits += [[] for _ in range(self.num_steps - 1 - len(self.confidence_logits))]
            self.confidence_logits.append(list(confidences))
        elif self.confidence_logits:
            self.confidence_logits.append([])


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens (first token from prefill, then every step's emission)
    finish_reason: str  # "stop" | "length"
    counters: RequestCounters


@dataclass
class BatchState:
    """Committed tokens and caches of a batch of request slots."""

    token_ids: Tensor  # [num_slots, capacity]
    num_tokens: Tensor  # [num_slots]: committed; the last is the anchor (its target forward not yet run)
    target_cache: KVSlots
    draft_state: object


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
    drafter.reset(state.draft_state, rows)


def generate(
    target: TargetModel,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig,
    generators: Sequence[torch.Generator] | None = None,
    seed: int = 0,
    policy: Policy | None = None,
) -> list[GenerationResult]:
    """Generate for every prompt at once; request i's randomness comes only from generators[i]. Steps are not
    timed here: the policy (None: `VerifyAll`) observes each outcome with `seconds=None`."""
    policy = VERIFY_ALL if policy is None else policy
    device = target.device
    num = len(prompts)
    if generators is None:
        generators = [torch.Generator(device="cpu").manual_seed(seed + i) for i in range(num)]
    num_drafts = config.num_drafts if drafter.name != "none" else 0
    if policy.may_skip_drafts and num_drafts > 0:
        drafter = DeferredObservations(drafter)  # steps without drafts park what the drafter would observe
    capacity = max(len(p) for p in prompts) + config.max_new_tokens + num_drafts + 2
    state = new_batch_state(target, drafter, num, capacity)
    temperatures = torch.full((num,), float(config.temperature), device=device)
    rows = torch.arange(num, device=device)
    outputs: list[list[int]] = [[] for _ in range(num)]
    counters = [RequestCounters(num_drafts) for _ in range(num)]
    finish: list[str | None] = [None] * num

    first = prefill(target, drafter, state, rows, prompts, temperatures, list(generators))
    for i, token in enumerate(first.tolist()):
        finish[i] = emit(outputs[i], [token], config.max_new_tokens, config.stop_token_ids)

    while True:
        active = [i for i in range(num) if finish[i] is None]
        if not active:
            break
        act = torch.tensor(active, device=device)
        # γ drafts up to the last step, whatever the token budget left; `emit` drops what overshoots (vLLM's
        # rule, so acceptance counts are the same thing on both engines: harness.metrics.acceptance)
        outcome = speculative_step(target, drafter, state, act, temperatures[act], [generators[i] for i in active],
                                   num_drafts, policy)
        policy.observe(outcome, None)
        for j, i in enumerate(active):
            counters[i].record_step(outcome, j)
            finish[i] = emit(outputs[i], outcome.emitted[j], config.max_new_tokens, config.stop_token_ids)

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
) -> Tensor:
    """Run the prompts, sample each first token from the target (a zero-draft verify), commit it. The drafter
    observes the prompts (a `DeferredObservations` parks them until the request's first draft)."""
    device = target.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    if bool((lengths == 0).any()):
        raise ValueError("empty prompt: every request needs at least one token")
    padded = torch.zeros(len(prompts), int(lengths.max()), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    # Logits of the last prompt position only: [R, 1, vocab]
    out = target.forward(state.target_cache, rows, padded, lengths, logits_at=(lengths - 1)[:, None])
    drafter.observe(state.draft_state, rows, padded, out.features, lengths)
    no_drafts = torch.zeros(len(prompts) + 1, dtype=torch.long, device=device)
    first = verify(out.logits[:, 0], no_drafts[:0], no_drafts, None, temperatures, generators).next_token_ids
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
    policy: Policy = VERIFY_ALL,
    verifier: Callable | None = None,
) -> StepOutcome:
    """One step for slots `rows` ([R]): draft up to `num_drafts` tokens each, verify the ones `policy` chooses,
    commit the accepted drafts and the recovered/bonus token. `verifier` replaces `verify` (same signature):
    only `verification.synthetic_verifier` does, to measure the engine at a fixed acceptance (not lossless)."""
    device, num_rows = target.device, len(rows)
    step = DraftStep(rows, state.token_ids, state.num_tokens, num_drafts, temperatures, generators)
    if num_drafts > 0:  # planned before any draft of this step exists
        step.num_drafts = max(0, min(num_drafts, int(policy.plan(step))))
    if step.num_drafts > 0:
        proposal = drafter.propose(state.draft_state, step)
        n_verify = policy.choose(proposal, step).clamp(0, step.num_drafts)  # [R]
        if proposal.num_valid is not None:
            n_verify = torch.minimum(n_verify, proposal.num_valid)
    else:  # a plain decoding step: no draft forward
        proposal = DraftProposal(torch.empty(num_rows, 0, dtype=torch.long, device=device), None, None)
        n_verify = torch.zeros(num_rows, dtype=torch.long, device=device)

    # Verify: one target forward over [anchor, d_1 … d_n] for each row, right-padded to the longest n + 1.
    width = int(n_verify.max()) + 1 if num_rows else 1
    inputs = torch.cat([step.anchor_ids[:, None], proposal.token_ids[:, : width - 1]], dim=1)  # [R, width]
    cache_len_before = state.target_cache.lengths[rows].clone()
    out = target.forward(state.target_cache, rows, inputs, n_verify + 1)
    offsets = torch.arange(width, device=device)
    target_valid = offsets[None, :] <= n_verify[:, None]  # [R, width]
    draft_valid = target_valid[:, 1:]  # [R, width − 1]: drafts 1 … n verified
    cu_num_drafts = torch.nn.functional.pad(n_verify.cumsum(0), (1, 0))  # [R + 1]
    draft_probs = None if proposal.draft_probs is None else proposal.draft_probs[:, : width - 1][draft_valid]
    result = (verifier or verify)(_rows_where(out.logits, target_valid), inputs[:, 1:][draft_valid], cu_num_drafts,
                                  draft_probs, temperatures, generators)

    # Accept + bonus: the accepted drafts, then the recovered (or bonus) token in the first rejected place.
    num_emitted = result.num_accepted + 1  # [R]
    emitted = torch.cat([inputs[:, 1:], inputs.new_zeros(num_rows, 1)], dim=1)  # [R, width]
    emitted[torch.arange(num_rows, device=device), result.num_accepted] = result.next_token_ids
    # Commit them; the drafter observes the committed positions only (up to the longest accepted run).
    write = offsets[None, :] < num_emitted[:, None]  # [R, width]
    positions = state.num_tokens[rows][:, None] + offsets[None, :]
    state.token_ids[rows[:, None].expand(-1, width)[write], positions[write]] = emitted[write]
    state.num_tokens[rows] += num_emitted
    observed = int(num_emitted.max()) if num_rows else 1
    drafter.observe(state.draft_state, rows, inputs[:, :observed], out.features[:, :observed], num_emitted)
    # Roll back the target cache to anchor + accepted: the rejected drafts' keys and values are dropped.
    state.target_cache.rollback(rows, cache_len_before + num_emitted)
    return step_outcome(step.num_drafts, width, emitted, num_emitted, n_verify, proposal.confidence_logits)


def _rows_where(logits: Tensor, valid: Tensor) -> Tensor:
    """`logits[valid]` ([R, width, vocab] → [valid count, vocab], row-major order) as a view when every position is
    valid (every row verifies its whole block) and as whole-row copies otherwise: a boolean index copies element by
    element (16 × 8 rows of 49,152 logits: 1.8 ms against 1.3 for `index_select`, 0 for the view)."""
    flat = logits.flatten(0, 1)
    if bool(valid.all()):
        return flat
    return flat.index_select(0, valid.flatten().nonzero().squeeze(1))


def step_outcome(num_drafts: int, width: int, emitted: Tensor, num_emitted: Tensor, n_verify: Tensor,
                 confidence_logits: Tensor | None) -> StepOutcome:
    """The step's results on the host: per row, the emitted tokens, drafts verified and accepted, and the verified
    positions' confidence logits (None if no confidence head drafted this step)."""
    counts, verified = num_emitted.tolist(), n_verify.tolist()
    confidences = None
    if confidence_logits is not None:
        confidences = [row[:n] for row, n in zip(confidence_logits.tolist(), verified)]
    emitted_ids = [row[:n] for row, n in zip(emitted.tolist(), counts)]
    return StepOutcome(emitted_ids, verified, [n - 1 for n in counts], confidences, num_drafts, width)


def emit(output: list[int], tokens: list[int], max_new_tokens: int, stop_token_ids: Sequence[int]) -> str | None:
    """Append tokens up to a stop token or the budget; returns the finish reason once finished."""
    for token in tokens:
        output.append(token)
        if token in stop_token_ids:
            return "stop"
        if len(output) >= max_new_tokens:
            return "length"
    return None
