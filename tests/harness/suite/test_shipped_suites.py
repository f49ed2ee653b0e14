"""The suites in suites/ load, expand within their budgets, and round-trip through their resolved text."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from harness.suite import SuiteError, check_paths, expand, load_suite, parse_suite_text

SUITES = Path(__file__).resolve().parents[3] / "suites"
CPU_CELL_BUDGET = 150  # ≈ 15 min on 2 cores at 1–4 s a cell, with margin


@pytest.mark.parametrize("name", ["cpu", "ci", "h100"])
def test_shipped_suite_loads_expands_and_round_trips(name):
    suite = load_suite(SUITES / f"{name}.yaml")
    cells = expand(suite)
    print(f"{name}: {len(cells)} cells, hash {suite.hash[:12]}")
    again = parse_suite_text(suite.resolved_text)
    assert again.hash == suite.hash and [c.cell_id for c in expand(again)] == [c.cell_id for c in cells]
    assert suite.gates and {g.metric for g in suite.gates} >= {"acceptance_length", "ece_calibrated", "speedup"}
    for cell in cells:
        assert (cell.concurrency is None) != (cell.rate is None)
        assert cell.is_plain == (cell.num_drafts == 0)


def test_cpu_suite_fits_its_budget():
    suite = load_suite(SUITES / "cpu.yaml")
    cells = expand(suite)
    print(f"cpu.yaml: {len(cells)} cells; by method {dict(Counter(c.drafter.method for c in cells))}")
    assert len(cells) <= CPU_CELL_BUDGET
    assert {c.drafter.method for c in cells} >= {"none", "dspark", "dflash", "ngram"}
    assert {c.task.name for c in cells} == {"gsm8k", "humaneval", "mt_bench"}
    assert {c.num_drafts for c in cells} == {0, 1, 3, 7} and {c.concurrency for c in cells} == {1, 4, 16}
    assert {c.policy.name for c in cells} == {"full", "scheduler", "adaptive", "static", "threshold"}
    assert {c.backend for c in cells} == {"inhouse"} and {c.target.path for c in cells} == {"embedded"}
    assert max(c.task.n_samples for c in cells) <= 16 and max(c.task.max_new_tokens for c in cells) <= 64
    check_paths(suite)


def test_ci_suite_is_small_and_strict():
    suite = load_suite(SUITES / "ci.yaml")
    cells = expand(suite)
    assert 6 <= len(cells) <= 10
    levels = {g.metric: g.level for g in suite.gates}
    assert levels["acceptance_length"] == levels["ece_calibrated"] == "fail" and levels["speedup"] == "warn"
    assert suite.validity.min_requests >= 1
    check_paths(suite)


def test_h100_suite_uses_hub_ids():
    suite = load_suite(SUITES / "h100.yaml")
    cells = expand(suite)
    assert {c.backend for c in cells} == {"vllm", "sglang", "inhouse"}
    assert {c.target.path for c in cells} == {"Qwen/Qwen3-8B"} and {c.target.dtype for c in cells} == {"bfloat16"}
    assert {c.concurrency for c in cells} == {1, 8, 32, 64} and {c.num_drafts for c in cells} == {0, 3, 7, 15}
    assert all(80 <= c.task.n_samples <= 200 and 512 <= c.task.max_new_tokens <= 1024 for c in cells)
    check_paths(suite)  # hub ids are not checked


def test_common_is_a_fragment():
    with pytest.raises(SuiteError, match="no matrix: this file defines no cells, so it is a fragment"):
        load_suite(SUITES / "common.yaml")


def test_the_smollm2_suite_shows_every_drafter_and_policy_at_low_and_high_load():
    """What the README's main job on the real target promises (issue 16): plain, DSpark with each policy,
    DFlash, Eagle3-style and n-gram; GSM8K, HumanEval and MT-Bench; concurrency 1 and 16."""
    cells = expand(load_suite(SUITES / "smollm2.yaml"))
    assert {c.target.path for c in cells} == {"smollm2-135m"} and {c.backend for c in cells} == {"inhouse"}
    assert {c.drafter.method for c in cells} == {"none", "dspark", "dflash", "eagle3", "ngram"}
    assert {c.policy.name for c in cells if c.drafter.method == "dspark"} == {
        "full", "static", "threshold", "scheduler", "adaptive"}
    assert {c.task.name for c in cells} == {"gsm8k", "humaneval", "mt_bench"} and {c.concurrency for c in cells} == {1, 16}
    for concurrency in (1, 16):
        assert {c.drafter.method for c in cells if c.concurrency == concurrency} == {
            "none", "dspark", "dflash", "eagle3", "ngram"}
    assert all(c.task.n_samples >= c.concurrency for c in cells)  # the burst reaches its concurrency
    # the cost-aware policy on every task at concurrency 1: whether it holds plain decoding where γ 7 loses
    assert {c.task.name for c in cells if c.policy.name == "adaptive" and c.concurrency == 1} == {
        "gsm8k", "humaneval", "mt_bench"}
