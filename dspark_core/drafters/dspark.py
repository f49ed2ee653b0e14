"""DSpark (parallel backbone + sequential head + confidence head) and DFlash (the backbone alone).

Backbone: the target's raw hidden states of several layers, concatenated, go through a bias-free
`fc` and `hidden_norm` once per position; in every draft layer those fused context features become
extra keys/values through that layer's own k/v projections. The block holds the anchor (last
committed token) and γ−1 mask tokens at positions anchor … anchor+γ−1, attends bidirectionally
within itself and to every context position before the anchor, and slot j predicts the token after
position anchor+j. Embeddings and LM head are frozen copies of the target's.

Head: p_d(x_k | x_{k−1}) = softmax(U_k + B_k(x_{k−1})); the first previous token is the anchor.
Confidence: c_k = Linear([h_k ; W1[x_{k−1}]]).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from dspark_core.distributions import draw_position, draw_uniforms, is_greedy
from dspark_core.drafters.base import DraftProposal, DraftStep
from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.heads import SEQUENTIAL_HEADS, ConfidenceHead, MarkovHead
from dspark_core.drafters.layers import TargetFedDraft
from dspark_core.kernels import use_triton
from dspark_core.kv_slots import KVSlots, covering_range


class DSparkModel(TargetFedDraft):
    def __init__(self, config: DraftConfig):
        super().__init__(config)
        c = config
        self.markov_head = (SEQUENTIAL_HEADS[c.head](c.markov_w1_size, c.markov_rank, c.hidden_size, c.output_vocab_size)
                            if c.head != "none" else None)
        self.confidence_head = ConfidenceHead(c.hidden_size, c.markov_rank) if c.confidence_head else None

    def w1_rows(self, prev_ids: Tensor) -> Tensor:
        """Target ids → rows of Markov W1 (`DraftConfig.markov_w1_rows`): the ids themselves, or their draft
        indices with the shared last row for a token outside the draft vocabulary."""
        if self.config.markov_w1_rows == "target":
            return prev_ids
        rows = self.to_draft_ids(prev_ids)
        return torch.where(rows < 0, self.config.output_vocab_size, rows)

    def context_kv(self, fused: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per layer: keys/values [batch, kv_heads, seq, head_dim] of fused context features."""
        return [layer.self_attn.project_kv(fused, positions) for layer in self.layers]

    def backbone(
        self, block_ids: Tensor, positions: Tensor, ctx_kv: list[tuple[Tensor, Tensor]], attn_mask: Tensor,
        scratch_at: int | None = None,
    ) -> Tensor:
        """block_ids/positions [batch, n] → final-normed h [batch, n, hidden]. `scratch_at`: ctx_kv are buffers
        with room for the block from there on (`DraftAttention.forward`)."""
        x = self.embed_tokens(block_ids)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, positions, k, v, attn_mask, scratch_at=scratch_at)
        return self.norm(x)

    def head_outputs(
        self, h: Tensor, prev_ids: Tensor, head_state: Tensor | None, backbone_logits: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One block position: h [..., hidden], prev_ids [...] → logits [..., vocab], confidence logit, state.
        `backbone_logits`: `lm_head(h)` in fp32 when the caller computed it for the whole block already."""
        logits = self.lm_head(h).float() if backbone_logits is None else backbone_logits
        if self.markov_head is None:
            return logits, None, head_state
        rows = self.w1_rows(prev_ids)
        bias, head_state = self.markov_head.bias(rows, h, head_state)
        conf = None
        if self.confidence_head is not None:
            conf = self.confidence_head(h, self.markov_head.markov_w1(rows))
        return logits + bias.float(), conf, head_state

    def sample_block(
        self, h: Tensor, anchor_ids: Tensor, temperatures: Tensor, uniforms: Tensor
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Drafting: sample the block position by position, x_0 = the anchor. h [R, n, hidden], anchor_ids [R],
        temperatures [R], uniforms [R, n] → target token ids [R, n], draft probs [R, n, target vocab] fp32 (zero
        outside a reduced draft vocabulary), confidence logits [R, n] (None without a confidence head). The
        torch twin of kernels/markov_draft.py.

        When every row is greedy no probs are returned (None: one-hot drafts, `distributions.draw_position`), which
        also spares the [R, n, target vocab] copy per step."""
        greedy = bool(is_greedy(temperatures).all())
        # The LM head over the whole block in one matmul, as the kernel takes it: only the Markov bias needs the
        # previous token. Drafting over 49 k words, γ matmuls of one row each cost γ reads of the head's weight.
        backbone = self.lm_head(h).float()  # [R, n, draft vocab]
        # Per position only the head's bias and the draw (`head_outputs`' numbers, fewer calls: at one row the loop is
        # dispatch-bound; γ 7 of SmolLM2's draft 1.11 → 0.75 ms on AMD Zen 4). The confidence head's inputs are
        # known once the block is drawn, so it runs once over the block.
        head = self.markov_head
        by_draft_index = self.config.markov_w1_rows == "draft"
        prev = self.w1_rows(anchor_ids)  # x_{k−1} as a row of W1
        head_state = head.init_state(h.shape[0], h.device) if head is not None else None
        prevs, tokens, probs = [], [], []
        for k in range(h.shape[1]):
            logits = backbone[:, k]
            if head is not None:
                bias, head_state = head.bias(prev, h[:, k], head_state)
                logits = logits + bias  # the bias in the head's dtype, added in fp32
            index, p = draw_position(logits, temperatures, uniforms[:, k], greedy)
            if p is not None:
                probs.append(p)
            prevs.append(prev)
            token = self.to_target_ids(index)  # the proposal reads target ids
            prev = index if by_draft_index else token  # a drafted token's W1 row is its draft index
            tokens.append(token)
        conf = None
        if head is not None and self.confidence_head is not None:
            conf = self.confidence_head(h, head.markov_w1(torch.stack(prevs, dim=1)))
        return torch.stack(tokens, dim=1), self.full_vocab_probs(torch.stack(probs, dim=1)) if probs else None, conf

    def teacher_forced(self, h: Tensor, prev_ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """Training: h [batch, n, hidden], prev_ids [batch, n] (true previous target tokens) → logits over the
        draft vocabulary, conf."""
        state = self.markov_head.init_state(h.shape[0], h.device) if self.markov_head is not None else None
        if self.markov_head is None or state is None:  # stateless heads: all positions at once
            logits, conf, _ = self.head_outputs(h, prev_ids, None)
            return logits, conf
        outs, confs = [], []
        for k in range(h.shape[1]):
            logits, conf, state = self.head_outputs(h[:, k], prev_ids[:, k], state)
            outs.append(logits)
            confs.append(conf)
        conf_t = torch.stack(cast(list[Tensor], confs), dim=1) if confs[0] is not None else None  # all or none
        return torch.stack(outs, dim=1), conf_t


class DSparkDrafter:
    """Drafter protocol over a `DSparkModel`; DFlash is the same with head='none'."""

    def __init__(self, model: DSparkModel):
        self.model = model.eval()
        self.config = model.config
        self.name = model.config.method
        self.target_layer_ids = model.config.target_layer_ids

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    def start(self, num_slots: int, capacity: int) -> KVSlots:
        """Per-slot, per-layer keys/values of the fused context features, grown by `observe`."""
        c = self.config
        return KVSlots.allocate(
            c.num_layers, num_slots, c.num_kv_heads, capacity, c.head_dim, self.model.fc.weight.dtype, self.device
        )

    def reset(self, state: KVSlots, rows: Tensor) -> None:
        state.lengths[rows] = 0

    @torch.no_grad()
    def observe(self, state: KVSlots, rows: Tensor, token_ids: Tensor, features: Tensor, num_new: Tensor) -> None:
        positions = state.lengths[rows][:, None] + torch.arange(features.shape[1], device=self.device)[None, :]
        state.append(rows, self.model.context_kv(self.model.fuse(features), positions), num_new)

    def _backbone(self, state: KVSlots, rows: Tensor, anchor_ids: Tensor, n: int) -> Tensor:
        """The draft backbone over the block [anchor, mask …] of each slot in `rows`, after its context."""
        num_rows = len(rows)
        block_ids = torch.full((num_rows, n), self.config.mask_token_id, dtype=torch.long, device=self.device)
        block_ids[:, 0] = anchor_ids
        ctx_len = state.lengths[rows]
        positions = ctx_len[:, None] + torch.arange(n, device=self.device)[None, :]  # the anchor sits at ctx_len
        max_ctx = int(ctx_len.max()) if num_rows else 0
        ctx_valid = state.valid_mask(rows, max_ctx)  # [R, max_ctx]
        attn_mask = torch.cat(
            [ctx_valid[:, None, :].expand(-1, n, -1), torch.ones(num_rows, n, n, dtype=torch.bool, device=self.device)],
            dim=2,
        )  # block: bidirectional within itself, and to every context position before the anchor
        # The context keys/values in place (views of the slots when `rows` is a contiguous range), the block's
        # own written behind the longest context, where no slot holds a committed position.
        buffers = state.attention_buffers(rows, max_ctx, max_ctx + n)
        return self.model.backbone(block_ids, positions, buffers, attn_mask, scratch_at=max_ctx)

    @torch.no_grad()
    def propose(self, state: KVSlots, step: DraftStep) -> DraftProposal:
        rows, n = step.rows, step.num_drafts
        if bool((state.lengths[rows] != step.anchor_positions).any()):
            raise RuntimeError("drafter context out of step with committed tokens: observe() was missed")
        # Rows with a few holes run over the slot range that covers them (idle slots' rows computed, then
        # dropped) rather than gathering a copy of every layer's context (kv_slots.covering_range).
        cover = covering_range(state.lengths, rows)
        if cover is not None:
            h = cover.pick(self._backbone(state, cover.span, cover.spread(step.anchor_ids), n))
        else:
            h = self._backbone(state, rows, step.anchor_ids, n)  # [R, n, hidden]

        uniforms = draw_uniforms(step.generators, n, self.device)  # [R, n]
        # The sequential head: Triton on CUDA (kernels/markov_draft.py), else DSparkModel.sample_block.
        tokens, probs, confs = draft_block(self.model, h, step.anchor_ids, step.temperatures, uniforms)
        return DraftProposal(token_ids=tokens, draft_probs=probs, confidence_logits=confs)


def draft_block(
    model: DSparkModel, h: Tensor, anchor_ids: Tensor, temperatures: Tensor, uniforms: Tensor
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """DSpark's sequential head over a drafted block: h [R, n, hidden] (final-normed backbone output),
    anchor_ids [R], temperatures [R], uniforms [R, n] → target token ids [R, n] long, draft probs
    [R, n, target vocab] fp32 (None from the twin when every row is greedy), confidence logits [R, n] fp32 (None without a confidence head).

    The dispatch of `kernels/markov_draft.py` (the Markov head and no head, DFlash) beside its twin
    `DSparkModel.sample_block`, which runs for gated/RNN heads and off the Triton path.
    """
    head = model.markov_head
    if h.shape[0] == 0 or h.shape[1] == 0 or not (head is None or type(head) is MarkovHead) or not use_triton(h.device):
        return model.sample_block(h, anchor_ids, temperatures, uniforms)
    from dspark_core.kernels.markov_draft import markov_draft

    conf = model.confidence_head
    tokens, probs, confs = markov_draft(
        model.lm_head(h), h, anchor_ids, temperatures, uniforms,
        w1=head.markov_w1.weight if head is not None else None,
        w2=head.markov_w2.weight if head is not None else None,
        conf_weight=conf.proj.weight if conf is not None else None,
        conf_bias=conf.proj.bias if conf is not None else None,
        draft_to_target=model.draft_to_target,
        w1_anchor_rows=model.w1_rows(anchor_ids) if model.config.markov_w1_rows == "draft" else None,
    )
    return tokens, model.full_vocab_probs(probs), confs
