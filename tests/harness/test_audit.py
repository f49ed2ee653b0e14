"""`harness audit`: the PIT χ² test has the right size and power, the real in-house backend passes,
and a backend with a classic verification bug (the request's temperature not reaching the verifier)
fails the sampled check even though its greedy output is still exact."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch

from harness.audit import (
    DEFAULT_TOKENS,
    anderson_darling_uniform,
    audit_cell,
    chi_square_uniform,
    greedy_check,
    pit_values,
    power_line,
)
from harness.audit_power import BROKEN, POWER_FILE, broken_verifier
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec

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


@pytest.mark.slow
@pytest.mark.parametrize("bug", BROKEN)
def test_each_classic_broken_verifier_is_caught_by_the_default_audit(backend, monkeypatch, bug):
    """The real engine with one broken verifier in place of `verify` (nothing else replaced), audited at
    the default size: the sampled check fails (its power there is in audit_power.json)."""
    import dspark_core.generate as generate

    monkeypatch.setattr(generate, "verify", broken_verifier(bug))
    greedy, sampled = audit_cell(backend, _cell(), {}, samples=None)
    assert sampled.passed is False, sampled.detail
    assert int(sampled.detail.split(": ")[1].split(" tokens")[0]) >= DEFAULT_TOKENS


def test_the_audit_states_its_measured_power():
    line = power_line()
    assert f"≥ {DEFAULT_TOKENS} tokens" in line and "Anderson-Darling" in line
    for bug in BROKEN:
        power = float(line.split(f"{bug} ")[1][:4])
        assert power >= 0.95, line
    table = json.loads(POWER_FILE.read_text())
    chosen = table["tests"]["anderson_darling"]
    at = table["sizes"].index(DEFAULT_TOKENS)
    assert all(chosen[bug][at] >= 0.95 for bug in BROKEN)
    # the smallest measured size with that power against all four
    assert all(min(chosen[bug][i] for bug in BROKEN) < 0.95 for i in range(at))


def test_anderson_darling_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(5)
    values = [rng.random() ** 1.05 for _ in range(800)]
    a2, p = anderson_darling_uniform(values)
    ref = scipy_stats.goodness_of_fit(scipy_stats.uniform, values, statistic="ad", known_params={"loc": 0, "scale": 1},
                                      n_mc_samples=2000, random_state=1)
    assert a2 == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, abs=0.03)
    uniform = [rng.random() for _ in range(2000)]
    assert anderson_darling_uniform(uniform)[1] > 0.01 and p < 0.2
