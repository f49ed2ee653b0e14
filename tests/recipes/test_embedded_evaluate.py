"""The embedded recipe's evaluation reads τ and α from harness.metrics, the one definition."""

from __future__ import annotations


def test_the_embedded_evaluation_uses_the_one_acceptance_definition():
    """τ = 1 + accepted ÷ drafting steps: a step that drafted nothing is no part of it (as on every backend)."""
    from dspark_core.generate import GenerationResult, RequestCounters
    from recipes.embedded.evaluate import summarise

    counters = RequestCounters(num_drafts=3, num_verified=[3, 0, 3, 0], num_accepted=[2, 0, 1, 0])
    result = GenerationResult(prompt_ids=[1], output_ids=list(range(7)), finish_reason="length", counters=counters)
    m = summarise("gsm8k", "ngram", 3, 0.0, [result], wall_s=1.0)
    assert m.acceptance_length == 1 + 3 / 2  # not (3 + 4) / 4, the tokens per verify step
    assert m.first_position_acceptance == 1.0 and m.num_steps == 4
