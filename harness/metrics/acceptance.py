"""Acceptance metrics over request steps: τ, per-position acceptance, verified and wasted drafts.

Population: every verify step of every succeeded request given (callers pass the window's requests).
A step is one (v, a) pair: v drafts verified, a accepted, a + 1 tokens emitted. SQL names the view of
those steps `ok_steps(request_id, step, num_drafts, num_verified, num_accepted)` (package docstring).

All step metrics are step-weighted — sums over all steps of all requests, then one division — never a
mean of per-request ratios: a 3-step request must not weigh as much as a 300-step one, and only the
step-weighted τ satisfies tokens = τ × steps, so it multiplies with steps/s into tokens/s. It is also
what vLLM reports (1 + accepted drafts / verify steps) and what pools across runs by adding counts.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from harness.metrics.metric import Metric, ratio
from harness.metrics.records import RequestRecord
from harness.metrics.dependencies import CONTENT


def _steps(records: Sequence[RequestRecord]) -> Iterator[tuple[int, int]]:
    for r in records:
        if not r.failed:
            yield from zip(r.num_verified, r.num_accepted)


def acceptance_length(records: Sequence[RequestRecord]) -> Metric:
    """τ: tokens emitted per verify step, bonus/recovered token included (1 … γ+1; plain decoding: 1).

    τ = Σ(a + 1) / #steps. Counts what verification produced: a stop token in the middle of an accepted
    run truncates the output but not τ (as in vLLM), so Σ output tokens can be below 1 + τ·steps.

    SQL: `sum(num_accepted + 1) / count(*) FROM ok_steps`.
    """
    steps = list(_steps(records))
    return ratio(sum(a + 1 for _, a in steps), len(steps), "tokens/step")


def accepted_per_step(records: Sequence[RequestRecord]) -> Metric:
    """τ − 1: accepted draft tokens per verify step (0 … γ).

    SQL: `sum(num_accepted) / count(*) FROM ok_steps`.
    """
    steps = list(_steps(records))
    return ratio(sum(a for _, a in steps), len(steps), "drafts/step")


def verified_per_step(records: Sequence[RequestRecord]) -> Metric:
    """Draft tokens verified per request step (0 … γ); the target sees one more (the anchor).

    SQL: `sum(num_verified) / count(*) FROM ok_steps`.
    """
    steps = list(_steps(records))
    return ratio(sum(v for v, _ in steps), len(steps), "drafts/step")


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
)}
