"""The `draft_model` drafter: a separate causal LM drafting autoregressively must keep decoding lossless.

a. Exactness of what it reports: every draft distribution equals softmax(logits / T) of a plain full
   forward of the draft model over the committed tokens plus the drafts before it — across rows of
   different lengths, after rollback and re-observation, after a slot is reset for a new request, and for
   rows whose anchor sits near the end of their slot (which draft fewer tokens, never overflow).
b. Greedy: output equals plain decoding token for token, for a draft that agrees with the target only
   partly (the target cut to its first layers), an unrelated random draft, and the target as its own draft
   (whose greedy acceptance must be 100%).
c. Sampling: the first tokens follow the target's exact law (χ², as in test_losslessness.py), and the
   drafter made to sample from another law than the one it reports fails the same test, so the test bites.
d. A request's tokens do not depend on its batch; a draft with another vocabulary or tokenizer is refused.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from conftest import tiny_qwen3
from dspark_core.drafters import (
    DraftModelDrafter,
    DraftProposal,
    DraftStep,
    Drafter,
    VocabularyMismatch,
    build_drafter,
)
from dspark_core.drafters.draft_model import check_tokenizers
from dspark_core.generate import GenerationConfig, generate
from dspark_core.target import TargetModel
from test_losslessness import (
    ALPHA,
    BROKEN_ALPHA,
    MAX_NEW,
    NUM_SAMPLES,
    assert_independent_of_batch,
    check_counters,
    exact_law,
    fit,
    greedy_reference,
    sample_many,
    small_target,
)

ATOL = 1e-5


def truncated(model: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """The target's first `num_layers` decoder layers with its embeddings, final norm and LM head: a cheap
    draft with the target's vocabulary that agrees with it often but not always."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    draft = type(model)(config).eval()
    missing, _ = draft.load_state_dict(model.state_dict(), strict=False)
    assert not missing, missing
    return draft


DRAFTS = {  # name → draft model for a target
    "truncated": lambda target: truncated(target.model, 2),
    "independent": lambda target: tiny_qwen3(vocab_size=target.vocab_size, hidden_size=16, num_layers=2, seed=5),
    "target": lambda target: target.model,
}


@functools.lru_cache(maxsize=None)
def drafter_for(target: TargetModel, name: str) -> DraftModelDrafter:
    return DraftModelDrafter(DRAFTS[name](target), target=target)


# ============================================================================ a. what propose reports


def _step(token_ids: list[list[int]], capacity: int, gamma: int, temperatures: list[float], seed: int = 0) -> DraftStep:
    """A DraftStep over rows 0 … R−1 whose committed tokens are `token_ids` (the last of each is the anchor)."""
    table = torch.zeros(len(token_ids), capacity, dtype=torch.long)
    for r, ids in enumerate(token_ids):
        table[r, : len(ids)] = torch.tensor(ids)
    return DraftStep(
        rows=torch.arange(len(token_ids)), token_ids=table, num_tokens=torch.tensor([len(t) for t in token_ids]),
        num_drafts=gamma, temperatures=torch.tensor(temperatures),
        generators=[torch.Generator().manual_seed(seed + r) for r in range(len(token_ids))],
    )


def _observe(drafter: DraftModelDrafter, state, rows: list[int], chunks: list[list[int]]) -> None:
    """Hand the drafter committed chunks (right-padded, as the loop does; features are empty)."""
    width = max(len(c) for c in chunks)
    ids = torch.full((len(rows), width), 7, dtype=torch.long)
    for j, c in enumerate(chunks):
        ids[j, : len(c)] = torch.tensor(c)
    drafter.observe(state, torch.tensor(rows), ids, torch.zeros(len(rows), width, 0),
                    torch.tensor([len(c) for c in chunks]))


@torch.no_grad()
def _expected_law(model: torch.nn.Module, context: list[int], temperature: float) -> torch.Tensor:
    """The draft's next-token law after `context`, from one plain full forward (none of the code under test)."""
    logits = model(input_ids=torch.tensor([context])).logits[0, -1].float()
    if temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def _check_proposal(model, token_ids: list[list[int]], proposal: DraftProposal, temperatures: list[float],
                    num_valid: list[int]) -> None:
    for r, (ids, t) in enumerate(zip(token_ids, temperatures)):
        drafts = proposal.token_ids[r].tolist()
        for k in range(num_valid[r]):
            law = _expected_law(model, ids + drafts[:k], t)
            if proposal.draft_probs is not None:
                torch.testing.assert_close(proposal.draft_probs[r, k], law, atol=ATOL, rtol=1e-4)
            assert law[drafts[k]] > 0, f"row {r}: draft {k} has probability 0 under the draft model"
            if t == 0.0:
                assert drafts[k] == int(law.argmax())


def test_draft_laws_are_the_draft_models_own(qwen3_target):
    """Rows of different lengths and temperatures (one greedy) in one batch; then some drafts accepted,
    observed, and a second proposal: both must match plain full forwards of the draft model."""
    drafter = drafter_for(qwen3_target, "truncated")
    gen = torch.Generator().manual_seed(3)
    committed = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (2, 7, 13)]
    temps, gamma, capacity = [1.0, 0.0, 0.7], 4, 40
    state = drafter.start(3, capacity)
    _observe(drafter, state, [0, 1, 2], [c[:-1] for c in committed])
    proposal = drafter.propose(state, _step(committed, capacity, gamma, temps))
    assert proposal.token_ids.shape == (3, gamma) and proposal.draft_probs.shape == (3, gamma, 96)
    assert proposal.num_valid is None and proposal.confidence_logits is None
    _check_proposal(drafter.model.model, committed, proposal, temps, [gamma] * 3)
    assert state.lengths.tolist() == [len(c) - 1 for c in committed], "propose must roll back to the committed length"
    # Verification accepted 2, 0 and 4 drafts of the rows, then a bonus token each: commit and observe.
    accepted = [2, 0, 4]
    new = [[c[-1]] + proposal.token_ids[r, :a].tolist() for r, (c, a) in enumerate(zip(committed, accepted))]
    _observe(drafter, state, [0, 1, 2], new)
    committed = [c + n[1:] + [11 + r] for r, (c, n) in enumerate(zip(committed, new))]
    proposal = drafter.propose(state, _step(committed, capacity, gamma, temps, seed=50))
    _check_proposal(drafter.model.model, committed, proposal, temps, [gamma] * 3)


def test_all_greedy_drafts_are_one_hot_without_probs(qwen3_target):
    drafter = drafter_for(qwen3_target, "truncated")
    committed = [[4, 9, 1], [8]]
    state = drafter.start(2, 16)
    _observe(drafter, state, [0], [committed[0][:-1]])  # the one-token prompt has nothing before its anchor
    proposal = drafter.propose(state, _step(committed, 16, 3, [0.0, 0.0]))
    assert proposal.draft_probs is None
    _check_proposal(drafter.model.model, committed, proposal, [0.0, 0.0], [3, 3])


def test_rows_near_the_end_of_their_slot_draft_fewer(qwen3_target):
    """A slot with room for fewer than γ forwards drafts only that many tokens (num_valid), the same ones a
    roomy slot drafts, and leaves the slot as it was."""
    drafter = drafter_for(qwen3_target, "truncated")
    gen = torch.Generator().manual_seed(4)
    capacity, gamma = 12, 4
    # The slot holds all but the anchor: room for 12 − (n − 1) forwards, i.e. 1, 9, 0 and 2.
    committed = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (12, 4, 13, 11)]
    temps = [1.0, 1.0, 0.5, 0.0]
    state = drafter.start(4, capacity)
    _observe(drafter, state, [0, 1, 2, 3], [c[:-1] for c in committed])
    proposal = drafter.propose(state, _step(committed, 16, gamma, temps))
    assert proposal.num_valid.tolist() == [1, 4, 0, 2]
    assert state.lengths.tolist() == [len(c) - 1 for c in committed]
    _check_proposal(drafter.model.model, committed, proposal, temps, proposal.num_valid.tolist())
    roomy = drafter.start(4, 64)
    _observe(drafter, roomy, [0, 1, 2, 3], [c[:-1] for c in committed])
    wide = drafter.propose(roomy, _step(committed, 64, gamma, temps))
    for r, n in enumerate(proposal.num_valid.tolist()):
        assert proposal.token_ids[r, :n].tolist() == wide.token_ids[r, :n].tolist()
    assert torch.allclose(proposal.draft_probs.sum(-1), torch.ones(4, gamma))  # placeholders are laws too


def test_a_reset_slot_forgets_its_previous_request(qwen3_target):
    drafter = drafter_for(qwen3_target, "truncated")
    old, new = [5, 6, 7, 8, 9, 10, 11], [20, 21, 22]
    state = drafter.start(2, 32)
    _observe(drafter, state, [0, 1], [old[:-1], new[:-1]])
    drafter.reset(state, torch.tensor([0]))
    assert state.lengths.tolist() == [0, len(new) - 1]
    _observe(drafter, state, [0], [new[:-1]])
    proposal = drafter.propose(state, _step([new, new], 32, 3, [1.0, 1.0], seed=9))
    _check_proposal(drafter.model.model, [new, new], proposal, [1.0, 1.0], [3, 3])


def test_a_missed_observe_is_an_error(qwen3_target):
    drafter = drafter_for(qwen3_target, "truncated")
    state = drafter.start(1, 16)
    _observe(drafter, state, [0], [[1, 2]])
    with pytest.raises(RuntimeError, match="observe"):
        drafter.propose(state, _step([[1, 2, 3, 4]], 16, 2, [0.0]))


def test_follows_the_protocol(qwen3_target):
    """The target as its own draft shares its weights, not its wrapper: the target keeps its feature layers."""
    before = qwen3_target.layer_ids
    drafter = DraftModelDrafter(qwen3_target, target=qwen3_target)
    assert isinstance(drafter, Drafter) and drafter.name == "draft_model" and drafter.target_layer_ids == ()
    assert drafter.model is not qwen3_target and drafter.model.model is qwen3_target.model
    assert drafter.model.layer_ids == () and qwen3_target.layer_ids == before


# ============================================================================ b. greedy


@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("draft", ["truncated", "independent", "target"])
def test_greedy_equals_plain_decoding(qwen3_target, draft: str, gamma: int):
    """Prompts of 1 … 24 tokens in one batch, a stop token that ends some requests, a token budget."""
    ref = greedy_reference(qwen3_target)
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_drafts=gamma, temperature=0.0, stop_token_ids=(ref.stop,))
    results = generate(qwen3_target, drafter_for(qwen3_target, draft), ref.prompts, config, seed=123)
    for i, (r, expected) in enumerate(zip(results, ref.reference)):
        assert r.output_ids == expected, f"{draft} γ={gamma}: prompt {i} diverged from plain greedy decoding"
        check_counters(r, config, gamma, has_confidence=False)
    verified = sum(r.counters.num_drafted for r in results)
    accepted = sum(sum(r.counters.num_accepted) for r in results)
    print(f"draft_model {draft} γ={gamma}: accepted {accepted}/{verified}")
    assert verified > 0
    if draft == "target":
        assert accepted == verified, "the target drafting for itself must have every greedy draft accepted"
    if draft == "truncated":
        assert 0 < accepted < verified


# ============================================================================ c. sampling


def _small_drafts(target: TargetModel) -> dict[str, torch.nn.Module]:
    return {"truncated": truncated(target.model, 1),
            "independent": tiny_qwen3(vocab_size=8, hidden_size=16, num_layers=1, seed=2)}


@pytest.mark.parametrize("draft, gamma, temperature", [
    ("independent", 3, 1.0),
    ("truncated", 3, 0.7),
    pytest.param("independent", 1, 0.7, marks=pytest.mark.slow),
    pytest.param("truncated", 1, 1.0, marks=pytest.mark.slow),
])
def test_sampling_matches_exact_distribution(draft: str, gamma: int, temperature: float):
    target = small_target()
    drafter = DraftModelDrafter(_small_drafts(target)[draft], target=target)
    results, config = sample_many(target, drafter, gamma, temperature)
    p = fit(results, exact_law(target, temperature))
    verified = sum(r.counters.num_drafted for r in results)
    accepted = sum(sum(r.counters.num_accepted) for r in results)
    print(f"draft_model {draft} γ={gamma} T={temperature}: χ² p = {p:.3f}, accepted {accepted}/{verified}")
    assert p > ALPHA, f"{draft} γ={gamma} T={temperature}: samples do not follow the target (χ² p = {p:.2g})"
    for r in results[:500]:
        check_counters(r, config, gamma, has_confidence=False)
    assert sum(r.counters.num_verified[0] for r in results) == NUM_SAMPLES * gamma  # the budget caps no draft
    assert 0 < accepted < verified  # drafts were really accepted and rejected


def test_a_misreported_draft_law_fails_the_test(monkeypatch):
    """BROKEN on purpose: the drafter samples at twice the temperature (from ∝ √p_d) but reports p_d. A
    drafter is lossless only when it reports the law it sampled from; the χ² test must see the difference.
    (Reporting no law at all — one-hot drafts — would be lossless: the verifier is exact for any fixed draft.)"""
    import dspark_core.distributions as module  # drafters draw through its draw_position; verification holds its own

    real = module.sample_from_probs
    monkeypatch.setattr(module, "sample_from_probs", lambda probs, uniforms: real(probs.sqrt(), uniforms))
    target = small_target()
    results, _ = sample_many(target, DraftModelDrafter(_small_drafts(target)["independent"], target=target), 3, 1.0)
    p = fit(results, exact_law(target, 1.0))
    print(f"draft_model sampling at 2T, reporting T: χ² p = {p:.2g}")
    assert p < BROKEN_ALPHA, f"the χ² test did not catch a drafter that misreports its law: p = {p:.2g}"


# ============================================================================ d. batches and vocabularies


def test_sampled_request_does_not_depend_on_its_batch(qwen3_target):
    """Request i's randomness comes from generators[i] only: alone or in any batch, the same tokens."""
    prompts = greedy_reference(qwen3_target).prompts[:6]
    assert_independent_of_batch(qwen3_target, drafter_for(qwen3_target, "truncated"), prompts, alone_at=(0, 3, 5))


def test_a_draft_with_another_vocabulary_is_refused(qwen3_target):
    with pytest.raises(VocabularyMismatch, match="64 tokens, the target's 96"):
        DraftModelDrafter(tiny_qwen3(vocab_size=64), target=qwen3_target)


def _word_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0])


def test_a_draft_with_another_tokenizer_is_refused(tmp_path, qwen3_target):
    """Same vocabulary size, other ids: refused by the tokenizer check, also when loading from a directory."""
    words = ["<unk>"] + [f"w{i}" for i in range(95)]
    same, swapped = _word_tokenizer(words), _word_tokenizer(words[:1] + words[2:3] + words[1:2] + words[3:])
    check_tokenizers(_word_tokenizer(words), same)
    with pytest.raises(VocabularyMismatch, match="tokenizer differs"):
        check_tokenizers(swapped, same)
    tiny_qwen3(seed=8).save_pretrained(tmp_path)
    swapped.save_pretrained(tmp_path)
    with pytest.raises(VocabularyMismatch, match="tokenizer differs"):
        build_drafter("draft_model", checkpoint=str(tmp_path), target=qwen3_target, target_tokenizer=same)
    drafter = build_drafter("draft_model", checkpoint=str(tmp_path), target=qwen3_target, target_tokenizer=swapped)
    assert drafter.model.dtype == qwen3_target.dtype and drafter.model.vocab_size == 96
    with pytest.raises(ValueError, match="needs a checkpoint"):
        build_drafter("draft_model")


def test_a_loaded_draft_is_lossless(tmp_path, qwen3_target):
    """`build_drafter` on a saved Hugging Face directory (no tokenizer saved: nothing to compare)."""
    truncated(qwen3_target.model, 1).save_pretrained(tmp_path)
    ref = greedy_reference(qwen3_target)
    drafter = build_drafter("draft_model", checkpoint=str(tmp_path), target=qwen3_target, target_tokenizer=object())
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_drafts=3, stop_token_ids=(ref.stop,))
    assert [r.output_ids for r in generate(qwen3_target, drafter, ref.prompts, config)] == ref.reference
