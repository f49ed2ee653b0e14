"""The in-house engine: continuous batching changes when requests run, never what they produce."""

from __future__ import annotations

import pytest
import torch

from backends.inhouse.engine import Engine, EngineConfig, Request
from backends.inhouse.load import LoadSpec, run_load
from dspark_core.drafters import NgramDrafter, NoDrafter, as_drafter, build_draft_model, draft_config_for
from dspark_core.generate import GenerationConfig, generate

PROMPT_LENGTHS = (3, 9, 1, 14, 6, 11, 4, 8, 17, 2)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(7)
    out = []
    for i, n in enumerate(PROMPT_LENGTHS):
        p = torch.randint(0, 90, (n,), generator=g).tolist()
        out.append(p + p[: n // 2] if i % 3 == 0 else p)  # some repetition so n-gram drafts get accepted
    return out


def _dspark(target):
    config = draft_config_for(target, "dspark", mask_token_id=95, num_layers=1, markov_rank=16)
    torch.manual_seed(0)
    model = build_draft_model(config)
    model.copy_target_embeddings(target.input_embeddings(), target.output_embeddings())
    return as_drafter(model)


def _draft_model(target):
    """A separate causal LM as the draft: the target's first decoder layer with its embeddings and head."""
    import copy

    from dspark_core.drafters import DraftModelDrafter

    config = copy.deepcopy(target.model.config)
    config.num_hidden_layers, config.layer_types = 1, config.layer_types[:1]
    draft = type(target.model)(config).eval()
    draft.load_state_dict(target.model.state_dict(), strict=False)
    return DraftModelDrafter(draft, target=target)


def _requests(prompts, temperature, max_new=(12, 5, 20, 9)):
    return [
        Request(f"r{i}", p, max_new_tokens=max_new[i % len(max_new)], temperature=temperature, seed=100 + i)
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize("drafter_name", ["none", "ngram", "dspark", "draft_model"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continuous_batching_reproduces_generate_exactly(qwen3_target, prompts, drafter_name, temperature):
    """Fewer slots than requests, different budgets: each request's tokens equal a solo `generate` run with
    the same seed — greedy and sampled alike, since a request draws only from its own generator. Slots are
    reused, so a drafter with per-slot state (the draft model's KV cache) must forget the previous request."""
    drafter = {"none": NoDrafter, "ngram": NgramDrafter, "dspark": lambda: _dspark(qwen3_target),
               "draft_model": lambda: _draft_model(qwen3_target)}[drafter_name]()
    engine = Engine(qwen3_target, drafter, EngineConfig(num_slots=3, max_context=64, num_drafts=3))
    done = {c.request.request_id: c for c in engine.run_to_completion(_requests(prompts, temperature))}
    assert len(done) == len(prompts)
    for req in _requests(prompts, temperature):
        config = GenerationConfig(max_new_tokens=req.max_new_tokens, num_drafts=3, temperature=temperature)
        (solo,) = generate(qwen3_target, drafter, [req.prompt_ids], config,
                           generators=[torch.Generator().manual_seed(req.seed)])
        got = done[req.request_id]
        assert got.output_ids == solo.output_ids, req.request_id
        assert got.counters.num_accepted == solo.counters.num_accepted
        assert got.first_token_s <= got.finish_s and got.emissions[0][1] == 1
        assert sum(n for _, n in got.emissions) == len(got.output_ids)
    assert max(s.batch_size for s in engine.steps) <= 3


def test_requests_join_as_others_finish(qwen3_target, prompts):
    engine = Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=2, max_context=64))
    engine.run_to_completion(_requests(prompts, 0.0))
    assert sum(s.num_prefilled for s in engine.steps) == len(prompts)  # every request prefilled once
    assert sum(1 for s in engine.steps if s.batch_size == 2) > len(engine.steps) // 2


def test_closed_loop_keeps_concurrency_and_runs_follow_up_turns(qwen3_target, prompts):
    engine = Engine(qwen3_target, NgramDrafter(), EngineConfig(num_slots=8, max_context=96, num_drafts=3))
    first = _requests(prompts, 0.0)
    seen = []

    def next_turn(conv, turn, done):
        seen.append((conv, turn))
        if turn == 0 and conv % 2 == 0:  # a second turn that follows the model's own answer
            return Request(f"c{conv}t1", done.request.prompt_ids + done.output_ids + [5, 6], max_new_tokens=4,
                           seed=done.request.seed + 1)
        return None

    result = run_load(engine, first, LoadSpec(concurrency=3, warmup=2), next_turn)
    assert len(result.completed) == len(prompts) + (len(prompts) + 1) // 2
    assert max(s.batch_size for s in result.steps) <= 3
    assert {f"r{i}" for i in range(2)} <= result.warmup_ids and "c0t1" in result.warmup_ids
    assert all(c.request.request_id not in result.warmup_ids for c in result.measured)
    assert result.window[0] <= min(c.arrival_s for c in result.measured)


def test_open_loop_poisson_arrivals_are_seeded(qwen3_target, prompts):
    class FakeClock:  # time itself is outside the unit: a clock that advances 10 ms per reading
        def __init__(self):
            self.t = 0.0

        def __call__(self):
            self.t += 0.01
            return self.t

    def run(seed):
        clock = FakeClock()
        engine = Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=4, max_context=64), clock=clock)
        result = run_load(engine, _requests(prompts[:6], 0.0), LoadSpec(rate=5.0, seed=seed),
                          sleep=lambda s: setattr(clock, "t", clock.t + s))
        return sorted(c.arrival_s for c in result.completed)

    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    gaps = [y - x for x, y in zip([0.0] + a, a)]
    assert all(g > 0 for g in gaps)


def test_bad_requests_are_refused_with_reasons(qwen3_target):
    engine = Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=2, max_context=16))
    with pytest.raises(ValueError, match="exceeds the engine's max_context 16"):
        engine.submit(Request("long", [1] * 10, max_new_tokens=10))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.submit(Request("empty", [], max_new_tokens=4))
    with pytest.raises(ValueError, match="exactly one"):
        LoadSpec(concurrency=2, rate=1.0)


def test_online_calibrator_sees_every_verified_step(qwen3_target, prompts):
    from dspark_core.calibration import OnlineCalibrator

    calibrator = OnlineCalibrator(gamma=3, window=256, refit_every=8, min_cycles=8)
    engine = Engine(qwen3_target, _dspark(qwen3_target), EngineConfig(num_slots=4, max_context=64, num_drafts=3),
                    calibrator=calibrator)
    done = engine.run_to_completion(_requests(prompts, 1.0))
    assert calibrator.num_seen == sum(c.counters.num_steps for c in done)
    assert calibrator.num_fits >= 1


def _pays_when_idle(alternate: bool = False):
    """Step costs where drafting pays for one request and, even if every draft were accepted, not for three.
    With `alternate`, a test double of the policy that drafts on every other step whatever the costs."""
    from dspark_core.scheduler import CostAwareScheduler
    from dspark_core.costs import StepCostTable

    costs = StepCostTable((1, 3), (1, 2, 3, 4), ((1.0, 1.1, 1.2, 1.3), (2.0, 3.5, 5.0, 6.5)), (1, 2, 3),
                          ((0.1, 0.1, 0.1), (4.0, 4.0, 4.0)))

    class Alternating(CostAwareScheduler):
        def plan(self, step):
            super().plan(step)
            return step.num_drafts if self.num_plans % 2 == 1 else 0

    # learn_costs=False: the table is in made-up seconds; learning from real step times would rescale it.
    return (Alternating if alternate else CostAwareScheduler)(costs, learn_costs=False)


def test_skipping_the_draft_forward_keeps_greedy_outputs_exact(qwen3_target, prompts):
    """Steps with and without the draft forward alternate; every request's greedy tokens still equal plain
    decoding, every step records what it drafted, and only drafted steps reach the calibrator."""
    from dspark_core.calibration import OnlineCalibrator

    calibrator = OnlineCalibrator(gamma=3, window=256, refit_every=8, min_cycles=8)
    engine = Engine(qwen3_target, _dspark(qwen3_target), EngineConfig(num_slots=3, max_context=64, num_drafts=3),
                    _pays_when_idle(alternate=True), calibrator=calibrator)
    done = {c.request.request_id: c for c in engine.run_to_completion(_requests(prompts, 0.0))}
    plain = Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=3, max_context=64))
    for c in plain.run_to_completion(_requests(prompts, 0.0)):
        assert done[c.request.request_id].output_ids == c.output_ids, c.request.request_id
    lengths = [s.draft_length for s in engine.steps if s.batch_size]
    assert 0 in lengths and 3 in lengths, f"draft lengths {lengths}: no mix of skipped and drafted steps"
    assert all(s.num_verified == 0 for s in engine.steps if s.draft_length == 0)
    drafted_cycles = sum(s.batch_size for s in engine.steps if s.draft_length > 0)
    assert calibrator.num_seen == drafted_cycles  # steps without drafts teach the calibrator nothing
    for c in done.values():
        assert len(c.counters.confidence_logits) == c.counters.num_steps


def test_cost_aware_policy_drafts_only_for_a_small_batch(qwen3_target, prompts):
    """Three busy slots: drafting cannot pay even if every draft were accepted, so no draft forward runs;
    once the engine drains to one request, the (optimistic) plan tries drafting."""
    engine = Engine(qwen3_target, _dspark(qwen3_target), EngineConfig(num_slots=3, max_context=64, num_drafts=3),
                    _pays_when_idle())
    done = engine.run_to_completion(_requests(prompts, 0.0))
    assert all(s.draft_length == 0 for s in engine.steps if s.batch_size == 3)
    assert any(s.draft_length > 0 for s in engine.steps if s.batch_size == 1)
    plain = {c.request.request_id: c.output_ids for c in
             Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=3, max_context=64)).run_to_completion(
                 _requests(prompts, 0.0))}
    assert all(c.output_ids == plain[c.request.request_id] for c in done)


class SteppingClock:
    """Time is outside the unit: a clock that advances 1 ms per reading (a test moves `t` on as well)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 0.001
        return self.t


def test_the_engine_times_each_step_and_tells_the_policy(qwen3_target, prompts):
    """The engine, not the step, owns the clock: every speculative step's outcome reaches the policy with the
    seconds the engine's clock measured around it; steps without drafts report g = 0 and width 1."""
    reports = []

    alternating = _pays_when_idle(alternate=True)

    class Recording(type(alternating)):
        def observe(self, outcome, seconds):
            reports.append((len(outcome.num_verified), outcome.draft_length, outcome.width, seconds))
            super().observe(outcome, seconds)

    policy = Recording(alternating.costs, learn_costs=False)
    engine = Engine(qwen3_target, _dspark(qwen3_target), EngineConfig(num_slots=3, max_context=64, num_drafts=3),
                    policy, clock=SteppingClock())
    engine.run_to_completion(_requests(prompts[:5], 0.0))
    assert len(reports) == sum(1 for s in engine.steps if s.batch_size)
    assert [(r, g) for r, g, _, _ in reports] == [(s.batch_size, s.draft_length) for s in engine.steps if s.batch_size]
    assert {g for _, g, _, _ in reports} == {0, 3}
    assert all(w == 1 for _, g, w, _ in reports if g == 0) and all(1 <= w <= g + 1 for _, g, w, _ in reports)
    assert all(0 < s < 0.01 for *_, s in reports)  # a few clock readings around each step, nothing else


def test_reported_step_times_leave_out_the_hand_over_of_parked_positions(qwen3_target, prompts):
    """The first drafting step after steps without drafts first hands what they parked to the drafter; that
    observe is the plain steps' price, so the seconds the engine reports for the drafting step leave it out
    (else drafting would look dearer the rarer it is). Every drafter observe here takes 100 s on the engine's
    clock: a drafting step reports its own observe (100 s), never a hand-over; plain steps observe nothing."""
    reports = []

    alternating = _pays_when_idle(alternate=True)

    class Recording(type(alternating)):
        def observe(self, outcome, seconds):
            reports.append((outcome.draft_length, seconds))
            super().observe(outcome, seconds)

    clock = SteppingClock()
    drafter = _dspark(qwen3_target)
    real_observe = drafter.observe

    def slow_observe(*args):
        clock.t += 100.0
        real_observe(*args)

    drafter.observe = slow_observe
    engine = Engine(qwen3_target, drafter, EngineConfig(num_slots=3, max_context=64, num_drafts=3),
                    Recording(alternating.costs, learn_costs=False), clock=clock)
    engine.run_to_completion(_requests(prompts[:5], 0.0))
    assert engine.deferred is not None and engine.deferred.handover_seconds >= 200.0  # prompts, then parked steps
    assert {g for g, _ in reports} == {0, 3}
    assert all(s < 1.0 for g, s in reports if g == 0)
    assert all(100.0 < s < 101.0 for g, s in reports if g > 0)


def test_active_slots_stay_contiguous(qwen3_target, prompts, monkeypatch):
    """The lowest free slot is used first: when every slot is busy the rows are 0 … n − 1, and as the engine
    drains they stay the lowest slots in use (so the target reads KV slots in place more often)."""
    import backends.inhouse.engine as engine_module

    seen = []
    real = engine_module.speculative_step
    monkeypatch.setattr(engine_module, "speculative_step",
                        lambda *a, **kw: seen.append(a[3].tolist()) or real(*a, **kw))
    engine = Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=4, max_context=64))
    engine.run_to_completion(_requests(prompts, 0.0))
    full = [rows for rows in seen if len(rows) == 4]
    assert full and all(rows == [0, 1, 2, 3] for rows in full)
    assert len(seen) > len(full)


def test_a_finished_request_empties_its_slot_at_once(qwen3_target, prompts, monkeypatch):
    """Idle slots hold nothing (target and drafter), so a step over rows with holes runs over the slot range
    around them in place (`kv_slots.covering_range`) instead of gathering a copy; outputs stay exact."""
    import backends.inhouse.engine as engine_module
    import dspark_core.target as target_module

    drafter = _dspark(qwen3_target)
    engine = Engine(qwen3_target, drafter, EngineConfig(num_slots=4, max_context=64, num_drafts=3))
    idle_lengths, covered = [], []
    real_step, real_cover = engine_module.speculative_step, target_module.covering_range

    def step(target, drafter_, state, rows, *a, **kw):
        idle = [r for r in range(4) if r not in rows.tolist()]
        idle_lengths.extend(int(state.target_cache.lengths[r]) + int(state.draft_state.lengths[r]) for r in idle)
        return real_step(target, drafter_, state, rows, *a, **kw)

    monkeypatch.setattr(engine_module, "speculative_step", step)
    monkeypatch.setattr(target_module, "covering_range",
                        lambda lengths, rows: covered.append(real_cover(lengths, rows)) or covered[-1])
    requests = _requests(prompts, 0.0, max_new=(20, 3, 20, 20))  # slot 1 frees early, nothing waits to fill it
    done = {c.request.request_id: c for c in engine.run_to_completion(requests[:4])}
    for req in requests[:4]:
        config = GenerationConfig(max_new_tokens=req.max_new_tokens, num_drafts=3)
        (solo,) = generate(qwen3_target, drafter, [req.prompt_ids], config)
        assert done[req.request_id].output_ids == solo.output_ids
    assert idle_lengths and set(idle_lengths) == {0}
    assert any(c is not None for c in covered)


def test_abort_frees_a_slot_or_drops_a_waiting_request(qwen3_target, prompts):
    engine = Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=1, max_context=64))
    engine.submit(Request("a", prompts[0], max_new_tokens=20))
    engine.submit(Request("b", prompts[1], max_new_tokens=20))
    engine.step()
    engine.step()
    assert [r.request.request_id for r in engine.running()] == ["a"] and engine.num_waiting == 1
    waiting = engine.abort("b")
    assert waiting.finish_reason == "abort" and waiting.output_ids == [] and engine.num_waiting == 0
    running = engine.abort("a")
    assert running.finish_reason == "abort" and len(running.output_ids) == 3  # prefill token + two steps
    assert engine.running() == [] and not engine.has_work
    assert engine.abort("a") is None and engine.abort("never") is None
    engine.submit(Request("c", prompts[0], max_new_tokens=4))  # the freed slot serves the next request
    done = engine.run_to_completion([])
    plain = Engine(qwen3_target, NoDrafter(), EngineConfig(num_slots=1, max_context=64))
    assert done[0].output_ids == plain.run_to_completion([Request("c", prompts[0], max_new_tokens=4)])[0].output_ids
