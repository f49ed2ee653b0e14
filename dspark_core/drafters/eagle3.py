"""Eagle3-style baseline: a shallow autoregressive decoder over the target's fused features.

Input at position i is [embed(t_i) ; g_{i−1}], where g_{i−1} is the feature that predicted t_i:
the target's fused hidden states for committed positions, the draft's own (pre-norm) output for
positions it drafted itself. One forward per draft token, with its own KV cache over the context.
The first draft position is weak (the decoder must stay shallow) but later positions are
conditioned on earlier draft tokens, the contrast DSpark's design answers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dspark_core.distributions import draw_position, draw_uniforms, is_greedy
from dspark_core.drafters.base import DraftProposal, DraftStep
from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.layers import TargetFedDraft
from dspark_core.kv_slots import KVSlots


class Eagle3Model(TargetFedDraft):
    def __init__(self, config: DraftConfig):
        super().__init__(config)
        self.input_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)

    def decode(
        self,
        token_ids: Tensor,  # [batch, seq]
        prev_features: Tensor,  # [batch, seq, hidden]: g_{i−1} for each input position i
        positions: Tensor,  # [batch, seq]
        past: list[tuple[Tensor, Tensor]] | None,  # per layer [batch, kv_heads, past, head_dim]
        attn_mask: Tensor,  # [batch, seq, past + seq]
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """→ pre-norm outputs [batch, seq, hidden] (next feature) and each layer's new keys/values."""
        x = self.input_proj(torch.cat([self.embed_tokens(token_ids), prev_features], dim=-1))
        new_kv = []
        for i, layer in enumerate(self.layers):
            pk, pv = past[i] if past is not None else (None, None)
            x, kv = layer(x, positions, pk, pv, attn_mask, return_kv=True)
            new_kv.append(kv)
        return x, new_kv

    def logits(self, x: Tensor) -> Tensor:
        """Pre-norm outputs → fp32 logits over the draft vocabulary."""
        return self.lm_head(self.norm(x)).float()


class Eagle3State:
    def __init__(self, kv: KVSlots, last_feature: Tensor):
        self.kv = kv  # draft decoder cache over committed positions
        self.last_feature = last_feature  # [num_slots, hidden]: g of the last committed, observed position


class Eagle3Drafter:
    name = "eagle3"

    def __init__(self, model: Eagle3Model):
        self.model = model.eval()
        self.config = model.config
        self.target_layer_ids = model.config.target_layer_ids

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    def start(self, num_slots: int, capacity: int) -> Eagle3State:
        c = self.config
        dtype = self.model.fc.weight.dtype
        kv = KVSlots.allocate(c.num_layers, num_slots, c.num_kv_heads, capacity, c.head_dim, dtype, self.device)
        return Eagle3State(kv, torch.zeros(num_slots, c.hidden_size, dtype=dtype, device=self.device))

    def reset(self, state: Eagle3State, rows: Tensor) -> None:
        state.kv.lengths[rows] = 0
        state.last_feature[rows] = 0

    @torch.no_grad()
    def observe(self, state: Eagle3State, rows: Tensor, token_ids: Tensor, features: Tensor, num_new: Tensor) -> None:
        num_rows, max_new = token_ids.shape
        g = self.model.fuse(features)  # [R, max_new, hidden]
        prev = torch.cat([state.last_feature[rows][:, None], g[:, :-1]], dim=1)
        past_len = state.kv.lengths[rows]
        positions = past_len[:, None] + torch.arange(max_new, device=self.device)[None, :]
        max_past = int(past_len.max()) if num_rows else 0
        attn_mask = torch.cat(
            [
                state.kv.valid_mask(rows, max_past)[:, None, :].expand(-1, max_new, -1),
                torch.ones(max_new, max_new, dtype=torch.bool, device=self.device).tril()[None].expand(num_rows, -1, -1),
            ],
            dim=2,
        )
        _, new_kv = self.model.decode(token_ids, prev, positions, state.kv.gather(rows, max_past), attn_mask)
        state.kv.append(rows, new_kv, num_new)
        last = (num_new - 1).clamp(min=0)
        has_new = num_new > 0
        state.last_feature[rows[has_new]] = g[torch.arange(num_rows, device=self.device), last][has_new]

    @torch.no_grad()
    def propose(self, state: Eagle3State, step: DraftStep) -> DraftProposal:
        rows, n = step.rows, step.num_drafts
        num_rows = len(rows)
        if bool((state.kv.lengths[rows] != step.anchor_positions).any()):
            raise RuntimeError("drafter context out of step with committed tokens: observe() was missed")
        max_past = int(state.kv.lengths[rows].max()) if num_rows else 0
        past = state.kv.gather(rows, max_past)
        past_valid = state.kv.valid_mask(rows, max_past)  # [R, max_past]
        uniforms = draw_uniforms(step.generators, n, self.device)
        token, feature, position = step.anchor_ids, state.last_feature[rows], step.anchor_positions
        greedy = bool(is_greedy(step.temperatures).all())  # one-hot drafts: no probs (draw_position)
        tokens, probs = [], []
        for k in range(n):
            mask = torch.cat([past_valid, torch.ones(num_rows, k + 1, dtype=torch.bool, device=self.device)], dim=1)
            out, new_kv = self.model.decode(token[:, None], feature[:, None], position[:, None], past, mask[:, None])
            past = [(torch.cat([pk, nk], dim=2), torch.cat([pv, nv], dim=2)) for (pk, pv), (nk, nv) in zip(past, new_kv)]
            index, p = draw_position(self.model.logits(out[:, 0]), step.temperatures, uniforms[:, k], greedy)
            if p is not None:
                probs.append(p)
            token = self.model.to_target_ids(index)
            feature, position = out[:, 0], position + 1
            tokens.append(token)
        draft_probs = self.model.full_vocab_probs(torch.stack(probs, dim=1)) if probs else None
        return DraftProposal(torch.stack(tokens, dim=1), draft_probs, None)
