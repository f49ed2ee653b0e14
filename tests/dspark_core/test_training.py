"""Target cache, training batches and the training loop, ending with a real toy run whose figures print (-s)."""

import math

import pytest
import torch

from dspark_core.drafters import DSparkDrafter
from dspark_core.drafters.base import DraftStep
from dspark_core.drafters.eagle3 import Eagle3Drafter
from dspark_core.target_cache import TargetCache, TargetSequence, build_target_cache, record_cache, record_sequences
from dspark_core.training import (
    TrainConfig,
    batch_loss,
    draft_vocab_sequences,
    dspark_block_forward,
    eagle3_loss,
    eagle3_chain_hidden,
    eagle3_unroll_forward,
    eagle3_unroll_hidden,
    eagle3_unroll_mask,
    evaluate_draft,
    lr_at,
    make_block_batch,
    sample_anchors,
    target_rows,
    train_draft,
)
from fixtures_training import (
    MASK_TOKEN_ID,
    TARGET_LAYER_IDS,
    VOCAB_SIZE,
    acceptance_length,
    eval_prompts,
    new_draft,
    single_thread,
    toy_cache,
    toy_target,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with single_thread():
        yield


# --- target cache ----------------------------------------------------------------------------------


def test_target_cache_alignment_and_roundtrip(tmp_path):
    target = toy_target()
    prompts = eval_prompts(4)
    cache = build_target_cache(target, prompts, layer_ids=(1, 2), max_new_tokens=12, temperature=0.0, batch_size=3)
    assert target.layer_ids == TARGET_LAYER_IDS  # restored
    assert cache.layer_ids == (1, 2) and cache.feature_size == 2 * target.hidden_size
    for seq, prompt in zip(cache.sequences, prompts):
        assert seq.prompt_len == len(prompt) and seq.token_ids[: len(prompt)].tolist() == prompt
        assert seq.num_tokens == len(prompt) + 12
        assert seq.features.shape == (seq.num_tokens, 2 * target.hidden_size)
        # greedy answers: row t of the logits is the target's prediction of token t+1
        answer_rows = seq.logits[seq.prompt_len - 1 : -1]
        assert answer_rows.argmax(-1).tolist() == seq.token_ids[seq.prompt_len :].tolist()
    # batched and padded == one sequence alone
    target.set_layer_ids((1, 2))
    try:
        alone = record_sequences(target, [cache.sequences[1].token_ids.tolist()])[0]
    finally:
        target.set_layer_ids(TARGET_LAYER_IDS)
    assert torch.allclose(alone.logits, cache.sequences[1].logits, atol=1e-4)
    assert torch.allclose(alone.features, cache.sequences[1].features, atol=1e-4)

    cache.save(tmp_path / "cache.pt")
    loaded = TargetCache.load(tmp_path / "cache.pt")
    assert loaded.layer_ids == cache.layer_ids and loaded.meta == cache.meta
    for a, b in zip(loaded.sequences, cache.sequences):
        assert a.prompt_len == b.prompt_len and torch.equal(a.token_ids, b.token_ids)
        assert torch.equal(a.features, b.features) and torch.equal(a.logits, b.logits)


# --- schedule, anchors, masks ----------------------------------------------------------------------


def test_lr_schedule_warmup_then_cosine():
    cfg = TrainConfig(steps=100, lr=1e-3, warmup_fraction=0.04, min_lr_ratio=0.1)
    assert [lr_at(s, cfg) for s in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lr_at(4, cfg) == pytest.approx(1e-3)
    assert lr_at(52, cfg) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way through the cosine
    assert lr_at(99, cfg) == pytest.approx(1e-4, rel=1e-2)
    lrs = [lr_at(s, cfg) for s in range(4, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def _toy_sequence(num_tokens=12, prompt_len=4, vocab=16, width=6, seed=0) -> TargetSequence:
    g = torch.Generator().manual_seed(seed)
    return TargetSequence(
        token_ids=torch.arange(num_tokens) + 100,  # token at position p is 100 + p: easy to read
        features=torch.randn(num_tokens, width, generator=g),
        logits=torch.randn(num_tokens, vocab, generator=g),
        prompt_len=prompt_len,
    )


def test_sample_anchors_in_answer_region():
    seqs = [_toy_sequence(12, 4), _toy_sequence(9, 6)]
    g = torch.Generator().manual_seed(0)
    anchors = sample_anchors(seqs, 5, g)
    assert len(anchors[0]) == 5 and len(anchors[1]) == 2  # the second has only positions 6, 7
    assert anchors[1].tolist() == [6, 7]
    for a, s in zip(anchors, seqs):
        assert len(set(a.tolist())) == len(a)
        assert all(s.prompt_len <= x <= s.num_tokens - 2 for x in a.tolist())


def test_block_batch_layout():
    B, mask = 3, 99
    seqs = [_toy_sequence(12, 4, seed=0), _toy_sequence(9, 6, seed=1)]
    anchors = [torch.tensor([4, 10]), torch.tensor([7])]  # second sequence: one real block, one padding
    b = make_block_batch(seqs, anchors, B, mask)
    S, M, T = 2, 2, 12
    assert b.block_ids.shape == (S, M * B) and b.attn_mask.shape == (S, M * B, T + M * B)
    assert b.block_ids[0].tolist() == [104, mask, mask, 110, mask, mask]
    assert b.positions[0].tolist() == [4, 5, 6, 10, 11, 12]
    assert b.prev_ids[0].tolist() == [104, 105, 106] and b.labels[0].tolist() == [105, 106, 107]
    assert b.prev_ids[1][:2].tolist() == [110, 111] and b.labels[1][:1].tolist() == [111]
    assert b.valid.tolist() == [[True, True, True], [True, False, False], [True, False, False], [False] * 3]
    assert torch.equal(b.target_logits[0], seqs[0].logits[4:7])
    assert torch.equal(b.target_logits[2][0], seqs[1].logits[7])
    for s, a_list in enumerate([[4, 10], [7, 6]]):  # padding block anchored at prompt_len
        for q in range(M * B):
            m = q // B
            ctx = b.attn_mask[s, q, :T]
            assert ctx.tolist() == [p < a_list[m] for p in range(T)]
            own = b.attn_mask[s, q, T:]
            assert own.tolist() == [q2 // B == m for q2 in range(M * B)]


def test_target_rows_reads_each_sequence_in_place():
    """The rows of a padded [S, T, V] gather where a sequence has them; past its end, its last row, which
    the loss masks (so a loss and its gradient are those of the padded gather, whose zeros it masked too)."""
    seqs = [_toy_sequence(12, 4, seed=0), _toy_sequence(9, 6, seed=1)]
    positions = torch.tensor([[[4, 5, 6], [10, 11, 12]], [[7, 8, 9], [6, 7, 8]]])
    rows = target_rows(seqs, positions)
    assert rows.shape == (2, 2, 3, seqs[0].logits.shape[-1])
    for s, seq in enumerate(seqs):
        for m in range(2):
            for k in range(3):
                p = int(positions[s, m, k])
                assert torch.equal(rows[s, m, k], seq.logits[min(p, seq.num_tokens - 1)])


def test_eagle3_unroll_mask():
    m = eagle3_unroll_mask(4, 2).int()  # [T, 3T]: step-0 keys ≤ i−2, step-1 key at i−1, own key at i
    assert m.tolist() == [
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0],
        [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0],
        [1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1],
    ]
    assert torch.equal(eagle3_unroll_mask(5, 0), torch.ones(5, 5, dtype=torch.bool).tril())


# --- the training forward is the inference forward -------------------------------------------------


def _drafter_probs(drafter, seq: TargetSequence, anchor: int, n: int, seed: int = 0):
    """Propose n drafts after `anchor` with the context of positions < anchor observed, at T=1."""
    cap = seq.num_tokens + n + 2
    state = drafter.start(1, cap)
    rows = torch.tensor([0])
    drafter.observe(state, rows, seq.token_ids[None, :anchor], seq.features[None, :anchor], torch.tensor([anchor]))
    token_ids = torch.zeros(1, cap, dtype=torch.long)
    token_ids[0, : anchor + 1] = seq.token_ids[: anchor + 1]
    step = DraftStep(rows, token_ids, torch.tensor([anchor + 1]), n, torch.tensor([1.0]),
                     [torch.Generator().manual_seed(seed)])
    return drafter.propose(state, step)


def _with_drafts(seq: TargetSequence, anchor: int, drafts: torch.Tensor) -> TargetSequence:
    """The sequence with the drafted tokens written after the anchor (teacher forcing then feeds them)."""
    tokens = seq.token_ids.clone()
    tokens[anchor + 1 : anchor + 1 + len(drafts)] = drafts
    return TargetSequence(tokens, seq.features, seq.logits, seq.prompt_len)


@pytest.mark.parametrize("method,head,confidence", [
    ("dspark", "markov", True), ("dspark", "gated", True), ("dspark", "rnn", False), ("dflash", "none", False),
])
def test_dspark_training_forward_equals_drafter(method, head, confidence):
    torch.manual_seed(3)
    model = new_draft(method, head, confidence_head=confidence, seed=3)
    if model.markov_head is not None:  # W2 starts at zero: make the head matter
        torch.nn.init.normal_(model.markov_head.markov_w2.weight, std=0.5)
    seq = toy_cache().sequences[0]
    anchor, B = seq.prompt_len + 3, model.config.block_size
    proposal = _drafter_probs(DSparkDrafter(model), seq, anchor, B)
    fed = _with_drafts(seq, anchor, proposal.token_ids[0, : B - 1])
    with torch.no_grad():
        logits, conf = dspark_block_forward(model, make_block_batch([fed], [torch.tensor([anchor])], B, MASK_TOKEN_ID))
    assert torch.allclose(torch.softmax(logits[0], -1), proposal.draft_probs[0], atol=1e-5)
    if confidence:
        assert torch.allclose(conf[0], proposal.confidence_logits[0], atol=1e-5)


def test_eagle3_unroll_equals_drafter():
    model = new_draft("eagle3", "none", seed=4)
    seq = toy_cache().sequences[1]
    anchor, J = seq.prompt_len + 2, 3
    proposal = _drafter_probs(Eagle3Drafter(model), seq, anchor, J)
    fed = _with_drafts(seq, anchor, proposal.token_ids[0, : J - 1])
    with torch.no_grad():
        logits = eagle3_unroll_forward(model, fed.token_ids[None], fed.features[None], J)  # [1, T, J, V]
    for j in range(J):
        assert torch.allclose(torch.softmax(logits[0, anchor + j, j], -1), proposal.draft_probs[0, j], atol=1e-5)


@pytest.mark.parametrize("num_steps", [1, 2, 3])
def test_eagle3_chains_are_the_full_unroll_at_their_anchors(num_steps):
    """Steps ≥ 1 computed only after sampled anchors (one query per chain) give the full unroll's outputs at
    (a + j, step j), anchors near the end included (their clamped positions only have to stay finite)."""
    model = new_draft("eagle3", "none", seed=4)
    seqs = toy_cache().sequences[:2]
    T = max(s.num_tokens for s in seqs)
    tokens = torch.zeros(2, T, dtype=torch.long)
    features = torch.zeros(2, T, seqs[0].features.shape[-1])
    for i, seq in enumerate(seqs):
        tokens[i, : seq.num_tokens], features[i, : seq.num_tokens] = seq.token_ids, seq.features.float()
    anchors = torch.tensor([[seqs[0].prompt_len, seqs[0].prompt_len + 3, T - 2], [seqs[1].prompt_len + 1, T - 5, T - 1]])
    with torch.no_grad():
        full = eagle3_unroll_hidden(model, tokens, features, num_steps)  # [S, T, J, H]
        chains = eagle3_chain_hidden(model, tokens, features, anchors, num_steps)  # [S, M, J, H]
    assert chains.shape == (2, 3, num_steps, full.shape[-1]) and torch.isfinite(chains).all()
    checked = 0
    for i in range(2):
        for m, a in enumerate(anchors[i].tolist()):
            for j in range(num_steps):
                if a + j < T:
                    assert torch.allclose(chains[i, m, j], full[i, a + j, j], atol=1e-5), (i, a, j)
                    checked += 1
    assert checked >= 6 * num_steps - 3


def test_eagle3_loss_over_sampled_anchors_is_the_full_loss_at_those_positions():
    """With a cap above every sequence's answer length, the sampled-anchor loss supervises exactly the
    (position, step) pairs of the full one; with a small cap, only cap · steps pairs per sequence."""
    model = new_draft("eagle3", "none", seed=4)
    seqs = toy_cache().sequences[:3]
    full_cfg = TrainConfig(eagle3_unroll_steps=2, seed=0)
    every = TrainConfig(eagle3_unroll_steps=2, eagle3_anchors_per_sequence=10_000, seed=0)
    few = TrainConfig(eagle3_unroll_steps=2, eagle3_anchors_per_sequence=2, seed=0)
    with torch.no_grad():
        full = eagle3_loss(model, seqs, full_cfg)
        sampled_all = eagle3_loss(model, seqs, every, torch.Generator().manual_seed(0))
        sampled_few = eagle3_loss(model, seqs, few, torch.Generator().manual_seed(0))
        again = eagle3_loss(model, seqs, few, torch.Generator().manual_seed(0))
    assert sampled_all.num_positions == full.num_positions
    assert float(sampled_all.total) == pytest.approx(float(full.total), rel=1e-5)
    assert sampled_all.acceptance == pytest.approx(full.acceptance, rel=1e-5)
    assert 0 < sampled_few.num_positions <= 2 * 2 * len(seqs) < full.num_positions
    assert float(again.total) == float(sampled_few.total)  # the anchors come from the generator


# --- the loop ----------------------------------------------------------------------------------------


SMOKE = TrainConfig(steps=6, lr=3e-3, batch_size=4, anchors_per_sequence=8, seed=5)


@pytest.mark.parametrize("method,head,confidence", [
    ("dspark", "gated", True), ("dspark", "rnn", True), ("dspark", "markov", False), ("eagle3", "none", False),
])
def test_every_variant_trains(method, head, confidence):
    model = new_draft(method, head, confidence_head=confidence)
    frozen = model.embed_tokens.weight.clone(), model.lm_head.weight.clone()
    fc = model.fc.weight.clone()
    result = train_draft(toy_cache(), model, SMOKE)
    assert len(result.losses) == SMOKE.steps and all(math.isfinite(x) for x in result.losses)
    assert math.isnan(result.history[0].bce) != confidence
    assert torch.equal(model.embed_tokens.weight, frozen[0]) and torch.equal(model.lm_head.weight, frozen[1])
    assert not torch.equal(model.fc.weight, fc)


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_a_draft_over_the_whole_vocabulary_in_draft_order_has_the_full_drafts_loss(method):
    """draft_to_target = every token: the log-prob path (gathered once per run) gives the full draft's loss."""
    full = new_draft(method, "markov" if method == "dspark" else "none")
    mapped = new_draft(method, "markov" if method == "dspark" else "none", draft_vocabulary=torch.arange(VOCAB_SIZE))
    mapped.load_state_dict(full.state_dict() | {"draft_to_target": torch.arange(VOCAB_SIZE)})
    config = SMOKE
    sequences = toy_cache().sequences[:4]
    a = batch_loss(full, sequences, config, torch.Generator().manual_seed(0))
    b = batch_loss(mapped, draft_vocab_sequences(sequences, mapped), config, torch.Generator().manual_seed(0))
    for name in ("ce", "l1", "bce", "acceptance"):
        x, y = getattr(a, name), getattr(b, name)
        assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-3, abs=1e-4), name


def test_a_reduced_vocabulary_draft_trains_and_proposes_only_its_tokens():
    """Half the toy vocabulary, the tokens the cache's answers use most: loss falls, the head stays frozen."""
    counts = torch.bincount(torch.cat([s.token_ids[s.prompt_len:] for s in toy_cache().sequences]), minlength=VOCAB_SIZE)
    vocab = torch.sort(torch.argsort(counts, descending=True, stable=True)[: VOCAB_SIZE // 2]).values
    model = new_draft("dspark", draft_vocabulary=vocab)
    head = model.lm_head.weight.clone()
    assert torch.equal(head, toy_target().output_embeddings().weight[vocab])
    config = TrainConfig(steps=40, lr=6e-3, batch_size=8, anchors_per_sequence=16)
    before = evaluate_draft(toy_cache(), model, config)
    result = train_draft(toy_cache(), model, config)
    after = evaluate_draft(toy_cache(), model, config)
    print(f"reduced vocabulary: loss {float(before.total):.3f} → {float(after.total):.3f}, "
          f"α {before.acceptance:.3f} → {after.acceptance:.3f}")
    assert sum(result.losses[-5:]) < 0.85 * sum(result.losses[:5])
    assert after.acceptance > before.acceptance + 0.2
    assert torch.equal(model.lm_head.weight, head)
    step = DraftStep(rows=torch.tensor([0]), token_ids=torch.zeros(1, 8, dtype=torch.long), num_tokens=torch.tensor([2]),
                     num_drafts=5, temperatures=torch.tensor([1.0]), generators=[torch.Generator().manual_seed(1)])
    drafter = DSparkDrafter(model)
    state = drafter.start(1, 8)
    drafter.observe(state, torch.tensor([0]), torch.zeros(1, 1, dtype=torch.long),
                    toy_cache().sequences[0].features[None, :1], torch.tensor([1]))
    proposal = drafter.propose(state, step)
    assert set(proposal.token_ids.flatten().tolist()) <= set(vocab.tolist())
    assert proposal.draft_probs.shape[-1] == VOCAB_SIZE


def _most_used(n: int) -> torch.Tensor:
    counts = torch.bincount(torch.cat([s.token_ids[s.prompt_len:] for s in toy_cache().sequences]), minlength=VOCAB_SIZE)
    return torch.sort(torch.argsort(counts, descending=True, stable=True)[:n]).values


def _kept_columns_cache(logit_ids: torch.Tensor) -> TargetCache:
    """toy_cache()'s very answers, recorded again keeping only `logit_ids`' log-probabilities."""
    full = toy_cache()
    prompts = [s.token_ids[: s.prompt_len].tolist() for s in full.sequences]
    answers = [s.token_ids[s.prompt_len:].tolist() for s in full.sequences]
    with single_thread():
        return record_cache(toy_target(), prompts, answers, layer_ids=TARGET_LAYER_IDS, batch_size=32, logit_ids=logit_ids)


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_a_cache_keeping_only_the_draft_vocabulary_trains_the_same_draft(method, tmp_path):
    """A cache recorded with `logit_ids` holds exactly what the loss reads for a reduced draft: the same
    training run, step for step, at a fraction of the memory; its save/load keeps the ids."""
    vocab = _most_used(VOCAB_SIZE // 2)
    kept = _kept_columns_cache(vocab)
    assert kept.vocab_size == VOCAB_SIZE and kept.sequences[0].logits.shape[-1] == vocab.numel()
    kept.save(tmp_path / "kept.pt")
    kept = TargetCache.load(tmp_path / "kept.pt")
    assert torch.equal(kept.logit_ids, vocab) and kept.target_vocab_size == VOCAB_SIZE
    head = "markov" if method == "dspark" else "none"
    a, b = new_draft(method, head, draft_vocabulary=vocab), new_draft(method, head, draft_vocabulary=vocab)
    ra, rb = train_draft(toy_cache(), a, SMOKE), train_draft(kept, b, SMOKE)
    assert ra.losses == pytest.approx(rb.losses, rel=1e-5, abs=1e-6)
    ea, eb = evaluate_draft(toy_cache(), a, SMOKE), evaluate_draft(kept, b, SMOKE)
    assert ea.acceptance == pytest.approx(eb.acceptance, rel=1e-5)


def test_a_kept_columns_cache_trains_a_smaller_vocabulary_and_refuses_what_it_lacks():
    vocab = _most_used(VOCAB_SIZE // 2)
    kept = _kept_columns_cache(vocab)
    smaller = vocab[::2]  # a subset: its columns are picked from the kept ones
    a, b = new_draft("dspark", draft_vocabulary=smaller), new_draft("dspark", draft_vocabulary=smaller)
    assert train_draft(toy_cache(), a, SMOKE).losses == pytest.approx(train_draft(kept, b, SMOKE).losses, rel=1e-5, abs=1e-6)
    lacking = min(set(range(VOCAB_SIZE)) - set(vocab.tolist()))
    outside = torch.sort(torch.cat([vocab[:-1], torch.tensor([lacking])])).values  # one token the cache lacks
    with pytest.raises(ValueError, match="not among the target cache's"):
        train_draft(kept, new_draft("dspark", draft_vocabulary=outside), SMOKE)
    with pytest.raises(ValueError, match="whole vocabulary"):
        train_draft(kept, new_draft("dspark"), SMOKE)
    with pytest.raises(ValueError, match="ascending"):
        record_cache(toy_target(), [[1, 2]], [[3]], logit_ids=torch.tensor([5, 3]))


def test_a_version_1_cache_file_still_loads(tmp_path):
    seq = toy_cache().sequences[0]
    torch.save({"version": 1, "layer_ids": [1], "meta": {}, "token_ids": [seq.token_ids], "features": [seq.features],
                "logits": [seq.logits], "prompt_lens": [seq.prompt_len]}, tmp_path / "v1.pt")
    loaded = TargetCache.load(tmp_path / "v1.pt")
    assert loaded.logit_ids is None and loaded.vocab_size == VOCAB_SIZE and torch.equal(loaded.sequences[0].logits, seq.logits)


def test_training_is_deterministic_and_checks_its_inputs():
    a, b = new_draft("dspark"), new_draft("dspark")
    assert train_draft(toy_cache(), a, SMOKE).losses == train_draft(toy_cache(), b, SMOKE).losses
    unfrozen = new_draft("dspark")
    unfrozen.embed_tokens.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="copy_target_embeddings"):
        train_draft(toy_cache(), unfrozen, SMOKE)
    other_layers = TargetCache(toy_cache().sequences, (1, 2))
    with pytest.raises(ValueError, match="layers"):
        train_draft(other_layers, new_draft("dspark"), SMOKE)


# --- a real toy run: loss down, acceptance up, DSpark vs DFlash vs Eagle3-style ----------------------


# Toy scale: a short budget, so a peak lr 10× the reference 6e-4 (same warm-up and cosine).
RUN = TrainConfig(steps=150, lr=6e-3, batch_size=8, anchors_per_sequence=16, seed=0)


@pytest.fixture(scope="module")
def toy_run():
    cache = toy_cache()
    subset = TargetCache(cache.sequences[:32], cache.layer_ids)  # training loss, measured on a third of the cache
    target = toy_target()
    print(f"\n[toy target] trained {target.train_seconds:.1f}s, final CE {target.train_loss:.3f}; cache: "
          f"{len(cache)} sequences, {sum(s.num_anchors for s in cache.sequences)} answer anchors")
    figures = {}
    for method, head in [("dspark", "markov"), ("dflash", "none"), ("eagle3", "none")]:
        model = new_draft(method, head)
        before = evaluate_draft(subset, model, RUN)
        tau_before = {t: acceptance_length(model, t) for t in (0.0, 1.0)}
        result = train_draft(cache, model, RUN)
        after = evaluate_draft(subset, model, RUN)
        tau_after = {t: acceptance_length(model, t) for t in (0.0, 1.0)}
        figures[method] = dict(before=before, after=after, tau_before=tau_before, tau_after=tau_after, result=result)
        print(
            f"[{method:6s}] {RUN.steps} steps in {result.seconds:.1f}s | loss {float(before.total):.3f} → "
            f"{float(after.total):.3f} (CE {before.ce:.3f} → {after.ce:.3f}, mean α {before.acceptance:.3f} → "
            f"{after.acceptance:.3f}) | τ(γ=7) T=0: {tau_before[0.0]:.2f} → {tau_after[0.0]:.2f}, "
            f"T=1: {tau_before[1.0]:.2f} → {tau_after[1.0]:.2f}"
        )
    return figures


@pytest.mark.parametrize("method", ["dspark", "dflash", "eagle3"])
def test_training_lowers_loss_and_raises_acceptance(toy_run, method):
    f = toy_run[method]
    assert float(f["after"].total) < 0.5 * float(f["before"].total)
    losses = f["result"].losses
    assert sum(losses[-20:]) / 20 < 0.5 * sum(losses[:20]) / 20
    for t in (0.0, 1.0):
        assert f["tau_before"][t] < 1.3  # an untrained draft is almost never accepted
        assert f["tau_after"][t] > f["tau_before"][t] + 1.5


def test_dspark_accepts_more_than_dflash(toy_run):
    """Same data, steps and backbone; DSpark's Markov head resolves word-boundary collisions."""
    for t in (0.0, 1.0):
        assert toy_run["dspark"]["tau_after"][t] >= toy_run["dflash"]["tau_after"][t]
