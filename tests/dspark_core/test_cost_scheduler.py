"""Drafting only when it pays: step-cost tables (dspark_core/costs/) and `CostAwareScheduler` (scheduler.py).

a. Step-cost tables: lookup (linear in R, ceiling in W and g), validation, monotone, the JSON store (version 2
   with step costs; version-1 files still load), `profile_step_costs` timing real steps.
b. The policy by hand: the plan (draft γ before any estimate, plain where drafting cannot pay, exploration),
   the per-layer fill with its early stop, and that the plan never depends on the current step's drafts.
c. Losslessness through `generate`: greedy output equals plain decoding while steps with and without the
   draft forward alternate; sampled output fits the exact law (χ²); the appendix counter-example with the
   per-layer fill keeps (0.7, 0.3), and the same fill without its early stop is caught.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy import stats

from backends.inhouse.profile import profile_step_costs
from dspark_core.drafters import DraftProposal, DraftStep, NoDrafter
from dspark_core.generate import GenerationConfig, generate
from dspark_core.policy import StepOutcome, VerifyAll
from dspark_core.scheduler import CostAwareScheduler
from dspark_core.costs import (
    SPSFingerprint,
    SPSTable,
    load_sps_table,
    load_sps_tables,
    load_step_cost_table,
    load_step_cost_tables,
    save_sps_table,
    StepCostTable,
)
from dspark_core.target import TargetModel
from exact_distribution import chi2_gof, count_prefixes, exact_joint
from test_scheduler import (
    ALPHA,
    BROKEN_ALPHA,
    GREEDY_PROMPTS,
    NUM_SAMPLES,
    NUM_TOKENS,
    SAMPLING_PROMPT,
    A,
    _sample_counter_example,
    dspark_with_random_confidence,
    logit,
    small_target,
)

FINGERPRINT = SPSFingerprint("cpu:x86_64", "float32", "tiny", 64)


def table(rows, verify, draft, fingerprint=None) -> StepCostTable:
    """verify: [rows][W = 1 … ] seconds, draft: [rows][g = 1 … ] seconds."""
    return StepCostTable(tuple(rows), tuple(range(1, len(verify[0]) + 1)), verify,
                         tuple(range(1, len(draft[0]) + 1)), draft, fingerprint)


def proposal_of(conf: list[list[float]], num_valid: list[int] | None = None) -> DraftProposal:
    logits = logit(conf)
    return DraftProposal(torch.zeros(logits.shape, dtype=torch.long), None, logits,
                         torch.tensor(num_valid) if num_valid is not None else None)


def step_of(num_rows: int, num_drafts: int) -> DraftStep:
    return DraftStep(torch.arange(num_rows), torch.zeros(num_rows, 4, dtype=torch.long),
                     torch.ones(num_rows, dtype=torch.long), num_drafts, torch.zeros(num_rows), [])


# ============================================================================ a. step-cost tables

COSTS = table((2, 8), verify=[[1.0, 1.2, 1.4], [2.0, 3.0, 4.0]], draft=[[0.5, 0.6], [1.0, 2.0]])


def test_lookup_is_linear_in_rows_and_ceiling_in_width():
    assert COSTS.verify_seconds(2, 1) == 1.0 and COSTS.verify_seconds(8, 3) == 4.0
    assert COSTS.verify_seconds(1, 2) == 1.2  # below the smallest R: the smallest
    assert COSTS.verify_seconds(5, 2) == pytest.approx(1.2 + 0.5 * (3.0 - 1.2))  # halfway from R = 2 to 8
    assert COSTS.verify_seconds(16, 1) == pytest.approx(4.0)  # past the largest R: proportional
    assert COSTS.verify_seconds(8, 6) == pytest.approx(8.0)  # past the largest W: proportional
    assert COSTS.draft_seconds(8, 0) == 0.0 and COSTS.draft_seconds(2, 2) == 0.6
    verify, draft = COSTS.curves(8, 2)
    assert verify[1:] == [2.0, 3.0, 4.0] and draft == [0.0, 1.0, 2.0]
    sparse = StepCostTable((1,), (1, 4), ((1.0, 2.0),), (2,), ((0.5,),))
    assert sparse.verify_seconds(1, 2) == 2.0 and sparse.draft_seconds(1, 1) == 0.5  # ceiling
    with pytest.raises(ValueError, match="R >= 1"):
        COSTS.verify_seconds(0, 1)


def test_validation_and_monotone():
    with pytest.raises(ValueError, match="strictly increasing"):
        StepCostTable((2, 2), (1,), ((1.0,), (1.0,)), (1,), ((1.0,), (1.0,)))
    with pytest.raises(ValueError, match=r"verify_s must be \[1 rows\]\[2\]"):
        StepCostTable((1,), (1, 2), ((1.0,),), (1,), ((1.0,),))
    with pytest.raises(ValueError, match="finite seconds > 0"):
        StepCostTable((1,), (1,), ((0.0,),), (1,), ((1.0,),))
    noisy = table((1, 2), verify=[[1.0, 0.9], [0.8, 2.0]], draft=[[0.3, 0.2], [0.1, 0.5]])
    fixed = noisy.monotone()
    # Each cost becomes the least of itself and every bigger step's: disturbances only ever add time.
    assert fixed.verify_s == ((0.8, 0.9), (0.8, 2.0)) and fixed.draft_s == ((0.1, 0.2), (0.1, 0.5))


def test_json_store_keeps_both_kinds_and_reads_version_1(tmp_path):
    path = tmp_path / "sps.json"
    sps = SPSTable.from_points([(1, 100.0), (8, 50.0)], FINGERPRINT)
    save_sps_table(path, sps)
    assert json.loads(path.read_text())["version"] == 1  # nothing new: a version-1 reader still reads it
    costs = table((1,), [[0.01, 0.02]], [[0.005]], FINGERPRINT)
    save_sps_table(path, costs)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and len(doc["tables"]) == 1 and len(doc["step_costs"]) == 1
    save_sps_table(path, SPSTable.from_points([(1, 90.0)], FINGERPRINT))  # replaces the SPS table only
    assert load_sps_table(path, FINGERPRINT).steps_per_second == (90.0,)
    assert load_step_cost_table(path, FINGERPRINT) == costs and len(load_step_cost_tables(path)) == 1
    with pytest.raises(LookupError, match="closest differs in \\{'context_len': 64\\}"):
        load_step_cost_table(path, SPSFingerprint("cpu:x86_64", "float32", "tiny", 128))
    v1 = {"format": "dspark-sps-tables", "version": 1, "tables": [sps.to_dict()]}
    path.write_text(json.dumps(v1))
    assert load_sps_tables(path) == [sps] and load_step_cost_tables(path) == []
    path.write_text(json.dumps({**v1, "step_costs": []}))
    with pytest.raises(ValueError, match="needs format version 2"):
        load_sps_tables(path)


def test_profile_step_costs_times_real_steps(qwen3_target: TargetModel):
    drafter = dspark_with_random_confidence(qwen3_target)
    costs = profile_step_costs(qwen3_target, drafter, [3, 1], context_len=12, num_drafts=2, warmup=0, repeats=2,
                               target_id="tiny")
    assert costs.rows == (1, 3) and costs.widths == (1, 2, 3) and costs.draft_lengths == (1, 2)
    assert all(0 < x < 10 for row in costs.verify_s + costs.draft_s for x in row)
    assert costs.fingerprint.context_len == 12 and costs.meta["drafter"] == "dspark"
    assert StepCostTable.from_dict(json.loads(json.dumps(costs.to_dict()))) == costs


# ============================================================================ b. the policy by hand

# R = 1 drafts cheaply, R = 8 expensively: drafting pays for one request, not for eight.
PAYS_WHEN_IDLE = table((1, 8), verify=[[1.0, 1.1, 1.2, 1.3], [2.0, 3.5, 5.0, 6.5]],
                       draft=[[0.1, 0.1, 0.1], [4.0, 4.0, 4.0]])


def outcomes(policy: CostAwareScheduler, verified: list[int], accepted: list[int]) -> None:
    policy.observe_outcomes(torch.tensor(verified), torch.tensor(accepted))


def test_first_plan_is_optimistic_and_drafts_only_where_it_could_pay():
    """Before any outcome every draft counts as accepted with probability 0.9 (`optimism`): one request drafts
    γ; for eight, even every draft accepted would lose (Θ = 4 against 16/7.5, 24/9, 32/10.5)."""
    assert CostAwareScheduler(PAYS_WHEN_IDLE).plan(step_of(1, 3)) == 3  # Θ = 1, 1.9/1.2, 2.71/1.3, …
    assert CostAwareScheduler(PAYS_WHEN_IDLE).plan(step_of(8, 3)) == 0
    assert CostAwareScheduler(PAYS_WHEN_IDLE, optimism=1.0).plan(step_of(8, 3)) == 0


def test_plan_from_observed_acceptance():
    policy = CostAwareScheduler(PAYS_WHEN_IDLE, window=1e12, explore_every=100, cold_explorations=0)
    assert policy.may_skip_drafts  # so the loops defer the drafter's observations
    policy.plan(step_of(8, 3))  # the optimistic first plan
    outcomes(policy, [3] * 8, [3, 3, 3, 3, 2, 2, 1, 0])
    # Position 1 reached 8 times, accepted 7; position 2: 7, 6; position 3: 6, 4. Each shrunk toward the one
    # before (½ for the first) with the weight of 2 trials: q1 = (7 + 1)/10, q2 = (6 + 2 q1)/9, q3 = (4 + 2 q2)/8.
    q1 = 8 / 10
    q2 = (6 + 2 * q1) / 9
    q = [q1, q2, (4 + 2 * q2) / 8]
    assert policy.acceptance_rates(3) == pytest.approx(q)
    assert policy.acceptance_rates(4, optimistic=True) == pytest.approx([7.9 / 9, 6.9 / 8, 4.9 / 7, 0.9])
    gain = np.cumsum(np.cumprod(q))
    assert policy.expected_throughput(1, 3) == pytest.approx(
        [1.0, (1 + gain[0]) / 1.2, (1 + gain[1]) / 1.3, (1 + gain[2]) / 1.4])
    assert policy.plan(step_of(1, 3)) == 3  # one request: Θ = 1, 1.53, 1.94, 2.13
    assert policy.plan(step_of(8, 3)) == 0  # eight: plain 8/2 = 4 beats 1.96, 2.24, 2.27
    assert policy.plan(step_of(8, 0)) == 0


# Per request, drafting is borderline: plain 1/1.04 = 0.9615 tokens/s. After two requests drafted 3 and accepted 1
# and 0 (q = 2/4, 1/3, 1/3), the best plan is two drafts, 1.667/1.7 = 0.980: 2% better, under the 5% margin; the
# optimistic rates (1.9/3, 0.9/2, 0.9) make three drafts 2.174/1.8 = 1.208, 26% better: worth a trial.
BORDERLINE = table((1,), verify=[[1.04, 1.4, 1.5, 1.6]], draft=[[0.2] * 3])


def test_drafting_must_beat_plain_by_the_margin():
    # Per request: plain 1/1.0; one draft, always accepted so far (q = (10 + 1)/12), 1.917/1.8 = 1.065: 6.5% better.
    costs = table((1,), verify=[[1.0, 1.5]], draft=[[0.3]])
    for margin, plan in ((0.08, 0), (0.05, 1)):
        policy = CostAwareScheduler(costs, window=1e12, explore_every=100, margin=margin, cold_explorations=0)
        policy.plan(step_of(1, 1))
        outcomes(policy, [1] * 10, [1] * 10)
        assert policy.plan(step_of(1, 1)) == plan


def test_step_wall_times_correct_the_table_price_of_drafting():
    """The same borderline-losing table (draft 1: 1.95/1.9 against plain 1/1.0 per request, 5% margin): once the
    engine reports drafting steps at half their table price it drafts; plain steps reported at twice theirs
    work the same way. The first step of a kind sets its factor in full (a decayed mean, not an average pulled
    from 1); later, one stall (×100) moves a factor by at most ×4^(1/cost_window); learn_costs=False ignores."""
    costs = table((1,), verify=[[1.0, 1.6]], draft=[[0.3]])

    def trained(learn_costs=True) -> CostAwareScheduler:
        policy = CostAwareScheduler(costs, window=1e12, explore_every=100, cost_window=2, learn_costs=learn_costs,
                                    cold_explorations=0)
        policy.plan(step_of(1, 1))
        outcomes(policy, [1] * 10, [1] * 10)
        return policy

    policy = trained()
    assert policy.plan(step_of(1, 1)) == 0
    for _ in range(8):
        policy.observe_step_seconds(1, 1, 2, 0.95)  # table: 0.3 + 1.6 = 1.9
    assert policy.cost_factors[1] == pytest.approx(0.5, rel=1e-2) and policy.cost_factors[0] == 1.0
    assert policy.plan(step_of(1, 1)) == 1
    policy = trained()
    for _ in range(8):
        policy.observe_step_seconds(1, 0, 1, 2.0)
    assert policy.plan(step_of(1, 1)) == 1
    policy = trained()
    policy.observe_step_seconds(1, 1, 2, 0.95)
    assert policy.cost_factors[1] == pytest.approx(0.5) and policy.plan(step_of(1, 1)) == 1  # one is enough
    policy = trained()
    for _ in range(20):
        policy.observe_step_seconds(1, 0, 1, 1.0)
    policy.observe_step_seconds(1, 0, 1, 100.0)
    assert policy.cost_factors[0] == pytest.approx(2.0, rel=1e-4)  # clipped to ×4, weight 1 of 2 (cost_window 2)
    policy = trained(learn_costs=False)
    for _ in range(8):
        policy.observe_step_seconds(1, 1, 2, 0.95)
    assert policy.cost_factors == [1.0, 1.0] and policy.plan(step_of(1, 1)) == 0


def test_observe_feeds_outcomes_of_drafting_steps_and_timed_seconds():
    """`observe` (the protocol's one entry) counts a step's outcomes only if it drafted, and learns its price only
    if the loop timed it: `generate` passes None, the engine its clock's seconds."""
    policy = CostAwareScheduler(PAYS_WHEN_IDLE, window=1e12)
    policy.observe(StepOutcome([[5], [6]], [0, 0], [0, 0], None, draft_length=0, width=1), None)
    assert policy.trials == [] and policy.cost_factors == [1.0, 1.0]
    policy.observe(StepOutcome([[5, 6], [7]], [2, 1], [1, 0], None, draft_length=2, width=3), None)
    assert policy.trials == pytest.approx([2.0, 1.0]) and policy.accepts == pytest.approx([1.0, 0.0])
    policy.observe(StepOutcome([[5]], [0], [0], None, draft_length=0, width=1), 2.0)  # table: 1.0 for R = 1
    assert policy.cost_factors == pytest.approx([2.0, 1.0])


def test_exploration_plans_optimistically_every_explore_every_steps():
    policy = CostAwareScheduler(BORDERLINE, window=1e12, explore_every=4, cold_explorations=0)
    assert policy.plan(step_of(2, 3)) == 3  # nothing observed: optimistic
    outcomes(policy, [3, 3], [1, 0])
    assert policy.acceptance_rates(3) == pytest.approx([0.5, 1 / 3, 1 / 3])  # (1 + 1)/4, (0 + 1)/3, (0 + 2/3)/2
    assert policy.acceptance_rates(3, optimistic=True) == pytest.approx([1.9 / 3, 0.45, 0.9])
    assert [policy.plan(step_of(2, 3)) for _ in range(8)] == [0, 0, 0, 3, 0, 0, 0, 3]
    cold = CostAwareScheduler(BORDERLINE, window=1e12, explore_every=100)  # default: also on plans 1, 2, 4, 8
    cold.plan(step_of(2, 3))
    outcomes(cold, [3, 3], [1, 0])
    assert [cold.plan(step_of(2, 3)) > 0 for _ in range(1, 17)] == [n in (1, 2, 4, 8) for n in range(1, 17)]
    # Once the trials have shown what drafting gives, even the optimistic plan is a tie: no more trials.
    settled = CostAwareScheduler(BORDERLINE, window=1e12, explore_every=2, cold_explorations=0)
    settled.plan(step_of(8, 3))
    outcomes(settled, [3] * 8, [1, 1, 1, 1, 0, 0, 0, 0])  # optimistic best: 0.9661 per request, 0.5% over plain
    assert [settled.plan(step_of(8, 3)) for _ in range(6)] == [0] * 6


def test_outcome_counts_decay_by_step():
    policy = CostAwareScheduler(PAYS_WHEN_IDLE, window=2)
    outcomes(policy, [2, 0], [2, 0])  # a row verifying nothing reaches no position
    policy.plan(step_of(2, 3))  # a step later: counts halve
    outcomes(policy, [1, 3], [0, 1])
    # Position 1: 0.5·1 + 2 = 2.5 reached, 0.5·1 + 1 = 1.5 accepted; position 2: 0.5 + 1, 0.5 + 0; position 3
    # was verified but never reached (draft 2 was rejected first).
    assert policy.trials == pytest.approx([2.5, 1.5, 0.0]) and policy.accepts == pytest.approx([1.5, 0.5, 0.0])
    q1 = (1.5 + 2 * 0.5) / (2.5 + 2)
    q2 = (0.5 + 2 * q1) / (1.5 + 2)
    assert policy.acceptance_rates(3) == pytest.approx([q1, q2, q2])  # position 3 unreached: position 2's estimate
    outcomes(policy, [0, 0], [0, 0])  # a step with nothing verified adds nothing
    assert policy.trials == pytest.approx([2.5, 1.5, 0.0])
    policy.reset()
    assert policy.trials == [] and policy.acceptance_rates(2) == [0.5, 0.5]
    with pytest.raises(ValueError, match="prior_weight"):
        CostAwareScheduler(PAYS_WHEN_IDLE, prior_weight=0)


# Fill, for one request (R = 1), draft paid: Θ_w = (1 + Σ_{j≤w} a_j) / (0.5 + V(w + 1)), V = 1, 1.5, 2, 2.5.
FILL_COSTS = table((1,), verify=[[1.0, 1.5, 2.0, 2.5]], draft=[[0.5, 0.5, 0.5]])


@pytest.mark.parametrize(
    "conf, width",
    [
        ([0.9, 0.9, 0.9], 3),  # Θ = 0.67, 0.95, 1.08, 1.16: all admitted
        ([0.9, 0.5, 0.9], 1),  # a = 0.9, 0.45, 0.41: Θ = 0.67, 0.95, 0.94 (drop) → stop at 1, whatever comes after
        ([0.2, 0.9, 0.9], 0),  # Θ_1 = 1.2 / 2 = 0.6 < 0.67: verify nothing
    ],
)
def test_fill_admits_layers_until_the_first_drop(conf, width):
    policy = CostAwareScheduler(FILL_COSTS, early_stop=True)
    assert policy.choose(proposal_of([conf]), step_of(1, 3)).tolist() == [width]
    assert CostAwareScheduler(FILL_COSTS).choose(proposal_of([conf]), step_of(1, 3)).tolist() == [3]  # default: all


def test_fill_is_common_to_the_batch_and_respects_num_valid():
    policy = CostAwareScheduler(table((2,), verify=[[1.0, 1.0, 1.0]], draft=[[0.1, 0.1]]), early_stop=True)
    # Verify costs the same at every width: both layers are admitted for both rows, capped by num_valid.
    assert policy.choose(proposal_of([[0.9, 0.9], [0.1, 0.1]], num_valid=[2, 1]), step_of(2, 2)).tolist() == [2, 1]
    no_confidence = DraftProposal(torch.zeros(2, 2, dtype=torch.long), None, None, torch.tensor([2, 0]))
    assert policy.choose(no_confidence, step_of(2, 2)).tolist() == [2, 0]  # nothing to schedule on: verify all drafted


class PlanSpy(VerifyAll):
    """Wraps a policy and records each plan and each fill (with the γ of the proposal it got) in `events`."""

    may_skip_drafts = True

    def __init__(self, policy, events: list):
        self.policy, self.events = policy, events

    def plan(self, step):
        g = self.policy.plan(step)
        self.events.append(("plan", g))
        return g

    def choose(self, proposal, step):
        self.events.append(("fill", proposal.token_ids.shape[1]))
        return self.policy.choose(proposal, step)

    def observe(self, outcome, seconds):
        self.policy.observe(outcome, seconds)


class ProposeSpy:
    """Wraps a drafter; records each propose (the γ asked for) and replaces the `junk_at`-th proposal by
    deterministic drafts of a token the greedy target never follows with (all rejected)."""

    def __init__(self, drafter, events: list, junk_at: int | None = None):
        self.drafter, self.events, self.junk_at, self.calls = drafter, events, junk_at, 0
        self.junk_token = 0
        self.name, self.target_layer_ids = drafter.name, drafter.target_layer_ids

    def start(self, *args):
        return self.drafter.start(*args)

    def reset(self, *args):
        self.drafter.reset(*args)

    def observe(self, *args):
        self.drafter.observe(*args)

    def propose(self, state, step):
        self.events.append(("propose", step.num_drafts))
        out = self.drafter.propose(state, step)
        self.calls += 1
        if self.calls == self.junk_at:
            junk = torch.full_like(out.token_ids, self.junk_token)
            out = DraftProposal(junk, None, torch.full_like(out.confidence_logits, 8.0))
        return out


# Six requests: drafting 1 pays iff q_1 > 0.2; the estimates are the last step's outcomes only (window 1).
SIX = table((1, 6), verify=[[1.0, 1.1, 1.2, 1.3], [1.0, 1.2, 1.4, 1.6]], draft=[[0.1] * 3, [0.5] * 3])


def _run_with_spies(target: TargetModel, junk_at: int | None) -> tuple[list, list[list[int]]]:
    config = GenerationConfig(max_new_tokens=16, num_drafts=3)
    plain = generate(target, NoDrafter(), GREEDY_PROMPTS, config)
    bigram = torch.zeros(target.vocab_size, dtype=torch.long)  # drafts that follow the target: accepted
    for prompt, r in zip(GREEDY_PROMPTS, plain):
        for a, b in zip(prompt[-1:] + r.output_ids, r.output_ids):
            bigram[a] = b
    events: list = []
    drafter = ProposeSpy(dspark_with_random_confidence(target, conf_scale=0.5, bigram=bigram), events, junk_at)
    drafter.junk_token = next(t for t in range(target.vocab_size) if all(t not in r.output_ids for r in plain))
    policy = PlanSpy(CostAwareScheduler(SIX, window=1, explore_every=100), events)
    out = generate(target, drafter, GREEDY_PROMPTS, config, policy=policy)
    return events, [r.output_ids for r in out]


def test_the_plan_is_made_before_and_without_the_current_drafts(qwen3_target: TargetModel):
    """Each plan comes before its step's propose, which asks for exactly the planned γ; replacing the second
    proposal by drafts that are all rejected changes no plan made up to that step, only later ones."""
    events, tokens = _run_with_spies(qwen3_target, junk_at=None)
    junk_events, junk_tokens = _run_with_spies(qwen3_target, junk_at=2)
    for evs in (events, junk_events):
        for i, (kind, g) in enumerate(evs):
            if kind == "propose":
                assert i > 0 and evs[i - 1] == ("plan", g), "a draft forward must follow its own plan directly"
            if kind == "fill":
                assert evs[i - 1] == ("propose", g), "the fill sees the proposal the plan asked for"
    plans = [g for kind, g in events if kind == "plan"]
    junk_plans = [g for kind, g in junk_events if kind == "plan"]
    second_propose = [i for i, (kind, _) in enumerate(junk_events) if kind == "propose"][1]
    made_before = sum(1 for kind, _ in junk_events[:second_propose] if kind == "plan")
    assert junk_plans[:made_before] == plans[:made_before]
    assert junk_plans[made_before] == 0 and junk_plans != plans, "rejected drafts should stop the next draft"
    assert 0 in junk_plans and 3 in junk_plans
    assert junk_tokens == tokens  # greedy: lossless whatever the plans


# ============================================================================ c. losslessness through generate


class Alternating(CostAwareScheduler):
    """Test double: the real fill and outcome counts, but a plan that drafts γ on odd steps and nothing on
    even ones, so every other step skips the draft forward whatever the acceptance."""

    def plan(self, step: DraftStep) -> int:
        super().plan(step)
        return step.num_drafts if self.num_plans % 2 == 1 else 0


def alternating_policy(early_stop: bool = False) -> CostAwareScheduler:
    return Alternating(PAYS_WHEN_IDLE, early_stop=early_stop)


@pytest.mark.parametrize("early_stop", [False, True], ids=["verify-all", "early-stop"])
@pytest.mark.parametrize("draft", ["random", "bigram"])
def test_greedy_output_equals_plain_decoding_with_skipped_drafts(qwen3_target: TargetModel, draft: str, early_stop):
    config = GenerationConfig(max_new_tokens=20, num_drafts=3, temperature=0.0)
    plain = [r.output_ids for r in generate(qwen3_target, NoDrafter(), GREEDY_PROMPTS, config)]
    bigram = None
    if draft == "bigram":
        bigram = torch.zeros(qwen3_target.vocab_size, dtype=torch.long)
        for prompt, out in zip(GREEDY_PROMPTS, plain):
            for a, b in zip(prompt[-1:] + out, out):
                bigram[a] = b
    drafter = dspark_with_random_confidence(qwen3_target, conf_scale=0.5, bigram=bigram)
    calls = []
    real = drafter.propose
    drafter.propose = lambda state, step: calls.append(step.num_drafts) or real(state, step)
    results = generate(qwen3_target, drafter, GREEDY_PROMPTS, config, policy=alternating_policy(early_stop))
    assert [r.output_ids for r in results] == plain
    steps = max(r.counters.num_steps for r in results)
    assert 0 < len(calls) < steps, f"{len(calls)} draft forwards in {steps} steps: no step skipped drafting"
    for r in results:
        assert len(r.counters.confidence_logits) == r.counters.num_steps  # skipped steps record [] (aligned)
        assert [len(c) for c in r.counters.confidence_logits] == r.counters.num_verified


class EveryFourth(CostAwareScheduler):
    """Test double: drafts γ on steps 1, 5, 9, …, nothing in between (three plain steps in a row)."""

    def plan(self, step: DraftStep) -> int:
        super().plan(step)
        return step.num_drafts if self.num_plans % 4 == 1 else 0


def recording_drafter(target: TargetModel):
    """A DSpark drafter that records its calls in order: ("observe", [positions per row]) and ("propose",)."""
    drafter = dspark_with_random_confidence(target, conf_scale=0.5)
    calls = []
    real_observe, real_propose = drafter.observe, drafter.propose
    drafter.observe = lambda state, rows, ids, feats, num_new: (calls.append(("observe", num_new.tolist()))
                                                               or real_observe(state, rows, ids, feats, num_new))
    drafter.propose = lambda state, step: calls.append(("propose",)) or real_propose(state, step)
    return drafter, calls


@pytest.mark.parametrize("max_parked", [None, 2], ids=["batched", "buffer-full"])
def test_the_drafter_observes_held_back_positions_before_it_drafts(qwen3_target: TargetModel, monkeypatch,
                                                                    max_parked: int | None):
    """Steps without drafts hold the new positions back; the next draft step hands them over in one batched
    observe (or earlier, when a slot's buffer is full: two positions here, so the prompts go over at once),
    so the drafter's context is complete whenever it drafts (DSpark checks) and greedy outputs stay plain
    decoding."""
    import dspark_core.drafters.deferred as deferred

    config = GenerationConfig(max_new_tokens=20, num_drafts=3)
    plain = [r.output_ids for r in generate(qwen3_target, NoDrafter(), GREEDY_PROMPTS, config)]
    drafter, calls = recording_drafter(qwen3_target)
    if max_parked is not None:  # the bound is in bytes of target features: two positions' worth
        position_bytes = len(drafter.target_layer_ids) * qwen3_target.hidden_size * 4
        monkeypatch.setattr(deferred, "MAX_PARKED_BYTES", max_parked * position_bytes)
    results = generate(qwen3_target, drafter, GREEDY_PROMPTS, config, policy=EveryFourth(PAYS_WHEN_IDLE))
    assert [r.output_ids for r in results] == plain
    proposes = [i for i, c in enumerate(calls) if c[0] == "propose"]
    assert len(proposes) >= 3
    # Between two draft steps: the observe of the first one's outcome, then the three held-back positions.
    handed_over = [calls[i - 1] for i in proposes[1:]]
    if max_parked is None:
        assert all(c[0] == "observe" and set(c[1]) == {3} for c in handed_over), handed_over
    else:  # two positions go over when the buffer fills, the third just before the draft
        assert all(c[0] == "observe" and set(c[1]) == {1} for c in handed_over), handed_over
    steps = max(r.counters.num_steps for r in results)
    assert len(calls) - len(proposes) < 1 + steps  # fewer observes than prefill + one per step


class NeverDrafts(CostAwareScheduler):
    """Test double: plans no draft, ever (a load where drafting never pays)."""

    def plan(self, step: DraftStep) -> int:
        super().plan(step)
        return 0


def test_a_planning_policy_defers_the_prompts_to_the_first_draft(qwen3_target: TargetModel):
    """With a policy that plans draft lengths the prefill does not hand the prompts to the drafter: a request
    that is never drafted for never costs a draft forward over its prompt, and one that is gets its prompt
    observed (before its parked positions) just before its first draft."""
    config = GenerationConfig(max_new_tokens=12, num_drafts=3)
    plain = [r.output_ids for r in generate(qwen3_target, NoDrafter(), GREEDY_PROMPTS, config)]
    for policy, drafts in ((NeverDrafts(PAYS_WHEN_IDLE), False), (EveryFourth(PAYS_WHEN_IDLE), True)):
        drafter, calls = recording_drafter(qwen3_target)
        results = generate(qwen3_target, drafter, GREEDY_PROMPTS, config, policy=policy)
        assert [r.output_ids for r in results] == plain
        if not drafts:
            assert calls == []
        else:  # step 1 drafts: the prompts go over just before it (the prefill's token is its anchor)
            assert calls[0] == ("observe", [len(p) for p in GREEDY_PROMPTS]) and calls[1] == ("propose",)


@pytest.mark.parametrize("early_stop", [False, True], ids=["verify-all", "early-stop"])
def test_sampling_with_skipped_drafts_matches_exact_distribution(early_stop: bool):
    """20,000 requests of the V = 8 target, steps alternating a draft of γ and none: tokens 2–3 come from a
    draft step, then from a plain step or a draft that follows one; the law of tokens 1–3 is exact."""
    target = small_target()
    law = exact_joint(target.model, SAMPLING_PROMPT, NUM_TOKENS, 1.0)
    drafter = dspark_with_random_confidence(target, seed=1, conf_scale=1.0, bias=0.5)
    config = GenerationConfig(max_new_tokens=NUM_TOKENS + 2, num_drafts=3, temperature=1.0)
    generators = [torch.Generator().manual_seed(7 + i) for i in range(NUM_SAMPLES)]
    calls = []
    real = drafter.propose
    drafter.propose = lambda state, step: calls.append(step.num_drafts) or real(state, step)
    policy = alternating_policy(early_stop)
    results = generate(target, drafter, [SAMPLING_PROMPT] * NUM_SAMPLES, config, generators, policy=policy)
    p = chi2_gof(count_prefixes((r.output_ids for r in results), NUM_TOKENS, 8), law)[2]
    first = np.bincount([r.counters.num_verified[0] for r in results], minlength=3)
    second = np.bincount([r.counters.num_verified[1] for r in results if r.counters.num_steps > 1], minlength=3)
    print(f"χ² p = {p:.3f}; draft forwards {calls}; verify lengths step 1 {first.tolist()}, step 2 {second.tolist()}")
    assert p > ALPHA, f"samples do not follow the target (χ² p = {p:.2g})"
    assert calls[:1] == [3] and len(calls) < max(r.counters.num_steps for r in results)
    assert second[0] > NUM_SAMPLES // 2, "the second step should be a plain one for most requests"


# The appendix counter-example with the per-layer fill (R = 1 per request, draft cost paid): the step costs
# below reproduce test_scheduler's COUNTER_TABLE (SPS 100, 60, 55 → seconds 1/100, 1/60, 1/55).
COUNTER_COSTS = table((1,), verify=[[1 / 100, 1 / 60, 1 / 55]], draft=[[1e-9, 1e-9]])


class NoEarlyStopFill(CostAwareScheduler):
    """DELIBERATELY WRONG: verifies the width that maximises Θ overall, looking past drops."""

    def admitted_layers(self, theta, layer_gain):
        return theta.argmax()


def test_fill_keeps_the_counter_example_lossless_and_its_argmax_variant_does_not():
    first, second, high = _sample_counter_example(NoEarlyStopFill(COUNTER_COSTS, early_stop=True))
    p_wrong = stats.binomtest(int((first == A).sum()), len(first), 0.7).pvalue
    print(f"fill without early stop: P(A) = {(first == A).mean():.3f} (p = {p_wrong:.2g})")
    assert p_wrong < BROKEN_ALPHA

    first, second, high = _sample_counter_example(CostAwareScheduler(COUNTER_COSTS, early_stop=True))
    p_first = stats.binomtest(int((first == A).sum()), len(first), 0.7).pvalue
    p_low = stats.binomtest(int((first[~high] == A).sum()), int((~high).sum()), 0.7).pvalue
    pair_counts = np.zeros((2, 2), dtype=np.int64)
    np.add.at(pair_counts, (first, second), 1)
    p_pair = chi2_gof(pair_counts, np.outer([0.7, 0.3], [0.7, 0.3]))[2]
    print(f"fill with early stop: P(A) = {(first == A).mean():.3f}; low c_1 p = {p_low:.3f}; "
          f"pair χ² p = {p_pair:.3f}")
    assert min(p_first, p_low, p_pair) > ALPHA
