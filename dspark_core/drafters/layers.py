"""Qwen3-shaped decoder layers for drafters, with keys/values that can come from outside the block.

DSpark and DFlash inject the target's fused context features as extra keys/values in every layer
(through that layer's own k/v projections), and their queries come from the draft block only.
Hugging Face layers cannot take that, so the layer is written here; parameter names follow
Qwen3 (`self_attn.q_proj`, `q_norm`, `mlp.gate_proj`, `input_layernorm`, …) so checkpoints map
one-to-one onto DeepSpec's and vLLM's `Qwen3DSparkModel`.

Drafting in bf16 on the CPU without gradients, the norms, the rotary and SiLU·up run as the target's C++
elementwise calls (`kernels/decoder_pointwise.cpp`, the rule of `pointwise`): a one-layer draft at one row is
dispatch-bound, ≈ 40 torch ops of a few µs each around 7 small matmuls. Their numbers are the eager ops' (the
rotary and residual adds bit for bit, norm and SiLU within one bf16 rounding); training and fp32 keep the ops.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark_core.kernels import decoder_pointwise_cpu as pw


def pointwise(x: Tensor, weight: Tensor) -> bool:
    """Whether this call on `x` takes the C++ elementwise kernels: inference (they have no backward), `x` and the
    layer's weights bf16 on the CPU, the library built, `DSPARK_KERNELS` not `torch` (`decoder_pointwise_cpu`)."""
    return not torch.is_grad_enabled() and weight.dtype == x.dtype and pw.ready(x.dtype, x.device)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if pointwise(x, self.weight):
            return pw.add_rms_norm(x, None, self.weight, self.eps)[1]
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin [..., head_dim] for integer `positions` [...] (rotate-half convention)."""
    freqs = positions[..., None].float() * _inverse_frequencies(head_dim, float(theta), positions.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


@lru_cache(maxsize=16)
def _inverse_frequencies(head_dim: int, theta: float, device: torch.device) -> Tensor:
    """θ^(−2i / head_dim), made once per shape and device: a drafting step calls `rotary` twice (the block, the
    observed positions), and these four small ops were a third of each call at one row."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float) / head_dim))


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [batch, heads, seq, head_dim]; cos/sin [batch, seq, head_dim]."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DraftAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, theta: float):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.theta = num_heads, num_kv_heads, head_dim, theta
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def project_kv(
        self, x: Tensor, positions: Tensor, rotation: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """x [batch, seq, hidden], positions [batch, seq] → k, v [batch, kv_heads, seq, head_dim]. `rotation`:
        `rotary(positions, …)` when the caller has it already."""
        b, n, _ = x.shape
        cos, sin = rotation if rotation is not None else rotary(positions, self.head_dim, self.theta)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return self._norm_rotate(self.k_proj(x), self.k_norm, self.num_kv_heads, cos, sin), v

    def _norm_rotate(self, projected: Tensor, norm: RMSNorm, heads: int, cos: Tensor, sin: Tensor) -> Tensor:
        """A projection [batch, seq, heads·head_dim] per-head normed and rotated: [batch, heads, seq, head_dim]."""
        b, n, _ = projected.shape
        x = norm(projected.view(b, n, heads, self.head_dim))
        if pointwise(x, norm.weight):
            return pw.rope(x, heads, cos.to(x.dtype), sin.to(x.dtype))  # apply_rotary's roundings, one call
        return apply_rotary(x.transpose(1, 2), cos, sin)

    def forward(
        self,
        x: Tensor,  # [batch, seq, hidden] (already input-normed)
        positions: Tensor,  # [batch, seq]
        past_k: Tensor | None,  # [batch, kv_heads, past, head_dim]: injected context, already rotated
        past_v: Tensor | None,
        attn_mask: Tensor,  # [batch, seq, past + seq] bool, True = may attend
        return_kv: bool = False,
        scratch_at: int | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """With `return_kv`, also the new positions' keys/values, for callers that cache them.

        `scratch_at`: past_k/past_v are buffers [batch, kv_heads, ≥ scratch_at + seq, head_dim] whose positions
        from `scratch_at` on are free (a drafter's KV slots, `KVSlots.attention_buffers`); the new keys/values
        are written there and attention reads the buffers in place, instead of concatenating a copy of the
        whole context every layer and step. Grouped KV heads are read in place too (SDPA `enable_gqa`)."""
        b, n, _ = x.shape
        cos, sin = rotary(positions, self.head_dim, self.theta)
        q = self._norm_rotate(self.q_proj(x), self.q_norm, self.num_heads, cos, sin)
        new_k, new_v = self.project_kv(x, positions, (cos, sin))
        k, v = new_k, new_v
        if past_k is not None and past_v is not None and scratch_at is not None:
            past_k[:, :, scratch_at : scratch_at + n] = new_k.to(past_k.dtype)
            past_v[:, :, scratch_at : scratch_at + n] = new_v.to(past_v.dtype)
            k, v = past_k[:, :, : scratch_at + n], past_v[:, :, : scratch_at + n]
        elif past_k is not None and past_v is not None:
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask[:, None], enable_gqa=self.num_heads != self.num_kv_heads
        )
        out = self.o_proj(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))
        return (out, (new_k, new_v)) if return_kv else out


class DraftMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if pointwise(x, self.gate_proj.weight):
            return self.down_proj(pw.silu_mul(torch.cat([gate, up], dim=-1)))
        return self.down_proj(F.silu(gate) * up)


class DraftDecoderLayer(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int,
        head_dim: int, eps: float, theta: float,
    ):
        super().__init__()
        self.self_attn = DraftAttention(hidden_size, num_heads, num_kv_heads, head_dim, eps, theta)
        self.mlp = DraftMLP(hidden_size, intermediate_size)
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(
        self, x: Tensor, positions: Tensor, past_k: Tensor | None, past_v: Tensor | None, attn_mask: Tensor,
        return_kv: bool = False, scratch_at: int | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        attn = self.self_attn(self.input_layernorm(x), positions, past_k, past_v, attn_mask, return_kv, scratch_at)
        attn, kv = attn if return_kv else (attn, None)
        post = self.post_attention_layernorm
        if pointwise(x, post.weight):
            x, normed = pw.add_rms_norm(x, attn, post.weight, post.eps)  # the residual add, bit for bit, and the norm
        else:
            x = x + attn
            normed = post(x)
        x = x + self.mlp(normed)
        return x if kv is None else (x, kv)


class TargetFedDraft(nn.Module):
    """What every model drafter shares: the target's vocabulary (`embed_tokens`, `lm_head`: frozen
    copies), the fused-feature input (`fc` over the concatenated target layers, then `hidden_norm`),
    a stack of decoder layers and a final `norm`.

    With a reduced draft vocabulary (`config.draft_vocab_size`), `lm_head` holds only the target's rows
    listed by the `draft_to_target` buffer (ascending target ids, vLLM's `d2t` as absolute ids): the draft
    samples an index into that list, and proposes the target token it names with probability 0 for every
    token outside it, which rejection sampling handles as it does any draft distribution (lossless)."""

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.fc = nn.Linear(c.num_target_features * c.target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(
            DraftDecoderLayer(
                c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_kv_heads,
                c.head_dim, c.rms_norm_eps, c.rope_theta,
            )
            for _ in range(c.num_layers)
        )
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.output_vocab_size, bias=False)
        self.draft_to_target: Tensor | None
        self.target_to_draft: Tensor | None  # its inverse, −1 outside: built once, read at every training step
        if c.draft_vocab_size is not None:
            self.register_buffer("draft_to_target", torch.arange(c.draft_vocab_size, dtype=torch.long))
            self.register_buffer("target_to_draft", torch.empty(c.vocab_size, dtype=torch.long), persistent=False)
            self._index_draft_vocabulary()
            self.register_load_state_dict_post_hook(lambda module, _keys: module._index_draft_vocabulary())
        else:
            self.draft_to_target = self.target_to_draft = None

    def _index_draft_vocabulary(self) -> None:
        assert self.draft_to_target is not None
        index = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=self.draft_to_target.device)
        index[self.draft_to_target] = torch.arange(len(self.draft_to_target), device=index.device)
        self.target_to_draft = index

    def set_draft_vocabulary(self, target_ids: Tensor) -> None:
        """The target tokens the draft may propose (distinct, in [0, vocab)); stored ascending. Call before
        `copy_target_embeddings`, which takes the LM head rows of exactly these tokens."""
        if self.draft_to_target is None:
            raise ValueError("this draft has the full vocabulary: build it with draft_vocab_size set")
        ids = torch.unique(torch.as_tensor(target_ids, dtype=torch.long).flatten())  # sorted
        if ids.numel() != self.config.draft_vocab_size or int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"a draft vocabulary of {self.config.draft_vocab_size} distinct target ids in "
                             f"[0, {self.config.vocab_size}) is needed, got {ids.numel()} distinct")
        self.draft_to_target.copy_(ids.to(self.draft_to_target.device))
        self._index_draft_vocabulary()

    def copy_target_embeddings(self, embed: nn.Embedding, lm_head: nn.Module) -> None:
        """Copy and freeze the target's embeddings and LM head (never trained with the draft); with a
        reduced draft vocabulary, the head's rows of the draft's tokens."""
        weight = lm_head.weight
        assert isinstance(weight, Tensor)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed.weight)
            self.lm_head.weight.copy_(weight if self.draft_to_target is None else weight[self.draft_to_target.to(weight.device)])
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Indices into the draft vocabulary → the target token ids they name (identity for the full one)."""
        return draft_ids if self.draft_to_target is None else self.draft_to_target[draft_ids]

    def to_draft_ids(self, target_ids: Tensor) -> Tensor:
        """Target token ids → indices into the draft vocabulary, −1 for a token outside it (training labels)."""
        if self.target_to_draft is None:
            return target_ids
        return self.target_to_draft.to(target_ids.device)[target_ids]

    def full_vocab_probs(self, probs: Tensor) -> Tensor:
        """Draft probabilities [..., draft vocab] → [..., target vocab], zero outside the draft vocabulary:
        the distribution the verifier's rejection sampling needs."""
        if self.draft_to_target is None:
            return probs
        out = probs.new_zeros(*probs.shape[:-1], self.config.vocab_size)
        return out.index_copy_(-1, self.draft_to_target, probs)

    def fuse(self, features: Tensor) -> Tensor:
        """[..., n·target_hidden] raw target hidden states → [..., hidden] context features."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
