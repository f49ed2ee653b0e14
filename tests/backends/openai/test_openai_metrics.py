"""Prometheus parsing and spec-decode counter deltas; the per-request spec extension."""

from __future__ import annotations

import pytest

from backends.openai.metrics import parse_prometheus, per_request_confidences, per_request_steps, spec_counts_from_text
from contracts.records import SpecCounts
from harness.metrics.server_counts import spec_count_metrics
from harness.metrics import RequestRecord, summarise
from harness.metrics.window import MeasurementWindow

VLLM_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen3-8B"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="Qwen/Qwen3-8B"} 5.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 45.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="0"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="1"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="2"} 6.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7e9
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0 1700000000000
"""


def test_parse_labels_escapes_comments_and_special_values():
    text = ('# TYPE x counter\nx{a="1",b="q\\"uote\\\\ \\nline"} 2.5\ny 3e2\nz{a="1"} NaN\nw +Inf\nbad line here\n'
            'v{} 1 1700000000\n')
    samples = parse_prometheus(text)
    assert samples[("x", (("a", "1"), ("b", 'q"uote\\ \nline')))] == 2.5
    assert samples[("y", ())] == 300.0 and samples[("w", ())] == float("inf") and samples[("v", ())] == 1.0
    assert ("z", (("a", "1"),)) in samples and len(samples) == 5


def test_vllm_counters_sum_over_engines_and_subtract():
    after = spec_counts_from_text(VLLM_TEXT)
    assert after == SpecCounts(15, 45, 30, (14, 10, 6), None)
    before = SpecCounts(5, 15, 10, (4, 3), None)
    delta = after - before
    assert delta == SpecCounts(10, 30, 20, (10, 7, 6), None)
    assert spec_counts_from_text("# nothing\nvllm:num_requests_running 1\n") is None


def test_counter_metrics_follow_vllm_conventions():
    counts = SpecCounts(drafts=10, draft_tokens=30, accepted=20, accepted_per_pos=(9, 7, 4))
    m = spec_count_metrics(counts, 3)
    assert m["acceptance_length"].value == pytest.approx(3.0) and m["acceptance_length"].n == 10
    assert m["draft_acceptance_rate"].value == pytest.approx(20 / 30)
    assert [m[f"position_acceptance_unconditional_k{k}"].value for k in (1, 2, 3)] == pytest.approx([0.9, 0.7, 0.4])
    assert [m[f"position_acceptance_conditional_k{k}"].value for k in (1, 2, 3)] == pytest.approx([0.9, 7 / 9, 4 / 7])
    assert "draft_coverage" not in m and "tokens_per_target_forward" not in m  # vLLM counts drafting steps only
    # verify lengths that vary: no per-position numbers; τ over drafting steps still, and the steps counter
    # (our server) adds coverage and tokens per target forward over every step
    varied = SpecCounts(drafts=10, draft_tokens=25, accepted=20, accepted_per_pos=(9, 7, 4), steps=12)
    m = spec_count_metrics(varied, 3)
    assert "position_acceptance_unconditional_k1" not in m and m["acceptance_length"].value == pytest.approx(3.0)
    assert m["draft_coverage"].value == pytest.approx(10 / 12)
    assert m["tokens_per_target_forward"].value == pytest.approx(32 / 12)


def _record(rid, verified, accepted, gamma=3):
    n = sum(accepted) + len(accepted) + 1
    return RequestRecord(rid, 4, n, 0.0, 0.5, 1.0, num_drafts=gamma, num_verified=verified, num_accepted=accepted)


def test_counts_from_records_agree_with_the_harness_metrics():
    records = [_record("a", (3, 3, 0), (3, 1, 0)), _record("b", (3, 2), (0, 2))]
    counts = SpecCounts.from_records(records)
    assert counts == SpecCounts(drafts=4, draft_tokens=11, accepted=6, accepted_per_pos=(3, 2, 1), steps=5)
    harness = summarise(records, [], MeasurementWindow(0.0, 2.0))
    mine = spec_count_metrics(counts, 3)
    for name in ("acceptance_length", "accepted_per_step", "verified_per_step", "draft_acceptance_rate",
                 "draft_coverage", "tokens_per_target_forward"):
        assert mine[name].value == pytest.approx(harness[name].value), name


def test_per_request_steps_from_usage():
    usage = {"spec_num_drafts": 3, "spec_verify_ct": 2, "spec_verified_per_step": [3, 1], "spec_accepted_per_step": [2, 1]}
    assert per_request_steps(usage, 3) == (3, (3, 1), (2, 1))
    assert per_request_steps({"spec_accepted_per_step": [1, 0]}, 2) == (2, (2, 2), (1, 0))  # verified: γ each step
    assert per_request_steps({"completion_tokens": 4}, 3) is None
    assert per_request_steps(usage | {"spec_verify_ct": 3}, 3) is None  # inconsistent
    assert per_request_steps(usage | {"spec_accepted_per_step": [2, 2]}, 3) is None  # accepted > verified


def test_per_request_confidences_must_match_the_verified_shape():
    usage = {"spec_confidence_logits_per_step": [[0.5, -1.0, 2], [1.5]]}
    assert per_request_confidences(usage, (3, 1)) == ((0.5, -1.0, 2.0), (1.5,))
    assert per_request_confidences(usage, (3, 2)) == ()  # a step with another count
    assert per_request_confidences(usage, (3,)) == ()  # another number of steps
    assert per_request_confidences({"spec_confidence_logits_per_step": [["x"]]}, (1,)) == ()
    assert per_request_confidences({"spec_confidence_logits_per_step": [[True]]}, (1,)) == ()
    assert per_request_confidences({}, (1,)) == ()
