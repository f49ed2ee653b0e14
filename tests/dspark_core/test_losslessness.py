"""The core promise: speculative decoding emits exactly the target's distribution, whatever the draft.

a. Greedy: every drafter × γ gives plain greedy decoding token for token (and Hugging Face's
   `generate(do_sample=False)`), over a batch of prompts of different lengths with a stop token and
   a token budget.
b. Sampling: on an 8-token target the exact joint law of the first 3 tokens is enumerated with plain
   forwards; 20,000 samples from `generate` (one batch, a generator per request) must fit it (χ²),
   and two deliberately broken verifiers must fail the same test, so the test is known to bite.
c. Counters: every result's raw counters agree with what it emitted.

Drafters are listed as `DrafterCase`s: extend `GREEDY_DRAFTERS` / `SAMPLING_DRAFTERS` (e.g. with
trained checkpoints, each with the target it was trained for) and every check runs on them.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

import dspark_core.generate as generate_module
from conftest import tiny_qwen3
from dspark_core import verification
from dspark_core.distributions import draw_uniforms, is_greedy, sample_from_probs
from dspark_core.drafters import (
    DraftProposal,
    DraftStep,
    Drafter,
    DSparkModel,
    Eagle3Model,
    NgramDrafter,
    NoDrafter,
    as_drafter,
    build_draft_model,
    draft_config_for,
)
from dspark_core.generate import GenerationConfig, GenerationResult, generate
from dspark_core.target import TargetModel
from exact_distribution import chi2_gof, count_prefixes, exact_joint

ALPHA = 1e-3  # a correct sampler fails a χ² test this often by chance; the seeds are fixed, so a pass stays a pass
BROKEN_ALPHA = 1e-6  # a broken verifier must fail by at least this much


# ============================================================================ drafters under test


class PeakedWrongDrafter:
    """A deliberately bad draft (a test double: it is outside the verifier under test).

    p_d(· | prev) puts `peak` on one token, a fixed shuffle of the previous token, and spreads the rest
    evenly: far from any target and confidently wrong. It drafts sequentially (each token conditions
    on the one drafted before it) and reports its exact distribution, as the protocol requires.
    """

    name = "bad"
    target_layer_ids: tuple[int, ...] = ()

    def __init__(self, vocab_size: int, peak: float = 0.85, shift: int = 3):
        self.vocab_size, self.peak, self.shift = vocab_size, peak, shift

    def start(self, num_slots: int, capacity: int) -> None:
        return None

    def reset(self, state: None, rows: torch.Tensor) -> None:
        pass

    def observe(self, state, rows, token_ids, features, num_new) -> None:
        pass

    def distribution(self, prev: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
        wrong = (prev * self.shift + 1) % self.vocab_size
        one_hot = torch.nn.functional.one_hot(wrong, self.vocab_size).float()
        soft = one_hot * self.peak + (1 - one_hot) * (1 - self.peak) / (self.vocab_size - 1)
        return torch.where(is_greedy(temperatures)[:, None], one_hot, soft)

    def propose(self, state: None, step: DraftStep) -> DraftProposal:
        uniforms = draw_uniforms(step.generators, step.num_drafts)
        prev, tokens, probs = step.anchor_ids, [], []
        for k in range(step.num_drafts):
            p = self.distribution(prev, step.temperatures)
            prev = sample_from_probs(p, uniforms[:, k])
            tokens.append(prev)
            probs.append(p)
        return DraftProposal(torch.stack(tokens, 1), torch.stack(probs, 1), None)


@dataclass(frozen=True)
class DrafterCase:
    """How to build one drafter for a target. `bigram` is the target's greedy successor of each token
    (from plain decoding of the test prompts), for drafts built to agree with the target. A draft
    trained for a particular target (a checkpoint) names it in `target`; otherwise the module's
    default target is used (tiny Qwen3 for greedy, the V = 8 one for sampling)."""

    id: str
    build: Callable[[TargetModel, torch.Tensor], Drafter]
    min_acceptance: float = 0.0  # greedy: first-draft acceptance rate over the batch must exceed this
    has_confidence: bool = False
    target: Callable[[], TargetModel] | None = None

    def target_or(self, default: TargetModel) -> TargetModel:
        return self.target() if self.target is not None else default


def _draft_model(target: TargetModel, method: str, head: str = "markov", seed: int = 0, **kw):
    torch.manual_seed(seed)
    num_layers = 1 if method == "eagle3" else 2
    cfg = draft_config_for(target, method, mask_token_id=target.vocab_size - 1, head=head, num_layers=num_layers, **kw)
    return build_draft_model(cfg).eval()


def draft_vocabulary(vocab: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """A reduced draft vocabulary: half the target's tokens (at least every one in `keep`), the others a
    fixed random choice, so the draft has probability 0 on the rest and the verifier must still emit them."""
    kept = set((keep if keep is not None else torch.empty(0, dtype=torch.long)).tolist())
    size = max(vocab // 2, len(kept))
    rest = [t for t in torch.randperm(vocab, generator=torch.Generator().manual_seed(5)).tolist() if t not in kept]
    return torch.tensor(sorted(kept | set(rest[: size - len(kept)])))


def _subvocab_draft_model(target: TargetModel, method: str, head: str, keep: torch.Tensor | None = None, **kw):
    ids = draft_vocabulary(target.vocab_size, keep)
    model = _draft_model(target, method, head, draft_vocab_size=len(ids), **kw)
    model.set_draft_vocabulary(ids)
    return model


def random_draft(method: str, head: str = "markov", seed: int = 0, markov_scale: float = 1.0, subvocab: bool = False):
    """An untrained draft; `markov_scale` > 0 gives the (zero-initialised) Markov W2 random weights so
    that p_d really depends on the previously drafted token. `subvocab`: over half the target's tokens."""

    def build(target: TargetModel, bigram: torch.Tensor) -> Drafter:
        if subvocab:
            model = _subvocab_draft_model(target, method, head, seed=seed, markov_rank=8)
        else:
            model = _draft_model(target, method, head, seed, markov_rank=8)
        if isinstance(model, DSparkModel) and model.markov_head is not None and markov_scale:
            with torch.no_grad():
                model.markov_head.markov_w1.weight.normal_(0, 1)
                model.markov_head.markov_w2.weight.normal_(0, markov_scale)
        return as_drafter(model)

    return build


def _zero_layers(model: DSparkModel | Eagle3Model) -> None:
    """Every draft layer adds nothing to the residual stream: h = norm(input)."""
    for layer in model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()


def _bigram_lm_head(model: DSparkModel | Eagle3Model, bigram: torch.Tensor, strength: float = 20.0) -> None:
    """Least-squares lm_head so that lm_head(norm(embed(a))) peaks on bigram[a]."""
    vocab = bigram.numel()
    x = model.norm(model.embed_tokens.weight)  # [V, hidden]
    y = torch.full((vocab, vocab), -strength / vocab)
    y[torch.arange(vocab), bigram] = strength
    model.lm_head.weight.copy_(torch.linalg.lstsq(x, y).solution.T)


def good_subvocab_draft():
    """The good DSpark-Markov draft over a reduced vocabulary that holds every bigram successor (and half
    the vocabulary in all): W2 is one-hot on the draft index of bigram[a]."""

    def build(target: TargetModel, bigram: torch.Tensor) -> Drafter:
        vocab = target.vocab_size
        model = _subvocab_draft_model(target, "dspark", "markov", keep=bigram, markov_rank=vocab)
        h = model.markov_head
        with torch.no_grad():
            h.markov_w1.weight.copy_(torch.eye(vocab))
            h.markov_w2.weight.zero_()
            h.markov_w2.weight[model.to_draft_ids(bigram), torch.arange(vocab)] = 30.0
        return as_drafter(model)

    return build


def good_draft(method: str, head: str = "markov"):
    """A draft that agrees with the greedy target where it can, so acceptance is far from zero.

    DSpark heads: B(a, ·) = W1[a]·W2 with W1 = I and W2 one-hot on bigram[a] (rank = V); gated with the
    gate open, rnn with its output gate reading W1[a]. DFlash: layers zeroed, so slot 0 sees its anchor,
    with a least-squares bigram lm_head (only the first position can be good). Eagle3: the same, with
    the input projection passing the token embedding through, so every position is a bigram guess.
    """

    def build(target: TargetModel, bigram: torch.Tensor) -> Drafter:
        vocab = target.vocab_size
        if method == "dspark":
            model = _draft_model(target, method, head, markov_rank=vocab)
            h = model.markov_head
            with torch.no_grad():
                h.markov_w1.weight.copy_(torch.eye(vocab))
                h.markov_w2.weight.zero_()
                h.markov_w2.weight[bigram, torch.arange(vocab)] = 30.0
                if head == "gated":
                    h.gate_proj.weight.zero_()
                    h.gate_proj.bias.fill_(20.0)
                if head == "rnn":
                    h.joint_proj.weight.zero_()
                    h.joint_proj.bias.zero_()
                    h.joint_proj.weight[2 * vocab :, vocab : 2 * vocab] = 10.0 * torch.eye(vocab)
            return as_drafter(model)
        model = _draft_model(target, method, markov_rank=8)
        with torch.no_grad():
            _zero_layers(model)
            if isinstance(model, Eagle3Model):
                hidden = target.hidden_size
                model.input_proj.weight.zero_()
                model.input_proj.weight[:, :hidden] = torch.eye(hidden)
            _bigram_lm_head(model, bigram)
        return as_drafter(model)

    return build


GREEDY_DRAFTERS = [
    DrafterCase("none", lambda t, b: NoDrafter()),
    DrafterCase("ngram", lambda t, b: NgramDrafter(), min_acceptance=0.2),
    DrafterCase("dspark-markov", random_draft("dspark", "markov"), has_confidence=True),
    DrafterCase("dspark-gated", random_draft("dspark", "gated"), has_confidence=True),
    DrafterCase("dspark-rnn", random_draft("dspark", "rnn"), has_confidence=True),
    DrafterCase("dflash", random_draft("dflash", "none")),
    DrafterCase("eagle3", random_draft("eagle3", "none")),
    DrafterCase("dspark-markov-good", good_draft("dspark", "markov"), min_acceptance=0.5, has_confidence=True),
    DrafterCase("dspark-gated-good", good_draft("dspark", "gated"), min_acceptance=0.5, has_confidence=True),
    DrafterCase("dspark-rnn-good", good_draft("dspark", "rnn"), min_acceptance=0.5, has_confidence=True),
    DrafterCase("dflash-good", good_draft("dflash"), min_acceptance=0.4),
    DrafterCase("eagle3-good", good_draft("eagle3"), min_acceptance=0.4),
    # Reduced draft vocabularies (half the target's tokens; the others have draft probability 0)
    DrafterCase("dspark-markov-subvocab", random_draft("dspark", "markov", subvocab=True), has_confidence=True),
    DrafterCase("eagle3-subvocab", random_draft("eagle3", "none", subvocab=True)),
    DrafterCase("dspark-markov-subvocab-good", good_subvocab_draft(), min_acceptance=0.5, has_confidence=True),
    DrafterCase("bad", lambda t, b: PeakedWrongDrafter(t.vocab_size)),
]


# ============================================================================ c. counters


def check_counters(result: GenerationResult, config: GenerationConfig, gamma: int, has_confidence: bool) -> None:
    """Raw counters against what was emitted: 1 prefill token + Σ (accepted + 1) per step, cut only at a stop."""
    c = result.counters
    out = result.output_ids
    steps = c.num_steps
    assert c.num_drafts == gamma and len(c.accepted_histogram) == gamma + 1
    assert len(c.num_accepted) == len(c.num_verified) == steps
    assert sum(c.accepted_histogram) == steps
    assert c.accepted_histogram == [c.num_accepted.count(k) for k in range(gamma + 1)]
    produced = 1  # the prefill token
    for verified, accepted in zip(c.num_verified, c.num_accepted):
        assert 0 <= accepted <= verified <= gamma
        assert produced < config.max_new_tokens  # a step runs only while the budget has room
        produced += accepted + 1
    assert 1 <= len(out) <= config.max_new_tokens
    stops = [i for i, t in enumerate(out) if t in config.stop_token_ids]
    if result.finish_reason == "length":
        # The budget does not cap verification (vLLM's rule): the last step's emission is cut to it.
        assert not stops
        before_last = produced - (c.num_accepted[-1] + 1) if steps else 0
        assert len(out) == config.max_new_tokens and before_last < len(out) <= produced
    else:
        assert result.finish_reason == "stop"
        assert stops == [len(out) - 1]  # stops at the first stop token, inclusive
        before_last = produced - (c.num_accepted[-1] + 1) if steps else 0
        assert before_last < len(out) <= produced  # only the last step's emission was cut
    # Per-position counts, recomputed from the per-step lists by a different route.
    verified_at, accepted_at = c.position_counts()
    for k in range(1, gamma + 1):
        assert verified_at[k - 1] == sum(1 for v in c.num_verified if v >= k)
        assert accepted_at[k - 1] == sum(1 for a in c.num_accepted if a >= k)
    assert c.num_drafted == sum(verified_at)
    if has_confidence:
        assert len(c.confidence_logits) == steps
        assert [len(x) for x in c.confidence_logits] == c.num_verified
        assert all(np.isfinite(x) for row in c.confidence_logits for x in row)
        outcomes = c.confidence_outcomes()
        assert len(outcomes) == c.num_drafted
        assert sum(survived for _, _, survived in outcomes) == sum(c.num_accepted)
    else:
        assert c.confidence_logits == [] and c.confidence_outcomes() == []


# ============================================================================ a. greedy


PROMPT_LENGTHS = (1, 3, 5, 8, 11, 13, 17, 24)
MAX_NEW = 20


@dataclass(frozen=True)
class GreedyReference:
    prompts: list[list[int]]  # random ones of PROMPT_LENGTHS, then two repetitive ones
    stop: int  # a stop token that ends some requests and not others
    reference: list[list[int]]  # plain greedy outputs with `stop`
    free: list[list[int]]  # plain greedy outputs without a stop token
    bigram: torch.Tensor  # [V] the target's most frequent greedy successor of each token


@functools.lru_cache(maxsize=None)
def greedy_reference(target: TargetModel) -> GreedyReference:
    """Plain greedy decoding (the `none` drafter) of the test prompts: what every drafter must reproduce."""
    gen = torch.Generator().manual_seed(0)
    vocab = target.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    prompts += [[5, 6, 7] * 4, [9, 2] * 6 + [9]]
    free = generate(target, NoDrafter(), prompts, GenerationConfig(max_new_tokens=MAX_NEW, num_drafts=0))
    free_ids = [r.output_ids for r in free]
    # Stop token: met after at least 3 tokens by some requests, never met by others.
    first_at = [{t: out.index(t) for t in set(out)} for out in free_ids]
    candidates = Counter(t for f in first_at for t, i in f.items() if i >= 3)
    stop = next(t for t, n in candidates.most_common() if 2 <= n and sum(t in f for f in first_at) < len(prompts) - 2)
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_drafts=0, stop_token_ids=(stop,))
    reference = [r.output_ids for r in generate(target, NoDrafter(), prompts, config)]
    pairs = Counter((a, b) for p, out in zip(prompts, free_ids) for a, b in zip(p[-1:] + out, out))
    bigram = torch.zeros(vocab, dtype=torch.long)
    for (a, b), _ in sorted(pairs.items(), key=lambda kv: kv[1]):  # the most frequent is written last
        bigram[a] = b
    return GreedyReference(prompts, stop, reference, free_ids, bigram)


@pytest.fixture(scope="module")
def greedy_setup(qwen3_target: TargetModel) -> GreedyReference:
    return greedy_reference(qwen3_target)


def test_plain_decoding_matches_hf_generate(qwen3_target: TargetModel, greedy_setup):
    prompts, stop, reference, free = greedy_setup.prompts, greedy_setup.stop, greedy_setup.reference, greedy_setup.free
    model = qwen3_target.model
    stopped = [i for i, r in enumerate(reference) if r[-1] == stop]
    assert 2 <= len(stopped) < len(prompts) - 1, "the stop token must end some requests and not others"
    for i in sorted({0, 1, 2, len(prompts) - 1, stopped[0]}):
        ids = torch.tensor([prompts[i]])
        # An explicit mask: otherwise Hugging Face masks every prompt token equal to pad_token_id.
        kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False)
        out = model.generate(ids, eos_token_id=stop, pad_token_id=stop, **kw)
        assert out[0, ids.shape[1] :].tolist() == reference[i], f"prompt {i}"
        out = model.generate(ids, eos_token_id=None, pad_token_id=0, **kw)
        assert out[0, ids.shape[1] :].tolist() == free[i], f"prompt {i}, no stop"


@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("case", GREEDY_DRAFTERS, ids=lambda c: c.id)
def test_greedy_equals_plain_decoding(qwen3_target: TargetModel, case: DrafterCase, gamma: int):
    target = case.target_or(qwen3_target)
    ref = greedy_reference(target)
    drafter = case.build(target, ref.bigram)
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_drafts=gamma, temperature=0.0, stop_token_ids=(ref.stop,))
    results = generate(target, drafter, ref.prompts, config, seed=123)
    prompts = ref.prompts
    for i, (r, expected) in enumerate(zip(results, ref.reference)):
        assert r.output_ids == expected, f"{case.id} γ={gamma}: prompt {i} diverged from plain greedy decoding"
        assert r.prompt_ids == prompts[i]
    effective_gamma = 0 if case.id == "none" else gamma
    for r in results:
        check_counters(r, config, effective_gamma, case.has_confidence)
    steps = [(v, a) for r in results for v, a in zip(r.counters.num_verified, r.counters.num_accepted)]
    with_drafts = [a for v, a in steps if v > 0]
    first = sum(a >= 1 for a in with_drafts) / max(len(with_drafts), 1)
    tau = sum(a + 1 for _, a in steps) / max(len(steps), 1)
    print(f"{case.id} γ={gamma}: first-draft acceptance {first:.2f} over {len(with_drafts)} steps, τ = {tau:.2f}")
    if case.min_acceptance > 0:
        assert first > case.min_acceptance, f"{case.id}: acceptance {first:.2f}: the draft no longer agrees with the target"


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 9])
@pytest.mark.parametrize("case_id", ["ngram", "dspark-markov-good", "eagle3-good"])
def test_greedy_token_budget(qwen3_target: TargetModel, greedy_setup, case_id: str, max_new_tokens: int):
    """Small budgets: the last step verifies γ drafts and its emission is cut to the budget; outputs are exact."""
    case = next(c for c in GREEDY_DRAFTERS if c.id == case_id)
    config = GenerationConfig(max_new_tokens=max_new_tokens, num_drafts=7, temperature=0.0)
    results = generate(qwen3_target, case.build(qwen3_target, greedy_setup.bigram), greedy_setup.prompts, config)
    for r, free in zip(results, greedy_setup.free):
        assert r.output_ids == free[:max_new_tokens]
        assert r.finish_reason == "length"
        check_counters(r, config, 7, case.has_confidence)
    if max_new_tokens == 1:
        assert all(r.counters.num_steps == 0 for r in results)


def test_test_doubles_follow_the_protocol():
    assert isinstance(PeakedWrongDrafter(8), Drafter)


def test_stop_at_the_first_token(qwen3_target: TargetModel, greedy_setup):
    """A stop token emitted by the prefill ends that request with no step; the others go on."""
    stop = greedy_setup.free[0][0]
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_drafts=3, stop_token_ids=(stop,))
    expected = [out[: out.index(stop) + 1] if stop in out else out for out in greedy_setup.free]
    case = next(c for c in GREEDY_DRAFTERS if c.id == "dspark-markov-good")
    results = generate(qwen3_target, case.build(qwen3_target, greedy_setup.bigram), greedy_setup.prompts, config)
    assert [r.output_ids for r in results] == expected
    assert results[0].output_ids == [stop] and results[0].counters.num_steps == 0
    assert results[0].finish_reason == "stop"
    for r in results:
        check_counters(r, config, 3, True)


@pytest.mark.parametrize("case_id", ["dspark-markov", "eagle3", "bad"])
def test_sampled_request_does_not_depend_on_its_batch(qwen3_target: TargetModel, greedy_setup, case_id: str):
    """Request i's randomness comes from generators[i] only: alone or in any batch, the same tokens."""
    case = next(c for c in GREEDY_DRAFTERS if c.id == case_id)
    assert_independent_of_batch(qwen3_target, case.build(qwen3_target, greedy_setup.bigram), greedy_setup.prompts[:6])


def assert_independent_of_batch(target: TargetModel, drafter, prompts: list[list[int]], alone_at=(0, 3)) -> None:
    """Sampled at T = 1 with request i seeded 1000 + i: the same tokens batched, shuffled and alone."""
    config = GenerationConfig(max_new_tokens=12, num_drafts=3, temperature=1.0)

    def gens(order):
        return [torch.Generator().manual_seed(1000 + i) for i in order]

    batched = [r.output_ids for r in generate(target, drafter, prompts, config, generators=gens(range(len(prompts))))]
    order = [4, 1, 5, 0, 3, 2][: len(prompts)]
    shuffled = generate(target, drafter, [prompts[i] for i in order], config, generators=gens(order))
    assert [r.output_ids for r in shuffled] == [batched[i] for i in order]
    for i in alone_at:
        alone = generate(target, drafter, [prompts[i]], config, generators=gens([i]))[0]
        assert alone.output_ids == batched[i]
    assert len({tuple(b) for b in batched}) == len(batched)


# ============================================================================ b. sampling

SAMPLING_PROMPT = [3, 1, 5, 1]
NUM_SAMPLES = 20_000
NUM_TOKENS = 3


@functools.cache
def small_target() -> TargetModel:
    """V = 8: first tokens have entropy ≈ 1.9 nats (uniform: 2.08), the most likely ≈ 0.25, and the
    next token's law depends strongly on the previous one (its argmax changes with it)."""
    model = tiny_qwen3(vocab_size=8, hidden_size=16, num_layers=2, seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.5)
    return TargetModel(model)


@functools.lru_cache(maxsize=None)
def exact_law(target: TargetModel, temperature: float) -> np.ndarray:
    return exact_joint(target.model, SAMPLING_PROMPT, NUM_TOKENS, temperature)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_small_target_is_neither_flat_nor_deterministic(temperature: float):
    law = exact_law(small_target(), temperature)
    assert law.shape == (8,) * NUM_TOKENS and np.isclose(law.sum(), 1.0)
    first = law.sum(axis=(1, 2))
    assert 0.15 < first.max() < 0.6
    cond_argmax = (law.sum(axis=2) / first[:, None]).argmax(-1)
    assert len(set(cond_argmax.tolist())) >= 3


SAMPLING_DRAFTERS = [
    DrafterCase("none", lambda t, b: NoDrafter()),
    # min_n 1: after the 4-token prompt a 1-gram usually has an earlier occurrence, so the first step drafts
    # (the case is exact sampling with one-hot drafts; the lookup rule itself is tested in test_ngram.py)
    DrafterCase("ngram", lambda t, b: NgramDrafter(min_n=1)),
    DrafterCase("dspark-markov", random_draft("dspark", "markov", markov_scale=1.0), has_confidence=True),
    DrafterCase("dflash", random_draft("dflash", "none")),
    DrafterCase("eagle3", random_draft("eagle3", "none")),
    # Reduced draft vocabularies: half the tokens have draft probability 0 (the residual alone emits them)
    DrafterCase("dspark-markov-subvocab", random_draft("dspark", "markov", subvocab=True), has_confidence=True),
    DrafterCase("eagle3-subvocab", random_draft("eagle3", "none", subvocab=True)),
    DrafterCase("bad", lambda t, b: PeakedWrongDrafter(t.vocab_size)),
]
# The default run keeps a control (`none`: the sampler and the enumeration agree), the bad draft, and one
# case per other drafter kind across both temperatures and γ; the rest of the matrix is `slow`.
FAST_SAMPLING = {("none", 3, 1.0), ("bad", 3, 1.0), ("dspark-markov", 3, 0.7), ("eagle3", 1, 1.0), ("ngram", 3, 1.0),
                 ("dspark-markov-subvocab", 3, 1.0), ("eagle3-subvocab", 3, 0.7)}
FAST_BROKEN = {("accept_u_below_p_t", "bad"), ("recover_from_p_t", "dspark-markov")}


def _sampling_params():
    for case in SAMPLING_DRAFTERS:
        for gamma, temperature in ((3, 1.0), (3, 0.7), (1, 1.0)):  # temperature and γ act independently
            if case.id == "none" and gamma == 1:
                continue  # γ is irrelevant without drafts
            marks = () if (case.id, gamma, temperature) in FAST_SAMPLING else (pytest.mark.slow,)
            yield pytest.param(case, gamma, temperature, marks=marks, id=f"{case.id}-g{gamma}-T{temperature}")


def sample_many(target: TargetModel, drafter: Drafter, gamma: int, temperature: float, seed: int = 0):
    """NUM_SAMPLES requests in one batch, request i seeded with its own generator.

    One token more than the law covers: the first step verifies γ drafts (the budget caps none; it cuts
    the emission), so drafts really stand at tokens 2 and 3.
    """
    config = GenerationConfig(max_new_tokens=NUM_TOKENS + 1, num_drafts=gamma, temperature=temperature)
    generators = [torch.Generator().manual_seed(seed * NUM_SAMPLES + i) for i in range(NUM_SAMPLES)]
    return generate(target, drafter, [SAMPLING_PROMPT] * NUM_SAMPLES, config, generators=generators), config


def fit(results: list[GenerationResult], law: np.ndarray) -> float:
    counts = count_prefixes((r.output_ids for r in results), NUM_TOKENS, law.shape[0])
    return chi2_gof(counts, law)[2]


@pytest.mark.parametrize("case, gamma, temperature", list(_sampling_params()))
def test_sampling_matches_exact_distribution(case: DrafterCase, gamma: int, temperature: float):
    target = case.target_or(small_target())
    drafter = case.build(target, torch.zeros(target.vocab_size, dtype=torch.long))
    results, config = sample_many(target, drafter, gamma, temperature)
    p = fit(results, exact_law(target, temperature))
    assert p > ALPHA, f"{case.id} γ={gamma} T={temperature}: samples do not follow the target (χ² p = {p:.2g})"
    effective_gamma = 0 if case.id == "none" else gamma
    for r in results[:500]:
        check_counters(r, config, effective_gamma, case.has_confidence)
    # Speculation really produced tokens 2–3: the first step verifies ≥ min(γ, 2) drafts (n-gram: if found).
    first_verified = sum(r.counters.num_verified[0] for r in results)
    verified = sum(sum(r.counters.num_verified) for r in results)
    accepted = sum(sum(r.counters.num_accepted) for r in results)
    if case.id != "none":
        assert first_verified >= NUM_SAMPLES * min(gamma, NUM_TOKENS - 1) * (0.25 if case.id == "ngram" else 1)
        assert 0 < accepted < verified
    print(f"{case.id} γ={gamma} T={temperature}: χ² p = {p:.3f}, accepted {accepted}/{verified}")


# --------------------------------------------------------------------------- the test can fail


def verify_accepting_below_target_prob(target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures, generators):
    """BROKEN: accepts a draft when u < p_t(x), not u < p_t(x)/p_d(x) (residual left as it is)."""
    accept_u, sample_u = verification.draw_verify_uniforms(generators, cu_num_drafts[1:] - cu_num_drafts[:-1])
    if draft_probs is not None:  # rejection_sample accepts iff u'·p_d(x) < p_t(x); u' = u / p_d(x) makes it u < p_t(x)
        p_d = draft_probs.gather(1, draft_token_ids[:, None]).squeeze(1).float()
        accept_u = accept_u / p_d.clamp(min=1e-12)
    return verification.rejection_sample(
        target_logits, draft_token_ids, cu_num_drafts, draft_probs, temperatures, accept_u, sample_u
    )


def _broken_params():
    for broken in ("accept_u_below_p_t", "recover_from_p_t"):
        for case_id in ("bad", "dspark-markov", "dspark-markov-subvocab"):
            marks = () if (broken, case_id) in FAST_BROKEN else (pytest.mark.slow,)
            yield pytest.param(broken, case_id, marks=marks, id=f"{broken}-{case_id}")


@pytest.mark.parametrize("broken, case_id", list(_broken_params()))
def test_broken_verifier_fails(monkeypatch, broken: str, case_id: str):
    if broken == "accept_u_below_p_t":
        monkeypatch.setattr(generate_module, "verify", verify_accepting_below_target_prob)
    else:  # residual mass never counts as "enough": every recovered token comes from p_t itself
        monkeypatch.setattr(verification, "RESIDUAL_EPS", 2.0)
    case = next(c for c in SAMPLING_DRAFTERS if c.id == case_id)
    target = small_target()
    results, _ = sample_many(target, case.build(target, torch.zeros(target.vocab_size, dtype=torch.long)), 3, 1.0)
    p = fit(results, exact_law(target, 1.0))
    print(f"broken verifier {broken}, {case_id}: χ² p = {p:.2g}")
    assert p < BROKEN_ALPHA, f"the χ² test did not catch a broken verifier ({broken}, {case_id}): p = {p:.2g}"


@pytest.mark.parametrize("case_id", ["ngram", "bad"])
def test_greedy_equals_plain_decoding_in_bf16_with_the_cpu_kernels(monkeypatch, case_id: str):
    """bf16 on the CPU, where the lean forward runs its C++ kernels: a verify step's logits must be a decode step's
    bit for bit (each projection's row and each attention query independent of what shares the call), else a near
    tie in bf16 flips a greedy token. The tiny Llama in bf16, every projection packed (the bf16 linear kernel where
    it runs), a vocabulary of 96 whose bf16 logits tie often; drafts accepted (n-gram) and rejected (bad)."""
    from conftest import tiny_llama
    from dspark_core import packed_linear
    from dspark_core.kernels import bf16_linear_cpu, decode_attention_cpu

    if not (bf16_linear_cpu.ready() and decode_attention_cpu.ready()):
        pytest.skip("the bf16 CPU kernels do not run here")
    monkeypatch.setattr(packed_linear, "MIN_PACKED_ELEMENTS", 0)
    target = TargetModel(tiny_llama().to(torch.bfloat16))
    ref = greedy_reference(target)
    case = next(c for c in GREEDY_DRAFTERS if c.id == case_id)
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_drafts=7, temperature=0.0, stop_token_ids=(ref.stop,))
    results = generate(target, case.build(target, ref.bigram), ref.prompts, config, seed=123)
    assert isinstance(target._fused.head.weight, bf16_linear_cpu.PairPacked)
    for i, (r, expected) in enumerate(zip(results, ref.reference)):
        assert r.output_ids == expected, f"{case_id}: prompt {i} diverged from plain greedy decoding in bf16"
    assert sum(sum(r.counters.num_accepted) for r in results) > (10 if case_id == "ngram" else -1)
