"""Acceptance metrics over request steps: τ, draft coverage, tokens per forward, verified and wasted drafts.

Population: every verify step of every succeeded request given (callers pass the window's requests).
A step is one (v, a) pair: v drafts verified, a accepted, a + 1 tokens emitted. SQL names the view of
those steps `ok_steps(request_id, step, num_drafts, num_verified, num_accepted)` and the requests
`ok(…, output_tokens, finish_reason, all_steps)` (package docstring).

**One acceptance definition on every engine** (vLLM's and AIPerf's convention): a *drafting step* is a
verify step that verified ≥ 1 draft; steps that drafted nothing (an n-gram drafter without a match, a
policy that chose not to draft, plain decoding) are stored too, with v = 0, but are no part of τ:

    acceptance_length τ = 1 + Σ accepted / #drafting steps

vLLM reports its drafting steps only (`num_drafts` in its counters and per-request metrics); counting
steps that drafted nothing would make τ a mix of drafter quality and how often it drafted (n-gram γ 3
read 1.58 that way against vLLM's 2.70 on identical outputs). How often drafts were made is its own
metric, `draft_coverage` (drafting ÷ all steps), and what a target forward yields over every step is
`tokens_per_target_forward` (Σ(a + 1) ÷ all steps = τ·coverage + (1 − coverage)); both need every step,
so they leave out requests whose backend reports drafting steps only (`RequestRecord.all_steps`).

The token budget: both engines verify γ drafts up to a request's last step and cut the emission to the
budget (`dspark_core.generate`: the in-house engine once capped drafts at the tokens left, which made
210 verified drafts where vLLM made 216 on the same outputs). So τ counts drafts accepted past the
budget, as vLLM's does; `budget_cut_tokens` is how many tokens verification produced that the budget
then cut (requests that finished by length), so a reader can tell how much of τ the budget never
delivered.

All step metrics are step-weighted — sums over all steps of all requests, then one division — never a
mean of per-request ratios: a 3-step request must not weigh as much as a 300-step one, and only the
step-weighted ratio pools across runs by adding counts.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from contracts.metric import Metric, ratio
from contracts.records import RequestRecord
from harness.metrics.dependencies import CONTENT


def _steps(records: Sequence[RequestRecord]) -> Iterator[tuple[int, int]]:
    for r in records:
        if not r.failed:
            yield from zip(r.num_verified, r.num_accepted)


def _drafting(records: Sequence[RequestRecord]) -> list[tuple[int, int]]:
    return [(v, a) for v, a in _steps(records) if v > 0]


def _all_steps(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if not r.failed and r.all_steps]


def acceptance_length(records: Sequence[RequestRecord]) -> Metric:
    """τ: tokens emitted per drafting step, bonus/recovered token included (1 … γ+1); None without one
    (plain decoding). τ = 1 + Σa / #drafting steps (module docstring: vLLM's convention, on every engine).

    Counts what verification produced: a stop token or the token budget in the middle of an accepted
    run truncates the output but not τ (as in vLLM).

    SQL: `1 + sum(num_accepted) / count_if(num_verified > 0) FROM ok_steps`.
    """
    steps = _drafting(records)
    accepted = sum(a for _, a in steps)
    return Metric(1 + accepted / len(steps) if steps else None, "tokens/step", len(steps))


def accepted_per_step(records: Sequence[RequestRecord]) -> Metric:
    """τ − 1: accepted draft tokens per drafting step (0 … γ).

    SQL: `sum(num_accepted) / count_if(num_verified > 0) FROM ok_steps`.
    """
    steps = _drafting(records)
    return ratio(sum(a for _, a in steps), len(steps), "drafts/step")


def verified_per_step(records: Sequence[RequestRecord]) -> Metric:
    """Draft tokens verified per drafting step (1 … γ); the target sees one more (the anchor).

    SQL: `sum(num_verified) / count_if(num_verified > 0) FROM ok_steps`.
    """
    steps = _drafting(records)
    return ratio(sum(v for v, _ in steps), len(steps), "drafts/step")


def draft_coverage(records: Sequence[RequestRecord]) -> Metric:
    """Share of verify steps that drafted (verified ≥ 1 draft), over requests that report every step.

    SQL: `count_if(num_verified > 0) / count(*) FROM ok_steps JOIN ok USING (request_id) WHERE all_steps`.
    """
    steps = list(_steps(_all_steps(records)))
    return ratio(sum(v > 0 for v, _ in steps), len(steps), "fraction")


def tokens_per_target_forward(records: Sequence[RequestRecord]) -> Metric:
    """Tokens emitted per verify step, drafting or not (1 … γ+1), over requests that report every step:
    what one target forward yields for a request. Σ(a + 1) / #steps.

    SQL: `sum(num_accepted + 1) / count(*) FROM ok_steps JOIN ok USING (request_id) WHERE all_steps`.
    """
    steps = list(_steps(_all_steps(records)))
    return ratio(sum(a + 1 for _, a in steps), len(steps), "tokens/step")


def budget_cut_tokens(records: Sequence[RequestRecord]) -> Metric:
    """Tokens verification produced past the token budget, which the budget cut: over succeeded requests
    that finished by length and report every step, Σ(1 + Σ(a + 1) − output_tokens) (1: the prefill
    token); n = those requests. 0 where the budget never cut an accepted run.

    SQL: `sum(1 + steps_emitted - output_tokens) FROM ok JOIN (SELECT request_id, sum(num_accepted + 1)
    AS steps_emitted FROM ok_steps GROUP BY request_id) WHERE finish_reason = 'length' AND all_steps`.
    """
    cut = [r for r in _all_steps(records) if r.finish_reason == "length" and r.num_verified]
    total = sum(1 + sum(a + 1 for a in r.num_accepted) - r.output_tokens for r in cut)
    return Metric(float(total), "tokens", len(cut))


def draft_acceptance_rate(records: Sequence[RequestRecord]) -> Metric:
    """Accepted ÷ verified drafts (the "78.9% acceptance" of the paper); n = verified drafts.

    SQL: `sum(num_accepted) / sum(num_verified) FROM ok_steps`.
    """
    steps = list(_steps(records))
    return ratio(sum(a for _, a in steps), sum(v for v, _ in steps), "fraction")


def wasted_verification_fraction(records: Sequence[RequestRecord]) -> Metric:
    """Verified drafts that bought nothing — the rejected one and every draft verified after it — ÷
    verified drafts: Σ(v − a) / Σ v = 1 − draft acceptance rate. Target compute spent on them is lost.

    SQL: `sum(num_verified - num_accepted) / sum(num_verified) FROM ok_steps`.
    """
    steps = list(_steps(records))
    return ratio(sum(v - a for v, a in steps), sum(v for v, _ in steps), "fraction")


def _gamma(records: Sequence[RequestRecord]) -> int:
    return max((r.num_drafts for r in records if not r.failed), default=0)


def position_acceptance_unconditional(records: Sequence[RequestRecord]) -> list[Metric]:
    """α_k for draft positions k = 1 … γ: steps that accepted ≥ k drafts ÷ steps that verified ≥ k.

    The denominator is the steps where position k was *verified*, not all steps: when verify lengths
    vary (a confidence scheduler, the end-of-request token budget, an n-gram drafter finding fewer
    than γ drafts) an unverified position has no outcome, and dividing by all steps would count the
    scheduler's choices as drafter rejections and move α_k with the load. The price: a scheduler verifies
    position k mostly when confidence is high, so under it α_k is the acceptance *of what was verified*.
    Compare drafters at a fixed verify length (no scheduler), where v = γ on every step, the denominator
    is all steps (DSPARK.md: "÷ cycles") and α_k = Π_{i≤k} β_i of the conditional form below.

    SQL: `count_if(num_accepted >= k) / count_if(num_verified >= k) FROM ok_steps, range(1, γ + 1) t(k) GROUP BY k`.
    """
    steps = list(_steps(records))
    return [
        ratio(sum(a >= k for _, a in steps), sum(v >= k for v, _ in steps), "fraction")
        for k in range(1, _gamma(records) + 1)
    ]


def position_acceptance_conditional(records: Sequence[RequestRecord]) -> list[Metric]:
    """β_k for k = 1 … γ: P(draft k accepted | drafts 1 … k−1 accepted and draft k verified)
    = steps that accepted ≥ k ÷ steps that accepted ≥ k−1 and verified ≥ k. β_1 = α_1.

    This is the quantity the confidence head predicts (σ(c_k)) and the one that shows where a drafter
    decays along the block independently of earlier positions.

    SQL: `count_if(num_accepted >= k) / count_if(num_accepted >= k - 1 AND num_verified >= k)
    FROM ok_steps, range(1, γ + 1) t(k) GROUP BY k`.
    """
    steps = list(_steps(records))
    return [
        ratio(sum(a >= k for _, a in steps), sum(a >= k - 1 and v >= k for v, a in steps), "fraction")
        for k in range(1, _gamma(records) + 1)
    ]


# Comparability (harness.metrics.dependencies): counts of accepted drafts are functions of the checkpoints,
# data, prompt format, dtype and numeric code, not of the machine's speed.
DEPENDS_ON = {name: CONTENT for name in (
    "acceptance_length", "accepted_per_step", "verified_per_step", "draft_acceptance_rate",
    "wasted_verification_fraction", "position_acceptance_unconditional", "position_acceptance_conditional",
    "draft_coverage", "tokens_per_target_forward", "budget_cut_tokens",
)}
