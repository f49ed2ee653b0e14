"""SPS tables and verification policies (dspark_core/costs/, dspark_core/scheduler.py, backends/inhouse/profile.py).

a. SPS tables: the ceiling lookup, validation, the JSON store keyed by fingerprint, and `profile_sps`
   measuring a real tiny target.
b. Policies on hand-computed cases: Algorithm 1 step by step, idle vs busy, ties and prefix-ness, a
   sequential reference on random cases, threshold, static, the two-step-old budget, calibration.
c. Losslessness through `generate`: greedy output equals plain decoding under every policy; sampled
   outputs under the scheduler fit the exact law (χ², 20,000 samples in one batch).
d. The paper's appendix counter-example: without the early stop a (0.7, 0.3) target is biased towards
   (0.85, 0.15); with it, it is not.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from conftest import tiny_qwen3
from dspark_core.calibration import OnlineCalibrator
from dspark_core.distributions import draw_uniforms
from dspark_core.drafters import DraftProposal, DraftStep, NoDrafter, as_drafter, build_draft_model, draft_config_for
from dspark_core.drafters.base import StatelessDrafter
from dspark_core.generate import GenerationConfig, generate
from dspark_core.policy import VerifyAll
from dspark_core.kv_slots import KVSlots
from dspark_core.scheduler import (
    AsyncBudgetScheduler,
    ConfidenceThreshold,
    PrefixScheduler,
    StaticLength,
    admit_top,
    rank_candidates,
    schedule_prefix,
    throughput_curve,
)
from backends.inhouse.profile import profile_sps
from dspark_core.costs import (
    SPSFingerprint,
    SPSTable,
    load_sps_table,
    load_sps_tables,
    read_sps_csv,
    save_sps_table,
    step_sps_table,
)
from dspark_core.target import TargetModel, TargetOutput
from exact_distribution import chi2_gof, count_prefixes, exact_joint

ALPHA = 1e-3  # a correct sampler fails this often by chance; seeds are fixed, so a pass stays a pass
BROKEN_ALPHA = 1e-6  # the biased scheduler must fail by at least this much


def logit(p) -> torch.Tensor:
    p = torch.as_tensor(p, dtype=torch.float64)
    return torch.log(p) - torch.log1p(-p)


def proposal_of(conf: list[list[float]], num_valid: list[int] | None = None) -> DraftProposal:
    """A proposal carrying per-position confidences c_k (probabilities); tokens are irrelevant to policies."""
    logits = logit(conf)
    num_rows, gamma = logits.shape
    return DraftProposal(
        torch.zeros(num_rows, gamma, dtype=torch.long), None, logits,
        torch.tensor(num_valid) if num_valid is not None else None,
    )


def survival_of(conf: list[list[float]]) -> torch.Tensor:
    return torch.cumprod(torch.tensor(conf, dtype=torch.float64), dim=1)


FINGERPRINT = SPSFingerprint("NVIDIA H100 80GB HBM3", "bfloat16", "Qwen/Qwen3-8B", 4096)

# ============================================================================ a. SPS tables

STAIRS = SPSTable.from_points([(8, 50.0), (4, 100.0), (6, 80.0)])  # any order in, sorted inside


def test_ceiling_lookup_and_compute_bound_extrapolation():
    assert STAIRS.batch_sizes == (4, 6, 8)
    assert [STAIRS(b) for b in range(1, 9)] == [100, 100, 100, 100, 80, 80, 50, 50]
    assert STAIRS(16) == pytest.approx(25.0)  # past B_max: time ∝ B, SPS = 50 · 8 / 16
    many = torch.arange(1, 40)
    assert torch.equal(STAIRS.lookup(many), torch.tensor([STAIRS(int(b)) for b in many], dtype=torch.float64))
    assert torch.equal(STAIRS.lookup_range(3, 40), STAIRS.lookup(torch.arange(3, 40)))
    assert torch.equal(STAIRS.lookup_range(2, 5), STAIRS.lookup(torch.arange(2, 5)))  # after a larger one: cached
    with pytest.raises(ValueError, match=">= 1"):
        STAIRS(0)


def test_synthetic_staircase_and_monotone():
    table = step_sps_table(256, 64, base_latency_s=0.010, tile_latency_s=0.002)
    assert table.batch_sizes == (64, 128, 192, 256)
    for b in (1, 63, 64, 65, 128, 129, 256):
        assert table(b) == pytest.approx(1 / (0.010 + 0.002 * math.ceil(b / 64)))
    noisy = SPSTable.from_points([(1, 100.0), (2, 101.0), (4, 90.0), (8, 95.0)])
    assert noisy.monotone().steps_per_second == (100.0, 100.0, 90.0, 90.0)


@pytest.mark.parametrize(
    "sizes, sps, message",
    [
        ((), (), "at least one"),
        ((1, 2), (1.0,), "2 batch sizes but 1"),
        ((0, 2), (1.0, 1.0), "integers >= 1"),
        ((1.5, 2), (1.0, 1.0), "integers >= 1"),
        ((4, 2), (1.0, 1.0), "strictly increasing"),
        ((2, 2), (1.0, 1.0), "strictly increasing"),
        ((1, 2), (1.0, 0.0), "finite and > 0"),
        ((1, 2), (1.0, float("nan")), "finite and > 0"),
        ((1, 2), (1.0, "fast"), "finite and > 0"),
    ],
)
def test_table_validation(sizes, sps, message):
    with pytest.raises(ValueError, match=message):
        SPSTable(sizes, sps)


def test_points_and_fingerprint_validation():
    with pytest.raises(ValueError, match="duplicate batch sizes \\[2\\]"):
        SPSTable.from_points([(2, 1.0), (1, 1.0), (2, 3.0)])
    with pytest.raises(ValueError, match="context_len"):
        SPSFingerprint("gpu", "bfloat16", "m", -1)
    with pytest.raises(ValueError, match="did you mean 'device_name'"):
        SPSFingerprint.from_dict({**FINGERPRINT.to_dict(), "device_nam": "x"})
    with pytest.raises(ValueError, match="missing"):
        SPSFingerprint.from_dict({"device_name": "x"})


def test_json_store_is_keyed_by_fingerprint(tmp_path):
    path = tmp_path / "sps.json"
    other = SPSFingerprint("NVIDIA H100 80GB HBM3", "bfloat16", "Qwen/Qwen3-8B", 512)
    h100 = SPSTable.from_points([(8, 50.0), (64, 45.0), (256, 20.0)], FINGERPRINT, {"source": "paper"})
    short = SPSTable.from_points([(8, 70.0), (64, 60.0)], other.to_dict())  # a dict fingerprint is fine too
    save_sps_table(path, h100)
    save_sps_table(path, short)
    assert load_sps_table(path, FINGERPRINT) == h100
    assert load_sps_table(path, other.to_dict()).meta == {} and load_sps_table(path, other) == short
    remeasured = SPSTable.from_points([(8, 51.0)], FINGERPRINT)
    save_sps_table(path, remeasured)  # same fingerprint: replaced, not duplicated
    assert len(load_sps_tables(path)) == 2 and load_sps_table(path, FINGERPRINT) == remeasured

    with pytest.raises(LookupError, match="closest differs in \\{'dtype': 'bfloat16'\\}"):
        load_sps_table(path, SPSFingerprint("NVIDIA H100 80GB HBM3", "float16", "Qwen/Qwen3-8B", 4096))
    with pytest.raises(ValueError, match="fingerprint"):
        save_sps_table(path, SPSTable.from_points([(1, 1.0)]))

    doc = json.loads(path.read_text())
    doc["tables"][0]["steps_per_secnd"] = doc["tables"][0].pop("steps_per_second")
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="table 0: .*unknown key 'steps_per_secnd'; did you mean 'steps_per_second'"):
        load_sps_tables(path)
    path.write_text(json.dumps({**doc, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        load_sps_tables(path)
    path.write_text("{}")
    with pytest.raises(ValueError, match="not an SPS file"):
        load_sps_tables(path)


def test_curve_from_csv(tmp_path):
    path = tmp_path / "h100.csv"
    path.write_text("batch_size,steps_per_second,note\n64,45.5,x\n8,50,y\n")
    table = read_sps_csv(path, FINGERPRINT)
    assert table.batch_sizes == (8, 64) and table.steps_per_second == (50.0, 45.5)
    assert table.fingerprint == FINGERPRINT
    path.write_text("b,sps\n1,2\n")
    with pytest.raises(ValueError, match="need CSV columns"):
        read_sps_csv(path)


@functools.cache
def profiled_target() -> TargetModel:
    return TargetModel(tiny_qwen3(vocab_size=64, hidden_size=32, num_layers=2, seed=3))


def _spy_forward(target: TargetModel, monkeypatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    real = target.forward

    def spy(cache, rows, token_ids, num_new):
        calls.append((len(rows), int(num_new.sum())))
        assert bool((cache.lengths[rows] == 16).all()), "every timed call starts from the same context"
        return real(cache, rows, token_ids, num_new)

    monkeypatch.setattr(target, "forward", spy)
    return calls


def test_profile_sps_times_real_forwards(monkeypatch):
    """Each B runs as ceil(B / 8) requests over a 16-token context; the median of the repeats is kept."""
    target = profiled_target()
    calls = _spy_forward(target, monkeypatch)
    ticks = iter([0.0, 9.0, 9.0, 10.0, 10.0, 12.0, 12.0, 15.0] + [0.0, 0.5] * 4)  # B=5: 9 (warm-up), 1, 2, 3
    table = profile_sps(target, [20, 5], 16, warmup=1, repeats=3, target_id="tiny", clock=lambda: next(ticks))
    assert calls == [(1, 5)] * 4 + [(3, 20)] * 4  # B = 20 → rows of 8, 8, 4
    assert table.batch_sizes == (5, 20) and table.steps_per_second == (0.5, 2.0)
    assert table.fingerprint == SPSFingerprint(table.fingerprint.device_name, "float32", "tiny", 16)
    assert table.fingerprint.device_name.startswith("cpu")
    assert table.meta["latencies_s"]["5"] == [1.0, 2.0, 3.0]


def test_profile_sps_on_the_cpu(tmp_path):
    table = profile_sps(profiled_target(), [1, 8, 32], context_len=16, warmup=1, repeats=3)
    assert table.batch_sizes == (1, 8, 32)
    assert all(0 < s < 1e6 for s in table.steps_per_second)
    save_sps_table(tmp_path / "cpu.json", table)
    assert load_sps_table(tmp_path / "cpu.json", table.fingerprint) == table
    print("CPU SPS:", dict(zip(table.batch_sizes, [round(s) for s in table.steps_per_second])))


# ============================================================================ b. policies, by hand

# Request 0: c = (0.9, 0.8, 0.5) → a = (0.9, 0.72, 0.36); request 1: c = (0.6, 0.5, 0.9) → a = (0.6, 0.3, 0.27).
# Sorted: 0.9 (0,1), 0.72 (0,2), 0.6 (1,1), 0.36 (0,3), 0.3 (1,2), 0.27 (1,3).
CONF = [[0.9, 0.8, 0.5], [0.6, 0.5, 0.9]]


def test_algorithm1_by_hand():
    """STAIRS: SPS 100 up to B = 4, 80 up to 6, 50 up to 8. Θ_0 = 2·100 = 200;
    (0,1): B 3, τ 2.90, Θ 290 ✓; (0,2): B 4, τ 3.62, Θ 362 ✓; (1,1): B 5, τ 4.22, Θ 337.6 < 362 → stop."""
    sorted_a, rank = rank_candidates(survival_of(CONF))
    theta = throughput_curve(sorted_a, 2, STAIRS)
    assert theta.tolist() == pytest.approx([200, 290, 362, 337.6, 366.4, 244, 257.5])
    assert rank.tolist() == [[0, 1, 3], [2, 4, 5]]
    assert schedule_prefix(survival_of(CONF), STAIRS).tolist() == [2, 0]
    assert PrefixScheduler(STAIRS).choose(proposal_of(CONF), None).tolist() == [2, 0]
    # Looking past the drop would find Θ 366.4 at 4 admitted: (0, 3) and (1, 1) too. Algorithm 1 must not.
    assert int(theta.argmax()) == 4 and admit_top(rank, survival_of(CONF), 4).tolist() == [3, 1]


def test_idle_gpu_verifies_everything_busy_gpu_little():
    flat = SPSTable.from_points([(1, 100.0), (64, 100.0)])
    assert schedule_prefix(survival_of(CONF), flat).tolist() == [3, 3]
    busy = SPSTable.from_points([(2, 100.0), (3, 30.0), (64, 25.0)])  # one token more costs 70% speed
    assert schedule_prefix(survival_of(CONF), busy).tolist() == [0, 0]
    gentle = step_sps_table(64, 1, base_latency_s=0.010, tile_latency_s=0.0005)
    steep = step_sps_table(64, 1, base_latency_s=0.010, tile_latency_s=0.0050)
    torch.manual_seed(0)
    a = torch.cumprod(torch.sigmoid(torch.randn(8, 7, dtype=torch.float64) + 1.5), dim=1)
    n_gentle, n_steep = schedule_prefix(a, gentle), schedule_prefix(a, steep)
    assert bool((n_steep <= n_gentle).all()) and n_gentle.sum() > n_steep.sum() > 0


def test_no_draft_never_admitted_and_ties_keep_prefixes():
    flat = SPSTable.from_points([(64, 100.0)])
    assert PrefixScheduler(flat).choose(proposal_of(CONF, num_valid=[1, 0]), None).tolist() == [1, 0]
    # σ(50) is exactly 1.0 in float64: every candidate ties. SPS 100 up to B = 5, then 10: three admitted,
    # and ties go to the earlier position first, then the lower row: (0,1), (1,1), (0,2).
    ties = DraftProposal(torch.zeros(2, 3, dtype=torch.long), None, torch.full((2, 3), 50.0, dtype=torch.float64))
    cliff = SPSTable.from_points([(5, 100.0), (6, 10.0)])
    assert PrefixScheduler(cliff).choose(ties, None).tolist() == [2, 1]
    # admit_top counts a run from j = 1, whatever mask it is handed.
    rank = torch.tensor([[0, 5, 1], [2, 3, 4]])
    assert admit_top(rank, torch.ones(2, 3), 3).tolist() == [1, 1]


def algorithm1_reference(survival: torch.Tensor, sps: SPSTable) -> list[int]:
    """Algorithm 1 as the paper writes it: one candidate at a time, stop at the first drop in Θ."""
    num_rows, gamma = survival.shape
    candidates = sorted(
        ((float(survival[r, j]), j, r) for r in range(num_rows) for j in range(gamma) if survival[r, j] > 0),
        key=lambda c: (-c[0], c[1], c[2]),
    )
    batch, tau = num_rows, float(num_rows)
    theta = tau * sps(batch)
    lengths = [0] * num_rows
    for a, j, r in candidates:
        assert lengths[r] == j, "a candidate came before the previous position of its request"
        new_theta = (tau + a) * sps(batch + 1)
        if new_theta < theta:
            break
        batch, tau, theta = batch + 1, tau + a, new_theta
        lengths[r] += 1
    return lengths


def test_algorithm1_matches_the_sequential_reference():
    gen = torch.Generator().manual_seed(7)
    for case in range(300):
        num_rows = int(torch.randint(1, 9, (1,), generator=gen))
        gamma = int(torch.randint(1, 8, (1,), generator=gen))
        logits = torch.randn(num_rows, gamma, generator=gen, dtype=torch.float64) * 2 + 1
        survival = torch.cumprod(torch.sigmoid(logits), dim=1)
        num_points = int(torch.randint(1, 6, (1,), generator=gen))
        sizes = sorted(set(torch.randint(1, num_rows * (gamma + 1) + 4, (num_points,), generator=gen).tolist()))
        drops = torch.rand(len(sizes), generator=gen, dtype=torch.float64) * 0.5 + 0.5
        sps = SPSTable(tuple(sizes), tuple((100 * torch.cumprod(drops, 0)).tolist()))
        expected = algorithm1_reference(survival, sps)
        assert schedule_prefix(survival, sps).tolist() == expected, f"case {case}"


def test_threshold_policy():
    conf = [[0.9, 0.4, 0.95], [0.6, 0.7, 0.2]]
    assert ConfidenceThreshold(0.5).choose(proposal_of(conf), None).tolist() == [1, 2]
    assert ConfidenceThreshold(0.65).choose(proposal_of(conf), None).tolist() == [1, 0]
    # T_1 = 0.5 sharpens position 1: σ(logit(0.6) / 0.5) = 0.69 ≥ 0.65, and row 1 goes on to position 2.
    temps = torch.tensor([0.5, 1.0, 1.0])
    assert ConfidenceThreshold(0.65, temperatures=temps).choose(proposal_of(conf), None).tolist() == [1, 2]
    assert ConfidenceThreshold(0.0).choose(proposal_of(conf, num_valid=[3, 1]), None).tolist() == [3, 1]
    with pytest.raises(ValueError, match="not both"):
        ConfidenceThreshold(0.5, temperatures=temps, calibrator=OnlineCalibrator(3))
    with pytest.raises(ValueError, match="3 temperatures for γ=4"):
        ConfidenceThreshold(0.5, temperatures=temps).choose(proposal_of([[0.5] * 4]), None)
    # A level offset moves every confidence of its position: b_2 = −1 drops row 2's σ(logit(0.7) − 1) = 0.46 < 0.5.
    offsets = torch.tensor([0.0, -1.0, 0.0])
    assert ConfidenceThreshold(0.5, temperatures=torch.ones(3), offsets=offsets).choose(
        proposal_of(conf), None).tolist() == [1, 1]
    with pytest.raises(ValueError, match="come with the STS temperatures"):
        ConfidenceThreshold(0.5, offsets=offsets)
    no_conf = DraftProposal(torch.zeros(1, 3, dtype=torch.long), None, None)
    with pytest.raises(ValueError, match="needs confidences"):
        PrefixScheduler(STAIRS).choose(no_conf, None)


def test_static_policy():
    proposal = proposal_of([[0.5] * 4] * 3, num_valid=[1, 4, 3])
    assert StaticLength(2).choose(proposal, None).tolist() == [1, 2, 2]
    assert StaticLength(9).choose(proposal_of([[0.5] * 4]), None).tolist() == [4]
    no_conf = DraftProposal(torch.zeros(2, 3, dtype=torch.long), None, None)
    assert StaticLength(0).choose(no_conf, None).tolist() == [0, 0]


def test_calibrated_confidences():
    """An OnlineCalibrator fitted on over-confident heads (true acceptance σ(c / 3)) softens them: the policy
    sees exactly its calibrated logits, and schedules differently from the raw ones."""
    gen = torch.Generator().manual_seed(0)
    conf = torch.randn(3000, 3, generator=gen, dtype=torch.float64) * 2 + 2
    accept = torch.rand(3000, 3, generator=gen, dtype=torch.float64) < torch.sigmoid(conf / 3)
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)
    calibrator = OnlineCalibrator(3, window=4096, min_cycles=512)
    calibrator.observe(conf, torch.full((3000,), 3), num_accepted)
    assert calibrator.num_fits == 1 and bool((calibrator.temperatures > 1.5).all())

    table = step_sps_table(16, 1, base_latency_s=0.010, tile_latency_s=0.0008)  # +0.8 ms per token
    proposal = DraftProposal(torch.zeros(4, 3, dtype=torch.long), None, torch.randn(4, 3, generator=gen) * 2 + 3)
    for policy_of in (lambda **kw: PrefixScheduler(table, **kw), lambda **kw: ConfidenceThreshold(0.9, **kw)):
        online = policy_of(calibrator=calibrator).choose(proposal, None)
        assert torch.equal(online, policy_of(temperatures=calibrator.temperatures).choose(proposal, None))
        assert not torch.equal(online, policy_of().choose(proposal, None))
    with pytest.raises(ValueError, match="calibrator is for γ=3"):
        PrefixScheduler(table, calibrator=calibrator).choose(proposal_of([[0.5] * 4]), None)


def test_async_budget_uses_the_plan_of_two_steps_back():
    table = SPSTable.from_points([(2, 100.0), (4, 95.0), (6, 60.0), (8, 40.0)])
    high, low = [[0.99] * 3] * 2, [[0.02, 0.5, 0.5], [0.03, 0.5, 0.5]]
    steps = [CONF, high, low, CONF, high]
    plans = [int(schedule_prefix(survival_of(c), table).sum()) for c in steps]
    assert plans == [2, 2, 0, 2, 2]
    policy = AsyncBudgetScheduler(table)
    got = [policy.choose(proposal_of(c), None).tolist() for c in steps]
    # Steps 1–2: no plan two steps back yet, so Algorithm 1 itself. Step 3: budget 2 (planned at step 1)
    # filled by the most confident of `low`: position 1 of both rows, where Algorithm 1 would verify none.
    # Step 5: budget 0 (planned at step 3), where Algorithm 1 would verify (1, 1).
    assert got == [[2, 0], [1, 1], [1, 1], [2, 0], [0, 0]]
    assert policy.planned_budgets == (2, 2)
    policy.reset()
    assert policy.choose(proposal_of(low), None).tolist() == [0, 0]
    assert AsyncBudgetScheduler(table, initial_budget=3).choose(proposal_of(CONF), None).tolist() == [2, 1]
    assert AsyncBudgetScheduler(table, delay=0).choose(proposal_of(high), None).tolist() == [1, 1]


# ============================================================================ c. losslessness through generate


def dspark_with_random_confidence(
    target: TargetModel, seed: int = 0, conf_scale: float = 1.0, bias: float = 1.0, bigram: torch.Tensor | None = None
):
    """An untrained DSpark draft whose Markov and confidence heads are random, so p_d depends on the previous
    draft token and so does the confidence c_k (through W1[x_{k−1}]): verify lengths vary by request.

    With `bigram` ([V], a successor per token) the Markov head instead drafts bigram[x_{k−1}] (W1 = I,
    W2 one-hot, as in test_losslessness.py), so drafts that follow the target get accepted.
    """
    torch.manual_seed(seed)
    rank = target.vocab_size if bigram is not None else 8
    cfg = draft_config_for(target, "dspark", mask_token_id=target.vocab_size - 1, num_layers=2, markov_rank=rank)
    model = build_draft_model(cfg).eval()
    with torch.no_grad():
        head = model.markov_head
        if bigram is None:
            head.markov_w1.weight.normal_(0, 1)
            head.markov_w2.weight.normal_(0, 1)
        else:
            head.markov_w1.weight.copy_(torch.eye(rank))
            head.markov_w2.weight.zero_()
            head.markov_w2.weight[bigram, torch.arange(rank)] = 30.0
        model.confidence_head.proj.weight.normal_(0, conf_scale)
        model.confidence_head.proj.bias.fill_(bias)
    return as_drafter(model)


GREEDY_PROMPTS = [[5, 17, 3], [40, 2, 2, 9, 11, 60, 7], [1], [88, 12, 33, 33], [70, 71, 72, 73, 74, 75], [9, 9]]
GREEDY_TABLE = SPSTable.from_points([(8, 100.0), (14, 90.0), (20, 70.0), (26, 55.0), (32, 45.0)])

POLICIES = {
    "static": lambda: StaticLength(2),
    "threshold": lambda: ConfidenceThreshold(0.6),
    "prefix": lambda: PrefixScheduler(GREEDY_TABLE),
    "async-prefix": lambda: AsyncBudgetScheduler(GREEDY_TABLE),
    "prefix-sts": lambda: PrefixScheduler(GREEDY_TABLE, temperatures=torch.tensor([0.5, 1.0, 2.0, 4.0])),
}


@pytest.mark.parametrize("draft", ["random", "bigram"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_greedy_output_equals_plain_decoding(qwen3_target: TargetModel, name: str, draft: str):
    config = GenerationConfig(max_new_tokens=20, num_drafts=4, temperature=0.0)
    plain = [r.output_ids for r in generate(qwen3_target, NoDrafter(), GREEDY_PROMPTS, config)]
    bigram = None
    if draft == "bigram":  # the target's greedy successor of each token, from the plain outputs
        bigram = torch.zeros(qwen3_target.vocab_size, dtype=torch.long)
        for prompt, out in zip(GREEDY_PROMPTS, plain):
            for a, b in zip(prompt[-1:] + out, out):
                bigram[a] = b
    drafter = dspark_with_random_confidence(qwen3_target, conf_scale=0.5, bigram=bigram)
    results = generate(qwen3_target, drafter, GREEDY_PROMPTS, config, policy=POLICIES[name]())
    assert [r.output_ids for r in results] == plain
    lengths = [v for r in results for v in r.counters.num_verified]
    accepted = sum(a for r in results for a in r.counters.num_accepted)
    print(f"{name}, {draft} draft: verify lengths {np.bincount(lengths, minlength=5).tolist()} (0 … 4), "
          f"{accepted} drafts accepted")
    if name != "static":
        # the random draft's confidences vary smoothly, so must its verify lengths; the bigram draft's come in
        # near-0/near-1 runs (one-hot Markov head), where a threshold verifies all or nothing — and the token
        # budget no longer cuts the last step short (vLLM's rule), so it adds no lengths of its own
        want = 3 if draft == "random" else 2
        assert len(set(lengths)) >= want, f"{name}: verify lengths do not vary ({set(lengths)}): the test is weak"
    if draft == "bigram":
        assert accepted >= len(plain) * 3, "the bigram draft should get drafts accepted"


SAMPLING_PROMPT = [3, 1, 5, 1]
NUM_SAMPLES = 20_000
NUM_TOKENS = 3


@functools.cache
def small_target() -> TargetModel:
    """V = 8, the law of the first tokens neither flat nor deterministic (as in test_losslessness.py)."""
    model = tiny_qwen3(vocab_size=8, hidden_size=16, num_layers=2, seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
    return TargetModel(model)


# 20,000 requests: B = 20,000 … 80,000 at γ = 3. SPS is flat up to B = 40,000, so the first step verifies
# the 20,000 most confident drafts; later steps (fewer requests) verify what fits below the edge.
SAMPLING_TABLE = SPSTable.from_points([(40_000, 100.0), (80_000, 50.0)])
SAMPLING_POLICIES = {
    "prefix": lambda: PrefixScheduler(SAMPLING_TABLE),
    "async-prefix": lambda: AsyncBudgetScheduler(SAMPLING_TABLE, delay=2, initial_budget=12_000),
    "threshold-sts": lambda: ConfidenceThreshold(0.8, temperatures=torch.tensor([1.0, 3.0, 1.0])),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow if n == "threshold-sts" else ()) for n in SAMPLING_POLICIES]
)
def test_sampling_under_the_scheduler_matches_exact_distribution(name: str):
    target = small_target()
    law = exact_joint(target.model, SAMPLING_PROMPT, NUM_TOKENS, 1.0)
    drafter = dspark_with_random_confidence(target, seed=1, conf_scale=1.0, bias=0.5)
    config = GenerationConfig(max_new_tokens=NUM_TOKENS + 1, num_drafts=3, temperature=1.0)
    generators = [torch.Generator().manual_seed(i) for i in range(NUM_SAMPLES)]
    policy = SAMPLING_POLICIES[name]()
    results = generate(target, drafter, [SAMPLING_PROMPT] * NUM_SAMPLES, config, generators, policy=policy)
    counts = count_prefixes((r.output_ids for r in results), NUM_TOKENS, 8)
    p = chi2_gof(counts, law)[2]
    first = np.bincount([r.counters.num_verified[0] for r in results], minlength=3)
    print(f"{name}: χ² p = {p:.3f}; first-step verify lengths (0, 1, 2): {first.tolist()}")
    assert p > ALPHA, f"{name}: samples do not follow the target (χ² p = {p:.2g})"
    assert (first > NUM_SAMPLES // 20).sum() >= 2, f"{name}: first-step lengths do not vary: {first.tolist()}"


# ============================================================================ d. the appendix counter-example


class ConstantTarget:
    """Test double: p_t = `probs` at every position, whatever the context (outside the code under test)."""

    def __init__(self, probs: list[float]):
        self.logits = torch.log(torch.tensor(probs))
        self.vocab_size = len(probs)
        self.device = torch.device("cpu")

    def new_cache(self, num_slots: int, capacity: int) -> KVSlots:
        return KVSlots.allocate(1, num_slots, 1, capacity, 1, torch.float32, "cpu")

    def forward(self, cache: KVSlots, rows, token_ids, num_new, *, logits_at=None) -> TargetOutput:
        num_rows, width = token_ids.shape
        kv = torch.zeros(num_rows, 1, width, 1)
        cache.append(rows, [(kv, kv)], num_new)
        num_logits = width if logits_at is None else logits_at.shape[1]
        return TargetOutput(self.logits.expand(num_rows, num_logits, -1).clone(), torch.zeros(num_rows, width, 0))


A, B = 0, 1
P_HIGH, P_LOW = 0.9, 0.5  # c_1, drawn per request before x_1 (so it may depend on anything but x_1)
Q_AFTER_A, Q_AFTER_B = 0.9, 0.1  # c_2 = P(x_2 accepted | x_1 accepted): depends on the sampled x_1


class SelfDoubtingDrafter(StatelessDrafter):
    """Test double: p_d = (0.5, 0.5) at both positions; c_1 is high or low by a coin of its own; c_2 is
    high after A and low after B, so x_2's confidence reveals x_1. Records the first step's coins."""

    name = "self-doubting"

    def __init__(self) -> None:
        self.first_high: torch.Tensor | None = None

    def propose(self, state: None, step: DraftStep) -> DraftProposal:
        assert step.num_drafts == 2
        u = draw_uniforms(step.generators, 3)  # [R, 3]: the c_1 coin, x_1, x_2
        high = u[:, 0] < 0.5
        x1, x2 = (u[:, 1] >= 0.5).long(), (u[:, 2] >= 0.5).long()
        c1 = torch.where(high, logit(P_HIGH), logit(P_LOW))
        c2 = torch.where(x1 == A, logit(Q_AFTER_A), logit(Q_AFTER_B))
        if self.first_high is None:
            self.first_high = high
        num_rows = len(step.rows)
        return DraftProposal(torch.stack([x1, x2], 1), torch.full((num_rows, 2, 2), 0.5), torch.stack([c1, c2], 1))


class NoEarlyStop(PrefixScheduler):
    """DELIBERATELY WRONG, kept only as the counter-example: admits the prefix of the sorted candidates
    that maximises Θ overall, looking past drops, so a later candidate can decide an earlier one."""

    def num_admitted(self, theta: torch.Tensor, sorted_survival: torch.Tensor) -> torch.Tensor:
        return theta.argmax()


class OneRequestAtATime(VerifyAll):
    """Schedules every request as if it were alone (R = 1), the paper's single-request setting. A request's
    decision depends only on its confidences, so each distinct row is scheduled once and shared."""

    def __init__(self, scheduler: PrefixScheduler) -> None:
        self.scheduler = scheduler

    def choose(self, proposal: DraftProposal, step: DraftStep) -> torch.Tensor:
        rows, inverse = torch.unique(proposal.confidence_logits, dim=0, return_inverse=True)
        alone = [
            self.scheduler.choose(DraftProposal(proposal.token_ids[:1], None, row[None]), step)[0] for row in rows
        ]
        return torch.stack(alone)[inverse]


# SPS for R = 1 (B = 1 … 3). Low c_1: Θ_0 = 100, Θ_1 = 1.5·60 = 90 (a drop), Θ_2 = (1.5 + 0.5·q)·55:
# 107.25 after A, 85.25 after B. High c_1: Θ_1 = 114, Θ_2 = 149.05 after A, 109.45 after B (a drop).
COUNTER_TABLE = SPSTable.from_points([(1, 100.0), (2, 60.0), (3, 55.0)])


def test_counter_example_decisions():
    def lengths(scheduler, c1, c2):
        return int(scheduler.choose(proposal_of([[c1, c2]]), None)[0])

    real, wrong = PrefixScheduler(COUNTER_TABLE), NoEarlyStop(COUNTER_TABLE)
    # Algorithm 1: x_1 is verified iff c_1 is high, whatever x_1 is; x_2 then iff x_1 = A (allowed: j > 1).
    assert [lengths(real, P_LOW, Q_AFTER_A), lengths(real, P_LOW, Q_AFTER_B)] == [0, 0]
    assert [lengths(real, P_HIGH, Q_AFTER_A), lengths(real, P_HIGH, Q_AFTER_B)] == [2, 1]
    # Without the early stop, at low c_1 the verification of x_1 depends on x_1 itself (via c_2).
    assert [lengths(wrong, P_LOW, Q_AFTER_A), lengths(wrong, P_LOW, Q_AFTER_B)] == [2, 0]
    assert [lengths(wrong, P_HIGH, Q_AFTER_A), lengths(wrong, P_HIGH, Q_AFTER_B)] == [2, 1]


def _sample_counter_example(scheduler: PrefixScheduler) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20,000 requests of a (0.7, 0.3) target; returns each request's first two speculative tokens
    (outputs 2 and 3: the prefill emits output 1 from the target alone) and its first-step c_1 coin."""
    drafter = SelfDoubtingDrafter()
    config = GenerationConfig(max_new_tokens=4, num_drafts=2, temperature=1.0)  # step 1 may verify 2
    generators = [torch.Generator().manual_seed(10_000_000 + i) for i in range(NUM_SAMPLES)]
    target, policy = ConstantTarget([0.7, 0.3]), OneRequestAtATime(scheduler)
    results = generate(target, drafter, [[A]] * NUM_SAMPLES, config, generators, policy=policy)
    outputs = np.array([r.output_ids[1:3] for r in results])
    return outputs[:, 0], outputs[:, 1], drafter.first_high.numpy()


def test_scheduler_without_early_stop_biases_the_output():
    """Appendix counter-example: at low c_1 the wrong variant verifies x_1 only when x_1 = A (always accepted,
    as p_t(A) = 0.7 > p_d(A) = 0.5); otherwise the target's own sample, A with 0.7. So P(A) = 0.5 + 0.5·0.7
    = 0.85 at low c_1: (0.7, 0.3) → (0.85, 0.15). Algorithm 1 keeps 0.7, jointly over two tokens."""
    first, second, high = _sample_counter_example(NoEarlyStop(COUNTER_TABLE))
    p_wrong = stats.binomtest(int((first == A).sum()), len(first), 0.7).pvalue
    low_rate = float((first[~high] == A).mean())
    print(f"no early stop: P(A) = {(first == A).mean():.3f} (p = {p_wrong:.2g}); at low c_1 {low_rate:.3f}")
    assert p_wrong < BROKEN_ALPHA
    assert abs(low_rate - 0.85) < 0.02

    first, second, high = _sample_counter_example(PrefixScheduler(COUNTER_TABLE))
    p_first = stats.binomtest(int((first == A).sum()), len(first), 0.7).pvalue
    p_low = stats.binomtest(int((first[~high] == A).sum()), int((~high).sum()), 0.7).pvalue
    pair_counts = np.zeros((2, 2), dtype=np.int64)
    np.add.at(pair_counts, (first, second), 1)
    p_pair = chi2_gof(pair_counts, np.outer([0.7, 0.3], [0.7, 0.3]))[2]
    print(f"Algorithm 1: P(A) = {(first == A).mean():.3f} (p = {p_first:.3f}); at low c_1 p = {p_low:.3f}; "
          f"pair χ² p = {p_pair:.3f}")
    assert min(p_first, p_low, p_pair) > ALPHA
