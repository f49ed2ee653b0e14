"""SDPA for the target on the CPU that reads grouped key/value heads in place ("dspark_sdpa").

Hugging Face's "sdpa" attention copies every layer's whole KV cache once per step whenever a step
verifies more than one token per request and a mask is given (`repeat_kv`: GQA is only handed to SDPA
unmasked, because CUDA's fast kernels refuse masks). Speculative verification always has both, so on the
CPU that copy was a third of a verify step at batch 64 (embedded default, 5 layers, 2 KV heads for 4
query heads: 3.4 ms of copying against 0.8 ms of attention per layer). Torch's CPU SDPA takes
`enable_gqa` with a boolean mask and gives bit-identical results, so this function passes both through.

It is switched on by `TargetModel` for CPU models on "sdpa" with grouped heads only: on CUDA the masked
GQA path would fall back to the math kernel, and the Triton varlen attention is used there instead. The
mask is the 4-D boolean one `TargetModel` builds for SDPA, which Hugging Face passes through untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ATTN_IMPLEMENTATION = "dspark_sdpa"


def sdpa_gqa_attention(
    module: torch.nn.Module,
    query: Tensor,  # [R, heads, q, head_dim]
    key: Tensor,  # [R, kv_heads, k, head_dim]
    value: Tensor,
    attention_mask: Tensor | None,  # [R, 1, q, k] bool (True: may attend), or None
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    if dropout:
        raise NotImplementedError("dspark_sdpa attention is for inference (dropout 0)")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("dspark_sdpa attention has no sliding window")
    causal = attention_mask is None and query.shape[2] > 1 and (is_causal if is_causal is not None else True)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def wants_sdpa_gqa(model: torch.nn.Module) -> bool:
    """CPU, Hugging Face SDPA, grouped KV heads: where `repeat_kv` would copy the cache every verify step."""
    config = model.config
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    device = next(model.parameters()).device
    return getattr(config, "_attn_implementation", None) == "sdpa" and kv_heads < heads and device.type == "cpu"


def use_sdpa_gqa(model: torch.nn.Module) -> bool:
    """Switch `model` to "dspark_sdpa" where `wants_sdpa_gqa`; True if switched."""
    if not wants_sdpa_gqa(model) or not hasattr(model, "set_attn_implementation"):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, sdpa_gqa_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return True
