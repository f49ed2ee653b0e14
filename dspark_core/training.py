"""Training a drafter on a target cache (DeepSpec recipe, spec §3).

DSpark / DFlash (`DSparkModel`): each step takes `batch_size` sequences and up to
`anchors_per_sequence` random anchors in each one's answer region (`prompt_len ≤ a ≤ T−2`, see
`target_cache`). Every anchor opens a block of `block_size` slots, exactly as at inference: slot 0
is the anchor token, slots 1… the mask token, positions a … a+B−1. One batched forward serves all
blocks of a sequence: queries are all blocks' slots, keys are [context features ; all slots], and
the mask lets block m see the context positions < a_m and its own slots (bidirectionally), never
another block. Slot k is labelled with the token at a+k+1 and compared with the target's
distribution at position a+k; the sequential head is teacher-forced (its previous token for slot k
is the true token at a+k). Slots past the end of the sequence are masked out of the loss.

Eagle3-style (`Eagle3Model`): teacher forcing over the whole sequence (step 0: input token t_i with
the target's fused feature g_{i−1}), then a short unroll ("training-time test", EAGLE-3): at step
j the input feature at position i is the draft's own step-(j−1) output at i−1 (gradients flow
through it), and position i attends to step-0 keys at positions ≤ i−j plus the step-s key at
position i−j+s for s = 1 … j: exactly the keys the drafter has when it drafts token j+1 after
anchor i−j. Loss: CE on the true
next token, step j weighted exp(−j/decay), anchors (i−j) in the answer region: every one, or
`eagle3_anchors_per_sequence` random ones per sequence, which sets the same budget in supervised
positions as DSpark's blocks. With sampled anchors only step 0 runs over the whole sequence (its keys
are the context); steps ≥ 1 run one query per anchor (`eagle3_chain_hidden`), the same outputs as the
full unroll at those positions for a fraction of its cost. Simplification: the unroll feeds true
tokens (not sampled ones) and stops at `eagle3_unroll_steps`, not γ.

Embeddings and LM head: the caller copies and freezes them before training
(`model.copy_target_embeddings(target.input_embeddings(), target.output_embeddings())`): the trainer
sees only the target cache, and refuses a model whose embeddings are still trainable.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from torch import Tensor

from dspark_core.drafters.dspark import DSparkModel
from dspark_core.drafters.eagle3 import Eagle3Model
from dspark_core.drafters.layers import TargetFedDraft
from dspark_core.frozen_head import lm_head_dtype
from dspark_core.host_memory import keep_freed_memory
from dspark_core.losses import CE_ONLY, DSPARK_WEIGHTS, DraftLoss, LossWeights, draft_loss
from dspark_core.target_cache import TargetCache, TargetSequence


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    lr: float = 6e-4  # peak; linear warm-up then cosine to lr·min_lr_ratio
    warmup_fraction: float = 0.04
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0  # AdamW, on matrices only (not norms or biases); the spec names none
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0  # max global grad norm
    batch_size: int = 8  # sequences per step
    anchors_per_sequence: int = 32  # DSpark/DFlash blocks per sequence (DeepSpec: up to 512)
    block_size: int | None = None  # None: the draft config's block_size (γ)
    decay: float = 4.0  # position weight w_k = exp(−k/decay)
    loss_weights: LossWeights | None = None  # None: DSpark 0.1/0.9/1.0; DFlash and Eagle3 CE only
    eagle3_unroll_steps: int = 3  # training-time-test steps (1 = teacher forcing only)
    # Eagle3-style anchors per sequence whose unrolled steps are supervised; None: every answer position.
    # A budget in supervised positions equal to DSpark's is anchors_per_sequence · block_size / unroll steps.
    eagle3_anchors_per_sequence: int | None = None
    seed: int = 0
    # The frozen LM head's products (forward, and the gradient through it) in "float32" or "bfloat16"
    # (dspark_core/frozen_head.py: those products 2–4× faster on a CPU with native bf16, a DSpark step 0.85–0.9×);
    # the trained weights and the loss stay fp32.
    lm_head_dtype: str = "float32"


@dataclass
class StepLog:
    step: int
    lr: float
    loss: float
    ce: float
    l1: float
    bce: float
    acceptance: float  # weighted-mean α (expected T=1 acceptance per position)
    grad_norm: float


@dataclass
class TrainResult:
    history: list[StepLog] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.history]


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up over ceil(warmup_fraction·steps) steps, then cosine to lr·min_lr_ratio."""
    warmup = math.ceil(config.warmup_fraction * config.steps)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1.0 - config.min_lr_ratio) * cosine)


def default_loss_weights(model: TargetFedDraft) -> LossWeights:
    if isinstance(model, DSparkModel) and model.markov_head is not None:
        return DSPARK_WEIGHTS
    return CE_ONLY  # DFlash (head none) and Eagle3-style


# --- DSpark / DFlash: blocks at random anchors -------------------------------------------------


@dataclass
class BlockBatch:
    features: Tensor  # [S, T, F] raw target features, right-padded
    block_ids: Tensor  # [S, M·B] anchor token then mask tokens, per block
    positions: Tensor  # [S, M·B] a_m + k
    attn_mask: Tensor  # [S, M·B, T + M·B] bool: context < a_m, and own block only
    prev_ids: Tensor  # [S·M, B] true token at a_m + k (teacher forcing)
    labels: Tensor  # [S·M, B] true token at a_m + k + 1
    target_logits: Tensor  # [S·M, B, V] target logits at a_m + k
    valid: Tensor  # [S·M, B] bool: real block and a_m + k + 1 < T


def sample_anchors(sequences: Sequence[TargetSequence], max_anchors: int, generator: torch.Generator) -> list[Tensor]:
    """Up to `max_anchors` distinct random anchors per sequence, in its answer region."""
    out = []
    for seq in sequences:
        perm = torch.randperm(seq.num_anchors, generator=generator)[:max_anchors]
        out.append(torch.sort(perm).values + seq.prompt_len)
    return out


def target_rows(sequences: Sequence[TargetSequence], positions: Tensor) -> Tensor:
    """The target's logit rows at `positions` [S, …] of each sequence → [S, …, V], gathered from the cache
    in place rather than from every sequence's rows padded into one [S, T, V] tensor (20–40 MB a step, of
    which a batch reads a fifth). A position past a sequence's end reads its last row, which the loss masks
    as it masked the padding's zeros: trained weights are the same bit for bit (SmolLM2's drafts, 40 steps);
    an Eagle3-style step 0.95×, a DSpark step unchanged within noise (Zen 4, alternated twice)."""
    return torch.stack([seq.logits[p.clamp(max=seq.num_tokens - 1)] for seq, p in zip(sequences, positions)])


def make_block_batch(
    sequences: Sequence[TargetSequence], anchors: Sequence[Tensor], block_size: int, mask_token_id: int,
    device: torch.device | str = "cpu",
) -> BlockBatch:
    """Blocks at the given anchors ([M_s] per sequence); sequences with fewer anchors get padding blocks."""
    S, B = len(sequences), block_size
    T = max(s.num_tokens for s in sequences)
    M = max(1, max(len(a) for a in anchors))
    tokens = torch.zeros(S, T, dtype=torch.long)
    features = torch.zeros(S, T, sequences[0].features.shape[-1], dtype=sequences[0].features.dtype)
    anchor_pos = torch.zeros(S, M, dtype=torch.long)
    block_real = torch.zeros(S, M, dtype=torch.bool)
    lengths = torch.tensor([s.num_tokens for s in sequences])
    for i, (seq, a) in enumerate(zip(sequences, anchors)):
        n = seq.num_tokens
        tokens[i, :n], features[i, :n] = seq.token_ids, seq.features
        anchor_pos[i, : len(a)] = a
        anchor_pos[i, len(a) :] = seq.prompt_len  # padding blocks: any in-range anchor, loss masked
        block_real[i, : len(a)] = True

    k = torch.arange(B)
    pos = anchor_pos[:, :, None] + k  # [S, M, B]
    rows = torch.arange(S)[:, None, None]
    prev_ids = tokens[rows, pos.clamp(max=T - 1)]
    labels = tokens[rows, (pos + 1).clamp(max=T - 1)]
    target_logits = target_rows(sequences, pos)  # [S, M, B, V]
    valid = block_real[:, :, None] & (pos + 1 < lengths[:, None, None])

    block_ids = torch.full((S, M, B), mask_token_id, dtype=torch.long)
    block_ids[:, :, 0] = tokens[torch.arange(S)[:, None], anchor_pos]
    query_anchor = anchor_pos[:, :, None].expand(S, M, B).reshape(S, M * B)
    ctx_mask = torch.arange(T)[None, None, :] < query_anchor[:, :, None]  # [S, M·B, T]
    block_of = torch.arange(M * B) // B
    own_block = (block_of[:, None] == block_of[None, :])[None].expand(S, -1, -1)  # [S, M·B, M·B]

    def to(x: Tensor) -> Tensor:
        return x.to(device)

    return BlockBatch(
        features=to(features),
        block_ids=to(block_ids.view(S, M * B)),
        positions=to(pos.view(S, M * B)),
        attn_mask=to(torch.cat([ctx_mask, own_block], dim=2)),
        prev_ids=to(prev_ids.view(S * M, B)),
        labels=to(labels.view(S * M, B)),
        target_logits=to(target_logits.view(S * M, B, -1)),
        valid=to(valid.view(S * M, B)),
    )


def dspark_block_forward(model: DSparkModel, batch: BlockBatch) -> tuple[Tensor, Tensor | None]:
    """One forward over every block of the batch → logits [S·M, B, V], confidence logits [S·M, B] | None."""
    S, T = batch.features.shape[:2]
    B = batch.prev_ids.shape[1]
    fused = model.fuse(batch.features)  # [S, T, hidden]
    ctx_positions = torch.arange(T, device=fused.device)[None, :].expand(S, -1)
    ctx_kv = model.context_kv(fused, ctx_positions)
    h = model.backbone(batch.block_ids, batch.positions, ctx_kv, batch.attn_mask)  # [S, M·B, hidden]
    return model.teacher_forced(h.reshape(-1, B, h.shape[-1]), batch.prev_ids)


def dspark_loss(
    model: DSparkModel, sequences: Sequence[TargetSequence], anchors: Sequence[Tensor], config: TrainConfig
) -> DraftLoss:
    device = model.fc.weight.device
    batch = make_block_batch(sequences, anchors, config.block_size or model.config.block_size, model.config.mask_token_id, device)
    logits, conf = dspark_block_forward(model, batch)
    return draft_loss(
        logits, model.to_draft_ids(batch.labels), batch.valid, batch.target_logits, conf,
        weights=config.loss_weights or default_loss_weights(model), decay=config.decay,
        target_log_probs=model.draft_to_target is not None,
    )


# --- Eagle3-style: teacher forcing plus a short training-time-test unroll -----------------------


def eagle3_unroll_mask(num_tokens: int, step: int, device: torch.device | str = "cpu") -> Tensor:
    """[T, (step+1)·T] bool: step-`step` queries over [step-0 keys ; step-1 keys ; … ; own keys]."""
    q = torch.arange(num_tokens, device=device)[:, None]
    p = torch.arange(num_tokens, device=device)[None, :]
    parts = [p <= q - step] + [p == q - step + s for s in range(1, step + 1)]
    return torch.cat(parts, dim=1)


def eagle3_unroll_hidden(model: Eagle3Model, token_ids: Tensor, features: Tensor, num_steps: int) -> Tensor:
    """token_ids [S, T], features [S, T, F] → pre-norm outputs [S, T, num_steps, hidden]; step j at position
    i predicts token i+1 as the drafter does for draft j+1 after anchor i−j."""
    S, T = token_ids.shape
    device = token_ids.device
    positions = torch.arange(T, device=device)[None, :].expand(S, -1)
    zero = features.new_zeros(S, 1, model.config.hidden_size, dtype=model.fc.weight.dtype)
    prev = torch.cat([zero, model.fuse(features)[:, :-1]], dim=1)  # g_{i−1}; zeros before position 0
    kv_steps: list[list[tuple[Tensor, Tensor]]] = []
    hidden = []
    for j in range(num_steps):
        past = None
        if kv_steps:
            past = [
                (torch.cat([kv[layer][0] for kv in kv_steps], dim=2),
                 torch.cat([kv[layer][1] for kv in kv_steps], dim=2))
                for layer in range(len(model.layers))
            ]
        mask = eagle3_unroll_mask(T, j, device)[None].expand(S, -1, -1)
        x, new_kv = model.decode(token_ids, prev, positions, past, mask)
        kv_steps.append(new_kv)
        hidden.append(x)
        prev = torch.cat([zero, x[:, :-1]], dim=1)  # own output at i−1 replaces g_{i−1}
    return torch.stack(hidden, dim=2)


def eagle3_chain_hidden(model: Eagle3Model, token_ids: Tensor, features: Tensor, anchors: Tensor, num_steps: int) -> Tensor:
    """token_ids [S, T], features [S, T, F], anchors [S, M] → pre-norm outputs [S, M, num_steps, hidden]:
    `eagle3_unroll_hidden` at (position a + j, step j) for each anchor a, computing steps ≥ 1 only there.

    Step 0 (teacher forcing) runs over every position: its keys are every chain's context. Each later
    step runs M queries, one per anchor's chain, attending to step-0 keys ≤ a and to its own chain's
    earlier steps, the same keys as the full unroll's. A sampled-anchor batch (56 of ≈ 280 positions)
    so costs one full pass plus small ones, not `num_steps` full passes. Positions past T − 1 are
    clamped; the caller masks them out of the loss."""
    S, T = token_ids.shape
    M = anchors.shape[1]
    device = token_ids.device
    rows = torch.arange(S, device=device)[:, None]
    positions = torch.arange(T, device=device)[None, :].expand(S, -1)
    zero = features.new_zeros(S, 1, model.config.hidden_size, dtype=model.fc.weight.dtype)
    prev = torch.cat([zero, model.fuse(features)[:, :-1]], dim=1)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None].expand(S, -1, -1)
    x, past = model.decode(token_ids, prev, positions, None, causal)
    out = [x[rows, anchors]]  # step 0 at a predicts a + 1
    context = torch.arange(T, device=device)[None, None, :] <= anchors[:, :, None]  # [S, M, T]: step-0 keys ≤ a
    own = torch.eye(M, dtype=torch.bool, device=device)[None].expand(S, -1, -1)  # each chain sees its own key only
    for j in range(1, num_steps):
        at = (anchors + j).clamp(max=T - 1)
        mask = torch.cat([context] + [own] * j, dim=2)  # [S, M, T + j·M]
        x, new_kv = model.decode(token_ids[rows, at], out[-1], at, past, mask)
        past = [(torch.cat([pk, nk], dim=2), torch.cat([pv, nv], dim=2)) for (pk, pv), (nk, nv) in zip(past, new_kv)]
        out.append(x)
    return torch.stack(out, dim=2)


def eagle3_unroll_forward(model: Eagle3Model, token_ids: Tensor, features: Tensor, num_steps: int) -> Tensor:
    """token_ids [S, T], features [S, T, F] → logits [S, T, num_steps, V] (see `eagle3_unroll_hidden`)."""
    return model.logits(eagle3_unroll_hidden(model, token_ids, features, num_steps))


def eagle3_loss(
    model: Eagle3Model, sequences: Sequence[TargetSequence], config: TrainConfig, generator: torch.Generator | None = None,
) -> DraftLoss:
    device = model.fc.weight.device
    S, T = len(sequences), max(s.num_tokens for s in sequences)
    J = max(1, config.eagle3_unroll_steps)
    tokens = torch.zeros(S, T, dtype=torch.long)
    features = torch.zeros(S, T, sequences[0].features.shape[-1], dtype=sequences[0].features.dtype)
    lengths = torch.tensor([s.num_tokens for s in sequences])
    prompt_lens = torch.tensor([s.prompt_len for s in sequences])
    for i, seq in enumerate(sequences):
        tokens[i, : seq.num_tokens], features[i, : seq.num_tokens] = seq.token_ids, seq.features
    j = torch.arange(J)
    if config.eagle3_anchors_per_sequence is None:  # every position i at every step j (anchor i − j)
        hidden = eagle3_unroll_hidden(model, tokens.to(device), features.to(device), J)  # [S, T, J, H], at = pos below
        pos = torch.arange(T)[None, :, None].expand(S, T, J)
        real = (pos - j >= prompt_lens[:, None, None])
    else:  # the steps after sampled anchors a: position a + j at step j
        anchors = sample_anchors(sequences, config.eagle3_anchors_per_sequence,
                                 generator if generator is not None else torch.Generator().manual_seed(config.seed))
        M = max(1, max(len(a) for a in anchors))
        anchor_pos = torch.zeros(S, M, dtype=torch.long)
        anchor_real = torch.zeros(S, M, dtype=torch.bool)
        for i, a in enumerate(anchors):
            anchor_pos[i, : len(a)], anchor_real[i, : len(a)] = a, True
        hidden = eagle3_chain_hidden(model, tokens.to(device), features.to(device), anchor_pos.to(device), J)  # [S, M, J, H]
        pos = anchor_pos[:, :, None] + j  # [S, M, J]
        real = anchor_real[:, :, None].expand(S, M, J)
    valid = real & (pos + 1 < lengths[:, None, None])  # a label after the position
    at = pos.clamp(max=T - 1)
    rows = torch.arange(S)[:, None, None]
    logits = model.logits(hidden)  # [S, N, J, V]: hidden is indexed (row, anchor or position, step) like `at`
    labels = tokens[rows, (at + 1).clamp(max=T - 1)]  # token i+1
    tl = target_rows(sequences, at)
    N, V = at.shape[1], logits.shape[-1]
    return draft_loss(
        logits.reshape(S * N, J, V), model.to_draft_ids(labels.reshape(S * N, J).to(device)),
        valid.reshape(S * N, J).to(device), tl.reshape(S * N, J, V).to(device), None,
        weights=config.loss_weights or default_loss_weights(model), decay=config.decay,
        target_log_probs=model.draft_to_target is not None,
    )


# --- the loop ------------------------------------------------------------------------------------


def batch_loss(
    model: TargetFedDraft, sequences: Sequence[TargetSequence], config: TrainConfig, generator: torch.Generator
) -> DraftLoss:
    if isinstance(model, Eagle3Model):
        return eagle3_loss(model, sequences, config, generator)
    if isinstance(model, DSparkModel):
        return dspark_loss(model, sequences, sample_anchors(sequences, config.anchors_per_sequence, generator), config)
    raise TypeError(f"not a trainable draft model: {type(model).__name__}")


def _check(cache: TargetCache, model: TargetFedDraft) -> list[TargetSequence]:
    c = model.config
    if tuple(cache.layer_ids) != tuple(c.target_layer_ids):
        raise ValueError(f"target cache holds layers {list(cache.layer_ids)}, the draft reads {list(c.target_layer_ids)}")
    if cache.feature_size != c.num_target_features * c.target_hidden_size:
        raise ValueError(f"target cache features are {cache.feature_size} wide, the draft's fc expects "
                         f"{c.num_target_features * c.target_hidden_size}")
    if model.embed_tokens.weight.requires_grad or model.lm_head.weight.requires_grad:
        raise ValueError("embed_tokens/lm_head must be frozen copies of the target's: call "
                         "model.copy_target_embeddings(target.input_embeddings(), target.output_embeddings()) first")
    if cache.vocab_size != c.vocab_size:
        raise ValueError(f"target cache logits cover {cache.vocab_size} tokens, the draft's target vocabulary is {c.vocab_size}")
    usable = [s for s in cache.sequences if s.num_anchors > 0]
    if not usable:
        raise ValueError("no sequence in the target cache has an answer token to anchor on")
    return draft_vocab_sequences(usable, model, cache.logit_ids)


def draft_vocab_sequences(sequences: Sequence[TargetSequence], model: TargetFedDraft,
                          logit_ids: Tensor | None = None) -> list[TargetSequence]:
    """The sequences as the loss reads them. With a reduced draft vocabulary, each one's `logits` become the
    target's log-probabilities (normalised over its whole vocabulary) at the draft's tokens, computed once per
    run in the cache's dtype: every step then touches the draft vocabulary's columns only, not 49 k of them,
    which is most of a step's cost on a large vocabulary (the LM head, softmax and L1 over every position).

    `logit_ids`: the sequences already hold log-probabilities at these target ids only (a cache recorded with
    `logit_ids`, dspark_core/target_cache.py); the draft's tokens are then picked among them, so the draft's
    vocabulary must be a subset."""
    index = model.draft_to_target
    if logit_ids is None:
        if index is None:
            return list(sequences)
        index = index.cpu()
        return [replace(s, logits=torch.log_softmax(s.logits.float(), -1)[:, index].to(s.logits.dtype)) for s in sequences]
    if index is None:
        raise ValueError(f"the target cache keeps log-probabilities at {logit_ids.numel()} tokens only; a draft over the "
                         f"whole vocabulary needs a cache recorded without logit_ids")
    index = index.cpu()
    columns = torch.searchsorted(logit_ids, index).clamp(max=logit_ids.numel() - 1)
    missing = index[logit_ids[columns] != index]
    if missing.numel():
        raise ValueError(f"{missing.numel()} of the draft's {index.numel()} tokens are not among the target cache's "
                         f"{logit_ids.numel()} kept tokens (first: {missing[:5].tolist()}); train it from a cache "
                         f"recorded with its vocabulary, or a larger one")
    if torch.equal(columns, torch.arange(logit_ids.numel())):
        return list(sequences)
    return [replace(s, logits=s.logits[:, columns]) for s in sequences]


def train_draft(cache: TargetCache, model: TargetFedDraft, config: TrainConfig) -> TrainResult:
    """Train `model` (DSparkModel of any head, or Eagle3Model) in place; deterministic for a seed
    given the same initial weights (the only randomness is batch order and anchors)."""
    sequences = _check(cache, model)
    keep_freed_memory()  # every step frees and reallocates the same large tensors (dspark_core/host_memory.py)
    generator = torch.Generator().manual_seed(config.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)
    result = TrainResult()
    was_training = model.training
    model.train()
    start = time.perf_counter()
    with lm_head_dtype(model, config.lm_head_dtype):
        _train_steps(model, sequences, config, optimizer, params, generator, result)
    result.seconds = time.perf_counter() - start
    model.train(was_training)
    return result


def _train_steps(model: TargetFedDraft, sequences: list[TargetSequence], config: TrainConfig,
                 optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], generator: torch.Generator,
                 result: TrainResult) -> None:
    order: list[int] = []
    for step in range(config.steps):
        if len(order) < config.batch_size:
            order += torch.randperm(len(sequences), generator=generator).tolist()
        batch = [sequences[i] for i in order[: config.batch_size]]
        order = order[config.batch_size :]
        lr = lr_at(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = batch_loss(model, batch, config, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        result.history.append(StepLog(step, lr, float(loss.total.detach()), loss.ce, loss.l1, loss.bce,
                                      loss.acceptance, float(grad_norm)))


@torch.no_grad()
def evaluate_draft(cache: TargetCache, model: TargetFedDraft, config: TrainConfig, seed: int = 1234) -> DraftLoss:
    """The training loss over the whole cache without gradients (anchors fixed by `seed`):
    batch values averaged with each batch's number of valid positions as weight."""
    sequences = _check(cache, model)
    generator = torch.Generator().manual_seed(seed)
    losses = [
        batch_loss(model, sequences[start : start + config.batch_size], config, generator)
        for start in range(0, len(sequences), config.batch_size)
    ]
    n = sum(loss.num_positions for loss in losses)

    def avg(values: list[float]) -> float:
        return sum(v * loss.num_positions for v, loss in zip(values, losses)) / max(1, n)

    return DraftLoss(
        total=torch.tensor(avg([float(loss.total) for loss in losses])),
        ce=avg([loss.ce for loss in losses]), l1=avg([loss.l1 for loss in losses]),
        bce=avg([loss.bce for loss in losses]), acceptance=avg([loss.acceptance for loss in losses]), num_positions=n,
        confidence=avg([loss.confidence for loss in losses]),
    )
