"""harness.metrics: every derived metric on hand-built records, the arithmetic written beside it, plus a
round trip from the counters of a real tiny `generate(...)` run."""

from __future__ import annotations

import dataclasses

import math

import numpy as np
import pytest
import torch

from harness.metrics import (
    SLA,
    MeasurementWindow,
    Metric,
    MetricSet,
    RequestRecord,
    StepRecord,
    acceptance_length,
    budget_cut_tokens,
    draft_coverage,
    tokens_per_target_forward,
    accepted_per_step,
    calibration_metrics,
    confidence_table,
    draft_acceptance_rate,
    emission_events,
    failed_request_rate,
    goodput,
    meets,
    itl_samples,
    percentile,
    position_acceptance_conditional,
    position_acceptance_unconditional,
    requests_in,
    sla_attainment,
    steps_in,
    summarise,
    throughput,
    tpot,
    ttft,
    user_speed,
    verified_per_step,
    wasted_verification_fraction,
)
from harness.metrics.confidence import reliability_bins


def req(rid="r", *, arrival=0.0, first=1.0, finish=2.0, out=2, times=(), gamma=3, verified=(), accepted=(),
        conf=(), error=None, prompt=4) -> RequestRecord:
    return RequestRecord(
        request_id=rid, prompt_tokens=prompt, output_tokens=out, arrival_s=arrival, first_token_s=first,
        finish_s=finish, token_times_s=times, num_drafts=gamma, num_verified=verified, num_accepted=accepted,
        confidence_logits=conf, finish_reason="error" if error else "length", error=error,
    )


def values(metrics: list[Metric]) -> list[float | None]:
    return [m.value for m in metrics]


# Steps (v, a) of two γ=3 requests: A verifies 3 drafts three times, B verifies 2 once.
A = req("a", out=8, verified=(3, 3, 3), accepted=(3, 1, 0))  # emits 4 + 2 + 1 = 7 after the first token
B = req("b", out=4, verified=(2,), accepted=(2,))  # emits 3


def test_acceptance_length_is_step_weighted_and_counts_the_bonus():
    # τ = 1 + Σa / drafting steps = 1 + 6 / 4 = 2.5; request-averaged would be (7/3 + 3/1) / 2 = 2.67.
    assert acceptance_length([A, B]) == Metric(2.5, "tokens/step", 4)
    assert tokens_per_target_forward([A, B]).value == 2.5 and draft_coverage([A, B]).value == 1.0
    # τ − 1 = (3 + 1 + 0 + 2) / 4 = 1.5
    assert accepted_per_step([A, B]).value == 1.5
    # verified drafts per step = (3 + 3 + 3 + 2) / 4 = 2.75
    assert verified_per_step([A, B]).value == 2.75
    # accepted ÷ verified = 6 / 11; wasted = (0 + 2 + 3 + 0) / 11 = 5 / 11 (rejected or after a rejection)
    assert draft_acceptance_rate([A, B]) == Metric(6 / 11, "fraction", 11)
    assert wasted_verification_fraction([A, B]) == Metric(5 / 11, "fraction", 11)


def test_plain_decoding_has_no_tau_and_no_positions():
    plain = req(out=4, gamma=0, verified=(0, 0, 0), accepted=(0, 0, 0))
    assert acceptance_length([plain]) == Metric(None, "tokens/step", 0)  # no drafting step: undefined, as in vLLM
    assert tokens_per_target_forward([plain]).value == 1.0 and draft_coverage([plain]).value == 0.0
    assert wasted_verification_fraction([plain]) == Metric(None, "fraction", 0)
    assert position_acceptance_unconditional([plain]) == []


def test_acceptance_length_counts_drafting_steps_only():
    """The issue's n-gram cell: 174 steps, 65 of them drafted, 108 drafts accepted. τ over drafting steps
    (vLLM's convention) is 1 + 108/65; over all steps it was (108 + 174)/174 = 1.62, now
    tokens_per_target_forward; draft coverage 65/174."""
    steps = [(3, 2)] * 43 + [(3, 1)] * 22 + [(0, 0)] * 109
    rec = req(out=1 + 108 + 174, verified=[v for v, _ in steps], accepted=[a for _, a in steps])
    assert acceptance_length([rec]) == Metric(1 + 108 / 65, "tokens/step", 65)
    assert accepted_per_step([rec]).value == pytest.approx(108 / 65)
    assert verified_per_step([rec]).value == 3.0
    assert tokens_per_target_forward([rec]) == Metric((108 + 174) / 174, "tokens/step", 174)
    assert draft_coverage([rec]) == Metric(65 / 174, "fraction", 174)
    # a backend that reports drafting steps only (vLLM): same τ, no all-step metrics
    vllm = dataclasses.replace(rec, num_verified=(3,) * 65, num_accepted=tuple(a for v, a in steps if v), all_steps=False)
    assert acceptance_length([vllm]) == acceptance_length([rec])
    assert tokens_per_target_forward([vllm]).value is None and draft_coverage([vllm]).value is None
    assert budget_cut_tokens([vllm]) == Metric(0.0, "tokens", 0)


def test_budget_cut_tokens_counts_what_the_budget_dropped():
    # 1 + (4 + 2 + 1) = 8 tokens produced, the budget took 6: 2 cut; a stopped request cuts nothing here
    cut = req(out=6, verified=(3, 3, 3), accepted=(3, 1, 0))
    stopped = dataclasses.replace(req("s", out=4, verified=(2,), accepted=(2,)), finish_reason="stop")
    assert budget_cut_tokens([cut, stopped, B]) == Metric(2.0, "tokens", 2)


def test_per_position_forms_differ_when_verify_lengths_vary():
    # steps (v, a): (3,3) (3,1) (3,0) (2,2)
    # unconditional α_k = #(a >= k) / #(v >= k):  k=1: 3/4   k=2: 2/4   k=3: 1/3 ((2,2) did not verify 3)
    # conditional   β_k = #(a >= k) / #(a >= k-1, v >= k): k=1: 3/4  k=2: 2/3 ((3,0) never reached 2)
    #                                                      k=3: 1/1 (only (3,3) reached and verified 3)
    assert values(position_acceptance_unconditional([A, B])) == [3 / 4, 2 / 4, 1 / 3]
    assert [m.n for m in position_acceptance_unconditional([A, B])] == [4, 4, 3]
    assert values(position_acceptance_conditional([A, B])) == [3 / 4, 2 / 3, 1.0]
    assert [m.n for m in position_acceptance_conditional([A, B])] == [4, 3, 1]


def test_fixed_verify_length_unconditional_is_product_of_conditionals():
    r = req(out=9, verified=(3, 3, 3, 3), accepted=(3, 1, 0, 2))
    # α_3 = 1/4; β = 3/4, 2/3, 1/2 (of (3,3),(3,2) that reached 3, one accepted) → product 1/4
    alpha = values(position_acceptance_unconditional([r]))
    beta = values(position_acceptance_conditional([r]))
    assert beta == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    for k in range(3):
        assert alpha[k] == pytest.approx(math.prod(beta[: k + 1]))


def test_record_histogram_and_position_counts():
    assert A.accepted_histogram == (1, 1, 0, 1)
    assert A.num_steps == 3 and A.num_drafted == 9 and A.num_accepted_drafts == 4
    assert A.position_counts() == ((3, 3, 3), (2, 1, 1))


def test_record_rejects_inconsistent_counters():
    with pytest.raises(ValueError, match="accepted <= verified"):
        req(verified=(1,), accepted=(2,))
    with pytest.raises(ValueError, match="one confidence logit per verified draft"):
        req(verified=(2,), accepted=(1,), conf=((0.1,),))
    with pytest.raises(ValueError, match="one time per output token"):
        req(out=3, times=(1.0, 2.0))
    with pytest.raises(ValueError, match="needs a first token"):
        req(first=None)


# One request whose 7 tokens arrive in 4 emission events: 1 (prefill), then 3, 2 and 1 per step.
STREAM = req(arrival=0.5, first=1.0, finish=3.0, out=7, times=(1.0, 1.5, 1.5, 1.5, 2.0, 2.0, 3.0))


def test_ttft_tpot_user_speed():
    assert ttft(STREAM) == 0.5  # 1.0 − 0.5
    assert tpot(STREAM) == pytest.approx(1 / 3)  # (3.0 − 1.0) / (7 − 1)
    assert user_speed(STREAM) == pytest.approx(3.0)  # (7 − 1) / (3.0 − 1.0): TTFT and its token left out
    one = req(out=1, first=1.0, finish=1.0)
    assert tpot(one) is None and user_speed(one) is None and ttft(one) == 1.0


def test_itl_with_multi_token_emissions():
    assert emission_events(STREAM) == [(1.0, 1), (1.5, 3), (2.0, 2), (3.0, 1)]
    # per event: 1.5 − 1.0, 2.0 − 1.5, 3.0 − 2.0
    assert itl_samples([STREAM]) == pytest.approx([0.5, 0.5, 1.0])
    # per token: 0.5, 0, 0, 0.5, 0, 1.0 — its mean 2.0 / 6 is TPOT
    per_token = itl_samples([STREAM], per_token=True)
    assert per_token == pytest.approx([0.5, 0.0, 0.0, 0.5, 0.0, 1.0])
    assert sum(per_token) / len(per_token) == pytest.approx(tpot(STREAM))


def test_percentile_hand_values_and_numpy():
    assert percentile([4, 1, 3, 2], 50) == 2.5  # h = 3·0.5 = 1.5 → 2 + 0.5·(3 − 2)
    assert percentile([4, 1, 3, 2], 90) == pytest.approx(3.7)  # h = 2.7 → 3 + 0.7·(4 − 3)
    assert percentile([], 50) is None
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 101):
        xs = rng.exponential(size=n).tolist()
        for q in (0, 1, 10, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-15)


# Three succeeded requests in a 10 s window.
R1 = req("r1", arrival=0.0, first=0.2, finish=2.2, out=11)  # TTFT 0.2, TPOT 2.0/10 = 0.2, speed 5
R2 = req("r2", arrival=1.0, first=2.0, finish=3.0, out=11)  # TTFT 1.0, TPOT 0.1, speed 10
R3 = req("r3", arrival=2.0, first=2.1, finish=3.1, out=21)  # TTFT 0.1, TPOT 0.05, speed 20
W = MeasurementWindow(0.0, 10.0)


def test_throughput_and_goodput_excluding_an_sla_miss():
    assert throughput([R1, R2, R3], W) == Metric(4.3, "tokens/s", 3)  # (11 + 11 + 21) / 10
    sla = SLA(ttft_s=0.5, tpot_s=0.25)  # R2 misses on TTFT
    assert goodput([R1, R2, R3], W, sla) == Metric(3.2, "tokens/s", 2)  # (11 + 21) / 10
    assert sla_attainment([R1, R2, R3], W, sla).value == pytest.approx(2 / 3)
    strict = SLA(ttft_s=0.5, min_user_tokens_per_s=6.0)  # R1 (5 tok/s) misses too
    assert goodput([R1, R2, R3], W, strict).value == pytest.approx(2.1)  # 21 / 10
    # a one-token request has no decode phase: the TPOT and speed bounds are vacuous, TTFT still applies
    assert meets(strict, req(out=1, arrival=0.0, first=0.1, finish=0.1))
    assert not meets(strict, req(out=1, arrival=0.0, first=0.9, finish=0.9))


def test_window_counts_requests_by_finish_time():
    warm = req("warm", arrival=0.0, first=0.5, finish=4.9, out=5)  # finishes in warm-up: dropped
    straddle = req("straddle", arrival=1.0, first=2.0, finish=6.0, out=7)  # arrived in warm-up: counts whole
    at_start = req("at_start", arrival=4.0, first=4.5, finish=5.0, out=3)  # [start, …: included
    at_end = req("at_end", arrival=8.0, first=9.0, finish=15.0, out=3)  # …, end): excluded
    window = MeasurementWindow(5.0, 15.0)
    assert [r.request_id for r in requests_in([warm, straddle, at_start, at_end], window)] == ["straddle", "at_start"]
    assert throughput([warm, straddle, at_start, at_end], window).value == pytest.approx(1.0)  # (7 + 3) / 10
    # consecutive windows partition the run: at_end lands in the next one
    assert [r.request_id for r in requests_in([at_end], MeasurementWindow(15.0, 20.0))] == ["at_end"]
    steps = [StepRecord(i, t, 1, 0, 0, 0.1) for i, t in enumerate((4.9, 5.0, 14.9, 15.0))]
    assert [s.step for s in steps_in(steps, window)] == [1, 2]
    whole = MeasurementWindow.after_warmup([warm, straddle, at_start, at_end], warmup_s=2.0)
    assert whole.start_s == 2.0 and whole.contains(15.0)  # the last finish counts
    assert len(requests_in([warm, straddle, at_start, at_end], whole)) == 4  # warm finishes after 2.0


def test_failed_requests_only_count_in_the_failed_rate():
    broken = req("x", arrival=0.0, first=None, finish=0.5, out=0, error="OOM")
    partial = req("y", arrival=0.0, first=0.1, finish=9.0, out=3, verified=(3,), accepted=(0,), error="abort")
    outside = req("z", arrival=0.0, first=None, finish=11.0, out=0, error="late")
    records = [R1, R2, broken, partial, outside]
    assert failed_request_rate(records, W) == Metric(0.5, "fraction", 4)  # 2 of the 4 finishing in [0, 10)
    assert throughput(records, W).value == pytest.approx(2.2)  # (11 + 11) / 10: partial's 3 tokens are not output
    assert acceptance_length([partial]) == Metric(None, "tokens/step", 0)
    assert ttft(partial) is None and itl_samples([partial]) == []
    assert sla_attainment(records, W, SLA()).value == 0.5  # failed requests are misses


def test_summarise_long_form_rows_and_speedup():
    spec_a = req("a", arrival=0.0, first=0.5, finish=1.5, out=5, times=(0.5, 1.0, 1.0, 1.5, 1.5),
                 verified=(3, 3), accepted=(1, 1))
    spec_b = req("b", arrival=0.0, first=0.5, finish=2.5, out=5, times=(0.5, 1.5, 1.5, 2.5, 2.5),
                 verified=(3, 3), accepted=(1, 1), error="abort")
    steps = [StepRecord(0, 1.0, 2, 6, 2, 0.5), StepRecord(1, 1.5, 2, 6, 2, 0.5), StepRecord(2, 20.0, 1, 3, 3, 0.5)]
    plain = MetricSet({"throughput": Metric(0.25, "tokens/s", 1), "user_speed_mean": Metric(2.0, "tokens/s", 1)})
    ms = summarise([spec_a, spec_b], steps, MeasurementWindow(0.0, 10.0), sla=SLA(ttft_s=1.0), plain=plain)
    assert isinstance(ms, MetricSet) and ms["acceptance_length"] == Metric(2.0, "tokens/step", 2)  # (2 + 2) / 2
    assert ms.value("throughput") == 0.5  # 5 / 10 (b failed)
    assert ms.value("failed_request_rate") == 0.5
    assert ms.value("user_speed_mean") == 4.0  # (5 − 1) / (1.5 − 0.5)
    assert ms.value("speedup") == 2.0 and ms.value("speedup_user_speed") == 2.0  # 0.5 / 0.25, 4.0 / 2.0
    assert ms.value("goodput") == 0.5 and ms.value("sla_attainment") == 0.5
    assert ms.value("itl_p50") == 0.5 and ms["itl_mean"].n == 2  # events 0.5 → 1.0 → 1.5
    assert ms.value("position_acceptance_conditional_k2") == 0.0  # neither step accepted 2
    assert ms.value("step_verify_tokens_mean") == 8.0 and ms["steps_per_s"].n == 2  # (6 + 2) per step in window
    assert ms.value("ece_raw") is None and "ece_raw" not in ms  # no confidences: left out
    rows = ms.rows()
    assert ("throughput", 0.5, "tokens/s", 1) in rows
    assert all(isinstance(r[0], str) and isinstance(r[3], int) for r in rows)
    empty = summarise([], [], MeasurementWindow(0.0, 1.0))
    assert empty["acceptance_length"] == Metric(None, "tokens/step", 0) and empty.value("ttft_p99") is None


def test_calibration_matches_dspark_core_on_the_padded_table():
    from dspark_core.calibration import expected_calibration_error

    r1 = req("c1", out=6, verified=(3, 2), accepted=(1, 2), conf=((2.0, 0.5, -1.0), (1.5, 0.3)))
    r2 = req("c2", out=3, verified=(1, 0), accepted=(0, 0), conf=((-0.5,), ()))
    conf, verified, accepted = confidence_table([r1, r2])
    assert conf.shape == (4, 3) and verified.tolist() == [3, 2, 1, 0] and accepted.tolist() == [1, 2, 0, 0]
    temps = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    metrics = calibration_metrics([r1, r2], temperatures=temps)
    raw = expected_calibration_error(conf, verified, accepted)
    assert metrics["ece_raw"] == Metric(raw.ece, "fraction", 6)  # observed pairs: 3 + 2 + 1 + 0
    assert metrics["ece_calibrated"].value == pytest.approx(
        expected_calibration_error(conf, verified, accepted, temperatures=temps).ece)
    assert metrics["ece_position_raw_k3"].n == 1 and "ece_raw_k3" not in metrics
    # the stored per-position bins give back the one ECE: Σ|gap| / Σ count over positions and bins
    bins = reliability_bins([r1, r2], temperatures=temps)
    for kind in ("raw", "calibrated"):
        rows = [b for b in bins if b[0] == kind]
        assert all(b[1] >= 1 for b in rows) and sum(b[5] for b in rows) == 6
        assert sum(abs(b[6] - b[7]) for b in rows) / sum(b[5] for b in rows) == pytest.approx(
            metrics[f"ece_{kind}"].value, abs=1e-12)
    # padding sits past num_verified, so whatever fills it changes nothing
    noisy = conf.clone()
    noisy[1, 2], noisy[2, 1:], noisy[3, :] = 9.0, -9.0, 5.0
    assert expected_calibration_error(noisy, verified, accepted).ece == raw.ece


def _record_of(counters, request_id, prompt_ids, output_ids, arrival_s, first_token_s, finish_s, emissions,
               finish_reason="length"):
    """The in-house backend's record of a finished request (`backends.inhouse.run.record_of`)."""
    from backends.inhouse.engine import Completed, Request
    from backends.inhouse.run import record_of

    request = Request(request_id, list(prompt_ids), max_new_tokens=max(1, len(output_ids)))
    return record_of(Completed(request, list(output_ids), finish_reason, counters, arrival_s, first_token_s, finish_s,
                               list(emissions)))


def test_record_of_round_trip_from_a_real_generate_run(qwen3_target):
    from dspark_core.drafters import NgramDrafter, NoDrafter
    from dspark_core.generate import GenerationConfig, generate

    prompts = [[5, 6, 7, 8] * 4, [9, 10, 11] * 5 + [9], [3, 4] * 6]
    config = GenerationConfig(max_new_tokens=16, num_drafts=4)  # no stop tokens: every emission is kept
    for drafter in (NgramDrafter(), NoDrafter()):
        results = generate(qwen3_target, drafter, prompts, config)
        records = []
        for i, res in enumerate(results):
            c = res.counters
            # synthetic clock: first token at 0.1 s, step j's a_j + 1 tokens together at 0.1 + 0.01·(j + 1)
            emissions, left = [], len(res.output_ids)  # the budget cuts the last step's run
            for t, n in [(0.1, 1)] + [(0.1 + 0.01 * (j + 1), a + 1) for j, a in enumerate(c.num_accepted)]:
                emissions.append((t, min(n, left)))
                left -= emissions[-1][1]
            rec = _record_of(c, str(i), res.prompt_ids, res.output_ids, 0.0, 0.1, emissions[-1][0], emissions,
                             res.finish_reason)
            assert emission_events(rec) == emissions
            assert rec.position_counts() == tuple(tuple(x) for x in c.position_counts())
            records.append(rec)
        emitted = sum(len(r.output_ids) - 1 for r in results)  # all but the prefill token came from steps
        num_steps = sum(r.counters.num_steps for r in results)
        produced = sum(a + 1 for r in records for a in r.num_accepted)  # the budget cuts the last step's run
        assert emitted + budget_cut_tokens(records).value == produced
        assert tokens_per_target_forward(records).value == pytest.approx(produced / num_steps)
        assert len(itl_samples(records)) == num_steps  # one emission event per step
        drafting = sum(r.num_drafting_steps for r in records)
        if drafter.name == "none":
            assert acceptance_length(records).value is None and drafting == 0
        else:
            assert sum(r.num_accepted_drafts for r in records) > 0  # multi-token emissions happened
            tau = 1 + sum(r.num_accepted_drafts for r in records) / drafting
            assert acceptance_length(records).value == pytest.approx(tau)
            ms = summarise(records, [], MeasurementWindow.after_warmup(records))
            assert ms.value("acceptance_length") == pytest.approx(tau)
            assert ms.value("draft_coverage") == pytest.approx(drafting / num_steps)


def test_record_of_checks_the_histogram():
    from dspark_core.generate import RequestCounters

    c = RequestCounters(2)
    c.record(2, 1, None)
    c.accepted_histogram[2] += 1  # corrupt
    with pytest.raises(ValueError, match="histogram"):
        _record_of(c, "x", [1], [7, 8, 9], 0.0, 0.1, 0.2, [(0.1, 1), (0.2, 2)])
