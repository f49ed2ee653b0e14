"""Metrics from a server's own counters, for servers that report no per-request steps (vLLM's Prometheus).

The same definitions as `acceptance.py` (τ = 1 + accepted ÷ drafting steps, vLLM's `1 + accepted_tokens /
drafts`), written over server-wide sums instead of per-request tuples; the raw counts are
`contracts.records.SpecCounts` (a difference of two scrapes around the measured phase) and `ServerTTFT`.
Per-position acceptance from counters assumes every drafting step verified all γ positions (vLLM's
fixed γ); it is reported only when the counters show that (draft tokens = γ × drafts). The counters are
server-wide: any other client's traffic in the window is counted too.
"""

from __future__ import annotations

from contracts.metric import Metric, ratio
from contracts.records import ServerTTFT, SpecCounts


def spec_count_metrics(counts: SpecCounts, num_drafts: int) -> dict[str, Metric]:
    """The acceptance metrics of `summarise` that these counts determine; positions up to `num_drafts` (γ)."""
    drafts = counts.drafts
    out = {
        "acceptance_length": Metric(1 + counts.accepted / drafts if drafts else None, "tokens/step", drafts),
        "accepted_per_step": ratio(counts.accepted, drafts, "drafts/step"),
        "verified_per_step": ratio(counts.draft_tokens, drafts, "drafts/step"),
        "draft_acceptance_rate": ratio(counts.accepted, counts.draft_tokens, "fraction"),
        "wasted_verification_fraction": ratio(counts.draft_tokens - counts.accepted, counts.draft_tokens, "fraction"),
    }
    if counts.steps is not None:  # every step, drafting or not (our server's counter)
        out["draft_coverage"] = ratio(drafts, counts.steps, "fraction")
        out["tokens_per_target_forward"] = ratio(counts.accepted + counts.steps, counts.steps, "tokens/step")
    if num_drafts > 0 and counts.drafts > 0 and counts.draft_tokens == num_drafts * counts.drafts:
        per_pos = tuple(counts.accepted_per_pos) + (0,) * max(0, num_drafts - len(counts.accepted_per_pos))
        for k in range(1, num_drafts + 1):
            out[f"position_acceptance_unconditional_k{k}"] = ratio(per_pos[k - 1], counts.drafts, "fraction")
        for k in range(1, num_drafts + 1):
            below = per_pos[k - 2] if k > 1 else counts.drafts
            out[f"position_acceptance_conditional_k{k}"] = ratio(per_pos[k - 1], below, "fraction")
    return out


def ttft_server_mean(ttft: ServerTTFT) -> Metric:
    """`ttft_server_mean`: Σ server TTFT ÷ requests it timed (server-wide, like the spec counters)."""
    return ratio(ttft.sum_s, ttft.count, "s")

# Comparability (harness.metrics.dependencies): the acceptance names are declared by acceptance.py;
# `ttft_server_mean` is declared by no module, so it is HARDWARE, as timing is.
