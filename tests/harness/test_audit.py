"""`harness audit`: the PIT χ² test has the right size and power, the real in-house backend passes,
and a backend with a classic verification bug (the request's temperature not reaching the verifier)
fails the sampled check even though its greedy output is still exact."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from harness.audit import audit_cell, chi_square_uniform, greedy_check, pit_values
from harness.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

REPO = Path(__file__).resolve().parents[2]


def _draws(probs: torch.Tensor, seed: int) -> list[int]:
    return torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))[:, 0].tolist()


def test_pit_is_uniform_for_tokens_from_the_distribution_and_not_otherwise():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3000, 40, generator=g) * 2, dim=1)
    rng = random.Random(0)
    _, p_ok = chi_square_uniform(pit_values(probs, _draws(probs, 1), [rng.random() for _ in range(3000)]))
    assert p_ok > 1e-3
    sharper = torch.softmax(torch.log(probs) * 1.15, dim=1)  # slightly too confident
    _, p_bad = chi_square_uniform(pit_values(probs, _draws(sharper, 2), [rng.random() for _ in range(3000)]))
    assert p_bad < 1e-6


def test_chi_square_p_value_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(3)
    values = [rng.random() ** 1.1 for _ in range(500)]
    stat, p = chi_square_uniform(values, num_bins=10)
    counts = [0] * 10
    for u in values:
        counts[min(int(u * 10), 9)] += 1
    ref = scipy_stats.chisquare(counts)
    assert stat == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, rel=1e-9)


def test_greedy_check_names_the_first_divergence():
    ok, detail = greedy_check({"a": (1, 2, 3)}, {"a": (1, 2, 3)})
    assert ok and "3 tokens identical" in detail
    ok, detail = greedy_check({"a": (1, 5, 3)}, {"a": (1, 2, 3)})
    assert not ok and "diverges at output token 1" in detail


@pytest.fixture(scope="module")
def backend():
    if not os.environ.get("HARNESS_DATA_DIR"):
        shared = REPO.parent / "shared" / "datasets"
        if not shared.is_dir():
            pytest.skip("needs HARNESS_DATA_DIR (../shared/datasets)")
        os.environ["HARNESS_DATA_DIR"] = str(shared)
    from backends.inhouse.adapter import InhouseBackend

    b = InhouseBackend(num_threads=1)
    yield b
    b.close()


def _cell(policy: str = "full") -> Cell:
    return Cell("inhouse", TargetSpec("embedded", "embedded"), DrafterSpec("dspark", "dspark", "embedded:dspark"), 3,
                TaskSpec("gsm8k", 6, 32), PolicySpec(policy), concurrency=6)


def test_real_backend_passes_both_checks_under_the_scheduler(backend):
    findings = audit_cell(backend, _cell("scheduler"), {}, samples=24)
    assert [f.check for f in findings] == ["greedy", "sampled"]
    assert all(f.passed for f in findings), [f.detail for f in findings]


def test_verification_bug_is_caught_by_the_sampled_check(backend, monkeypatch):
    import dspark_core.generate as generate

    real_verify = generate.verify

    def verify_at_wrong_temperature(logits, draft_ids, cu, draft_probs, temperatures, generators):
        # the bug: the verifier sees a default temperature instead of the request's
        return real_verify(logits, draft_ids, cu, draft_probs, temperatures * 0.7, generators)

    monkeypatch.setattr(generate, "verify", verify_at_wrong_temperature)
    greedy, sampled = audit_cell(backend, _cell(), {}, samples=24)
    assert greedy.passed  # greedy verification never reads q: the bug is invisible at T = 0
    assert sampled.passed is False, sampled.detail
