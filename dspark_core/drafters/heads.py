"""DSpark's sequential heads: a cheap dependency on the previously sampled token, and confidence.

Each head maps (previous token, backbone state h_k, carried state) to a bias over the vocabulary
that is added to the parallel backbone logits U_k before softmax, so the per-position draft
distribution stays exact (rejection sampling needs it). Sampling stays sequential over the block,
but each step is a gather and a rank-r matmul, not a transformer forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class MarkovHead(nn.Module):
    """B_k(a, ·) = W1[a] · W2 (the paper's default, rank r = 256).

    W1 is indexed by the previous *target* token (the anchor may be any token), W2 maps onto the draft
    vocabulary (`output_size`, the LM head's rows; the whole vocabulary unless the draft has a reduced
    one): vLLM's `markov_w1` [vocab, r] and `markov_w2` [draft_vocab, r]."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, output_size: int | None = None):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, output_size or vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)  # untrained head adds nothing: starts as DFlash

    def init_state(self, batch: int, device: torch.device) -> Tensor | None:
        return None

    def bias(self, prev_ids: Tensor, h: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """prev_ids [...] (target ids), h [..., hidden] → bias [..., draft vocab], next state."""
        return self.markov_w2(self.markov_w1(prev_ids)), state


def w1_over_target(w1: Tensor, draft_to_target: Tensor, vocab_size: int) -> Tensor:
    """W1 over the draft vocabulary and a shared last row ([draft vocab + 1, r], `markov_w1_rows` "draft") →
    the same head over every target id ([vocab, r], vLLM's layout): each draft token keeps its row, every
    other token takes the shared row, so both index the same vectors."""
    out = w1[-1:].expand(vocab_size, -1).clone()
    out[draft_to_target.to(w1.device)] = w1[:-1]
    return out


class GatedMarkovHead(MarkovHead):
    """W2(σ(gate([h ; W1[a]])) ⊙ W1[a]): lets the backbone state decide how much the bigram matters."""

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, output_size: int | None = None):
        super().__init__(vocab_size, rank, hidden_size, output_size)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def bias(self, prev_ids: Tensor, h: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        e = self.markov_w1(prev_ids)
        gate = torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1)))
        return self.markov_w2(gate * e), state


class RNNHead(MarkovHead):
    """GRU-style state over the tokens sampled so far in the block, projected to a vocabulary bias.

    z = [s ; W1[a] ; h] → gate g, candidate c, output o (each rank r); s' = g·s + (1−g)·tanh(c);
    bias = W2(tanh(o)). s_0 = 0 at the anchor.
    """

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, output_size: int | None = None):
        super().__init__(vocab_size, rank, hidden_size, output_size)
        self.rank = rank
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def init_state(self, batch: int, device: torch.device) -> Tensor:
        return torch.zeros(batch, self.rank, device=device, dtype=self.markov_w1.weight.dtype)

    def bias(self, prev_ids: Tensor, h: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        e = self.markov_w1(prev_ids)
        if state is None:
            state = torch.zeros_like(e)
        g, c, o = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        new_state = g * state + (1 - g) * torch.tanh(c)
        return self.markov_w2(torch.tanh(o)), new_state


SEQUENTIAL_HEADS: dict[str, type[MarkovHead]] = {"markov": MarkovHead, "gated": GatedMarkovHead, "rnn": RNNHead}


class ConfidenceHead(nn.Module):
    """c_k = Linear([h_k ; W1[x_{k−1}]]): logit of P(draft k accepted | drafts before it were)."""

    def __init__(self, hidden_size: int, rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + rank, 1)

    def forward(self, h: Tensor, prev_embedding: Tensor) -> Tensor:
        return self.proj(torch.cat([h, prev_embedding], dim=-1)).squeeze(-1).float()
