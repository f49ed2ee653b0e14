"""A lean forward of Llama-family decoders (Llama, Mistral, Qwen2, Qwen3) straight over KV slots.

Hugging Face's forward costs a decode step more than its matmuls on the CPU: per layer it threads kwargs
through decorators, updates a cache object, records hidden states through output hooks, and its SDPA
path converts a boolean mask to an additive one in every layer. At SmolLM2-135M's shape (30 layers,
hidden 576) that overhead was a third of a batch-1 step. This forward runs the model's own submodules
(the same norms, projections, rotary embedding and MLP, so the numbers are Hugging Face's) in one plain
loop: one additive mask per forward, the new keys/values written once into the slots (`SlotWindow`),
features taken from the chosen layers' outputs, and logits only where asked.

`supports(model)` says whether a model has that shape; `TargetModel` keeps Hugging Face's own forward
for everything else (other architectures, eager or varlen attention, sliding windows).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dspark_core.kv_slots import SlotWindow

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")


def supports(model: nn.Module) -> bool:
    """A causal LM of the Llama family with full attention everywhere, on "sdpa" or "dspark_sdpa" attention."""
    config = model.config
    if getattr(config, "model_type", None) not in LLAMA_FAMILY:
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "dspark_sdpa"):
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return False
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return False
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, p) for p in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if not hasattr(model, "lm_head"):
        return False
    for layer in base.layers:
        if not all(hasattr(layer, p) for p in _LAYER_PARTS):
            return False
        if not all(hasattr(layer.self_attn, p) for p in _ATTN_PARTS + ("scaling", "head_dim")):
            return False
    return _rotary_of(base.layers[0].self_attn) is not None


def _rotary_of(attn: nn.Module) -> Callable | None:
    """The model file's own `apply_rotary_pos_emb` (numerics as Hugging Face's)."""
    return getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)


def additive_mask(window: SlotWindow, dtype: torch.dtype) -> Tensor:
    """[R, 1, max_new, total] additive mask: query j of row r sees key p iff p ≤ past_r + j.

    Every row's new keys sit right behind its own cached ones (`SlotWindow.write`), so this one comparison
    is causal over the new positions and hides each row's unused tail. A padded query (j ≥ num_new) sees a
    few stale but finite positions: its output is garbage the caller ignores, never NaN.
    """
    key_pos = torch.arange(window.total, device=window.past_lengths.device)
    last = window.positions  # [R, max_new]: past_r + j
    visible = key_pos[None, None, :] <= last[:, :, None]  # [R, max_new, total]
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


@torch.no_grad()
def decoder_forward(
    model: nn.Module,
    window: SlotWindow,
    token_ids: Tensor,  # [R, max_new]
    layer_ids: Sequence[int],
    logits_at: Tensor | None = None,  # [U] positions to compute logits at (None: all)
) -> tuple[Tensor, Tensor]:
    """(logits [R, U or max_new, vocab] in the model's dtype, features [R, max_new, len(layer_ids) * hidden])."""
    base = model.model
    num_rows, max_new = token_ids.shape
    hidden = base.embed_tokens(token_ids)
    cos, sin = base.rotary_emb(hidden, window.positions)
    mask = additive_mask(window, hidden.dtype)
    rotary = _rotary_of(base.layers[0].self_attn)
    wanted = set(layer_ids)
    features = [hidden] if -1 in wanted else []
    for index, layer in enumerate(base.layers):
        attn = layer.self_attn
        residual = hidden
        x = layer.input_layernorm(hidden)
        shape = (num_rows, max_new, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape)
        k = attn.k_proj(x).view(shape)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head, before the transpose
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        keys, values = window.write(index, k, v)
        out = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=keys.shape[1] != q.shape[1]
        )
        hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(num_rows, max_new, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        if index in wanted:
            features.append(hidden)
    hidden = base.norm(hidden)
    if logits_at is not None:
        hidden = hidden[:, logits_at]
    logits = model.lm_head(hidden)
    if features:
        feats = torch.cat(features, dim=-1) if len(features) > 1 else features[0]
    else:
        feats = token_ids.new_zeros((num_rows, max_new, 0), dtype=hidden.dtype)
    return logits, feats
