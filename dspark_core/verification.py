"""Lossless verification of drafted tokens for a batch of requests, flattened without padding.

Terms, used everywhere in the project:
- **accepted** tokens: the longest run of draft tokens, from the first, that pass the test
  u < min(1, p_t(x) / p_d(x)) with u ~ U(0, 1). Greedy (T ≈ 0) is the same test with one-hot
  distributions, i.e. exact match with the target's argmax.
- **recovered** token: at the first rejected position, a sample from normalise(max(0, p_t − p_d))
  (p_t itself if that residual has no mass), so that accepted-or-recovered is distributed as p_t.
- **bonus** token: when every verified draft is accepted, a sample from p_t at the next position.
Each step therefore emits `num_accepted + 1` tokens per request: the accepted drafts, then the
recovered or bonus token (`next_token_ids`).

Layout: request r verified `n_r` drafts; `cu_num_drafts` [R+1] holds the cumulative n_r. Draft
rows are flattened to [total_drafts, ...]; target rows to [total_drafts + R, ...] (each request has
n_r + 1 target positions: the anchor, then each draft), so request r's target rows start at
`cu_num_drafts[r] + r`. Uniforms are passed in (drawn from per-request generators) so a kernel and
this reference consume the same noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from dspark_core.kernels import use_triton
from dspark_core.distributions import greedy_tokens, is_greedy, logits_to_probs, sample_from_probs

RESIDUAL_EPS = 1e-9


@dataclass
class VerifyOutput:
    num_accepted: Tensor  # [R] long, accepted drafts per request (0 … n_r)
    next_token_ids: Tensor  # [R] long, recovered or bonus token per request


def draw_verify_uniforms(generators: list[torch.Generator], num_drafts: Tensor) -> tuple[Tensor, Tensor]:
    """Acceptance uniforms [total_drafts] and one sampling uniform per request [R].

    Each request draws n_r + 1 numbers from its own generator, whatever happens, so its stream
    does not depend on the other requests in the batch.
    """
    counts = num_drafts.tolist()
    per_request = [torch.rand(n + 1, generator=g, device=g.device) for g, n in zip(generators, counts)]
    accept = torch.cat([u[:-1] for u in per_request]) if per_request else torch.empty(0)
    sample = torch.stack([u[-1] for u in per_request]) if per_request else torch.empty(0)
    return accept, sample


@dataclass
class _Layout:
    """Where each draft of a flattened batch sits (see the module docstring): its request, its position in
    that request's drafts and its target row; shared by the general and the greedy rule."""

    cu_num_drafts: Tensor  # [R + 1]
    num_drafts: Tensor  # [R]
    request_of_draft: Tensor  # [total_drafts]
    local_pos: Tensor  # [total_drafts]
    target_row_of_draft: Tensor  # [total_drafts]

    @classmethod
    def of(cls, cu_num_drafts: Tensor, total_drafts: int) -> "_Layout":
        device = cu_num_drafts.device
        num_drafts = cu_num_drafts[1:] - cu_num_drafts[:-1]
        request_of_draft = torch.repeat_interleave(torch.arange(num_drafts.numel(), device=device), num_drafts)
        start = cu_num_drafts[:-1][request_of_draft]
        local_pos = torch.arange(total_drafts, device=device) - start
        return cls(cu_num_drafts, num_drafts, request_of_draft, local_pos, start + request_of_draft + local_pos)

    def num_accepted(self, accepted: Tensor) -> Tensor:
        """[R] accepted count: the local index of each request's first rejected draft, or n_r if none."""
        first_reject = torch.where(accepted, self.num_drafts[self.request_of_draft], self.local_pos)
        counts = self.num_drafts.clone()
        counts.scatter_reduce_(0, self.request_of_draft, first_reject, reduce="amin", include_self=True)
        return counts

    def final_target_row(self, num_accepted: Tensor) -> Tensor:
        """[R] the target row after each request's accepted drafts (recovered or bonus token)."""
        arange = torch.arange(self.num_drafts.numel(), device=num_accepted.device)
        return self.cu_num_drafts[:-1] + arange + num_accepted


def rejection_sample(
    target_logits: Tensor,  # [total_drafts + R, vocab]
    draft_token_ids: Tensor,  # [total_drafts] long
    cu_num_drafts: Tensor,  # [R + 1] long
    draft_probs: Tensor | None,  # [total_drafts, vocab] fp32, or None: drafts are deterministic (one-hot)
    temperatures: Tensor,  # [R] (< GREEDY_TEMPERATURE: greedy)
    accept_uniforms: Tensor,  # [total_drafts] in [0, 1)
    sample_uniforms: Tensor,  # [R] in [0, 1)
) -> VerifyOutput:
    layout = _Layout.of(cu_num_drafts, draft_token_ids.numel())
    num_drafts = layout.num_drafts
    target_probs = logits_to_probs(target_logits, _per_target_row(temperatures, num_drafts))
    p_target = target_probs[layout.target_row_of_draft, :].gather(1, draft_token_ids[:, None]).squeeze(1)
    if draft_probs is None:
        p_draft = torch.ones_like(p_target)
    else:
        p_draft = draft_probs.gather(1, draft_token_ids[:, None]).squeeze(1).float()
    # u < p_t / p_d, written without the division; q >= p means always accept.
    accepted = accept_uniforms * p_draft < p_target  # [total_drafts]

    num_accepted = layout.num_accepted(accepted)
    final_probs = target_probs[layout.final_target_row(num_accepted)]  # [R, vocab]
    rejected = num_accepted < num_drafts
    if bool(rejected.any()):
        rejected_draft_row = (cu_num_drafts[:-1] + num_accepted)[rejected]
        if draft_probs is None:
            p_d = torch.nn.functional.one_hot(draft_token_ids[rejected_draft_row], final_probs.shape[-1]).float()
        else:
            p_d = draft_probs[rejected_draft_row].float()
        residual = (final_probs[rejected] - p_d).clamp_(min=0)
        mass = residual.sum(-1, keepdim=True)
        residual = torch.where(mass > RESIDUAL_EPS, residual / mass.clamp(min=RESIDUAL_EPS), final_probs[rejected])
        final_probs = final_probs.clone()
        final_probs[rejected] = residual
    next_token_ids = sample_from_probs(final_probs, sample_uniforms)
    return VerifyOutput(num_accepted=num_accepted, next_token_ids=next_token_ids)


def rejection_sample_greedy(target_logits: Tensor, draft_token_ids: Tensor, cu_num_drafts: Tensor) -> VerifyOutput:
    """`rejection_sample` when every request is greedy: a draft is accepted iff it is the target's argmax,
    and the next token is the argmax after the last accepted draft. The same result as the general path
    with one-hot p_t (u·p_d < 1 exactly when p_t(x) = 1; the residual of a one-hot is that one-hot),
    without a softmax or one-hot over the vocabulary. Twin of `rejection.rejection_greedy_sample_triton`."""
    layout = _Layout.of(cu_num_drafts, draft_token_ids.numel())
    argmax = greedy_tokens(target_logits)  # [total_drafts + R]
    num_accepted = layout.num_accepted(draft_token_ids == argmax[layout.target_row_of_draft])
    return VerifyOutput(num_accepted=num_accepted, next_token_ids=argmax[layout.final_target_row(num_accepted)])


def verify(
    target_logits: Tensor,
    draft_token_ids: Tensor,
    cu_num_drafts: Tensor,
    draft_probs: Tensor | None,
    temperatures: Tensor,
    generators: list[torch.Generator],
) -> VerifyOutput:
    """`rejection_sample` with uniforms drawn from each request's own generator (Triton on CUDA:
    kernels/rejection.py, with `rejection_sample` as its twin).

    The uniforms are drawn even for greedy requests, so a request's random stream does not depend on its
    neighbours' temperatures. Temperatures that are all greedy take the argmax-only path (the general one
    computes a softmax and a one-hot per verified row, for nothing). On CUDA, finding that out reads R
    temperatures back to the host: one small sync, where the step syncs right after anyway (it reads the
    accepted counts to commit them), against a softmax over the vocabulary per verified row."""
    accept_u, sample_u = draw_verify_uniforms(generators, cu_num_drafts[1:] - cu_num_drafts[:-1])
    device = target_logits.device
    all_greedy = bool(is_greedy(temperatures).all())
    return dispatch_rejection_sample(
        target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures,
        accept_u.to(device), sample_u.to(device), all_greedy=all_greedy,
    )


def dispatch_rejection_sample(
    target_logits: Tensor,  # [total_drafts + R, vocab]
    draft_token_ids: Tensor,  # [total_drafts] long
    cu_num_drafts: Tensor,  # [R + 1] long
    draft_probs: Tensor | None,  # [total_drafts, vocab] fp32, or None (one-hot drafts)
    temperatures: Tensor,  # [R]
    accept_uniforms: Tensor,  # [total_drafts]
    sample_uniforms: Tensor,  # [R]
    *,
    all_greedy: bool = False,
) -> VerifyOutput:
    """`rejection_sample`, same arguments and result, on the Triton kernels where they run
    (kernels/rejection.py). `all_greedy=True` (the caller knows every temperature is below
    GREEDY_TEMPERATURE) takes the argmax-only kernel or its twin `rejection_sample_greedy`; the general
    paths are exact for greedy rows too."""
    if not use_triton(target_logits.device):
        if all_greedy:
            return rejection_sample_greedy(target_logits, draft_token_ids, cu_num_drafts)
        return rejection_sample(
            target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures, accept_uniforms, sample_uniforms
        )
    from dspark_core.kernels.rejection import rejection_greedy_sample_triton, rejection_sample_triton

    if all_greedy:
        num_accepted, next_ids = rejection_greedy_sample_triton(target_logits, draft_token_ids, cu_num_drafts)
    else:
        num_accepted, next_ids = rejection_sample_triton(
            target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures,
            accept_uniforms, sample_uniforms, residual_eps=RESIDUAL_EPS,
        )
    return VerifyOutput(num_accepted=num_accepted, next_token_ids=next_ids)


def _per_target_row(temperatures: Tensor, num_drafts: Tensor) -> Tensor:
    return torch.repeat_interleave(temperatures, num_drafts + 1)


def synthetic_unconditional_rates(conditional_rates: Sequence[float], num_drafts: int) -> list[float]:
    """The law of `synthetic_verifier` as per-position *unconditional* rates a_k = Π_{j ≤ k} c_j, k = 1 … γ
    (positions past the list repeat its last rate): P(drafts 1 … k all accepted), the form vLLM's
    `speculative_config.synthetic_acceptance_rates` takes (length γ, non-increasing by construction)."""
    rates = [float(r) for r in conditional_rates]
    out, survival = [], 1.0
    for k in range(num_drafts):
        survival *= rates[min(k, len(rates) - 1)]
        out.append(survival)
    return out


def synthetic_verifier(conditional_rates: Sequence[float]):
    """A verifier that accepts by a given law instead of by the target: NOT lossless, for engine speed only.

    Draft k of a request (1-indexed) is accepted with probability `conditional_rates[k − 1]` given that
    drafts 1 … k−1 were (positions past the list use its last rate), decided by the same per-request
    uniforms `verify` draws (`draw_verify_uniforms`, one stream per request, so the law holds whatever the
    batch); the token after the accepted drafts is the target's own (its argmax when greedy, else a sample
    from p_t with the request's sampling uniform). The emitted text is therefore the drafts' up to the
    synthetic cut: what this measures is the engine's throughput at a fixed acceptance, the vLLM
    `synthetic_acceptance_rates` idea, apart from the drafter's quality. A separate function, not a flag
    of `verify`, so the lossless path carries no switch that could leak into a real run.

    Returns a callable with `verify`'s signature (`dspark_core.generate.speculative_step(verifier=…)`).
    """
    rates = [float(r) for r in conditional_rates]
    if not rates or any(not 0.0 <= r <= 1.0 for r in rates):
        raise ValueError(f"conditional acceptance rates must be a non-empty list in [0, 1], got {rates}")

    def verify_synthetic(target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures, generators):
        accept_u, sample_u = draw_verify_uniforms(generators, cu_num_drafts[1:] - cu_num_drafts[:-1])
        device = target_logits.device
        layout = _Layout.of(cu_num_drafts, draft_token_ids.numel())
        law = torch.tensor(rates, dtype=torch.float64, device=device)
        rate = law[layout.local_pos.clamp(max=len(rates) - 1)]  # [total_drafts]
        num_accepted = layout.num_accepted(accept_u.to(device).double() < rate)
        final_logits = target_logits[layout.final_target_row(num_accepted)]  # [R, vocab]
        probs = logits_to_probs(final_logits, temperatures)
        return VerifyOutput(num_accepted=num_accepted, next_token_ids=sample_from_probs(probs, sample_u.to(device)))

    return verify_synthetic
