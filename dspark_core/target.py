"""The target model: any Hugging Face causal LM, run over a batch of requests whose KV caches differ in length.

Speculative decoding needs three things from the target that plain `generate()` does not give:
logits for every verified position at once, the raw hidden states of chosen layers (the drafters'
input features), and a cache that can be cut back to the accepted length after each step. The cache
here is a slot tensor per layer (`[num_slots, kv_heads, capacity, head_dim]`) plus a length per
slot, so rollback is just lowering a length: rejected positions are masked out on the next forward
and overwritten when the slot grows again. A forward over a subset of slots hands Hugging Face a
cache cut to the longest slot and an attention mask that hides each slot's unused tail; the new
keys/values are moved back behind each slot's own length.

The cache handed over (transformers ≥ 4.56, which has cache layers) is a `DynamicCache` whose layers
write the new keys/values straight into `KVSlots.attention_buffers`: views of the slots when the rows
are a contiguous range, so a decode step copies no cached keys/values at all (the older path gathered
every slot and then concatenated the new positions, two full copies per layer and step). With SDPA
attention the 4-D boolean mask is built here, once, rather than by Hugging Face from a 2-D one.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from dspark_core.kernels.attention_ref import use_varlen_attention
from dspark_core.kv_slots import KVSlots, covering_range
from dspark_core.sdpa_gqa import ATTN_IMPLEMENTATION as SDPA_GQA, use_sdpa_gqa

try:  # transformers >= 4.56: caches are lists of layers
    from transformers.cache_utils import DynamicLayer as _DynamicLayer
except ImportError:  # pragma: no cover - older transformers: the gather-and-concatenate path below
    _DynamicLayer = None


def default_target_layer_ids(num_target_layers: int, num_features: int = 5) -> tuple[int, ...]:
    """Evenly spaced layers from 1 to L-3, never the last (DSpark/DFlash reference choice).

    For a 36-layer Qwen3 and 5 features this gives (1, 9, 17, 25, 33), as in the spec.
    """
    if num_target_layers < 2:
        raise ValueError("the target needs at least 2 layers to feed a drafter")
    start, end = min(1, num_target_layers - 2), max(min(1, num_target_layers - 2), num_target_layers - 3)
    if num_features <= 1:
        return (start,)
    span = end - start
    ids = sorted({round(start + i * span / (num_features - 1)) for i in range(num_features)})
    return tuple(ids)


@dataclass
class TargetOutput:
    logits: Tensor  # [num_rows, max_new, vocab] fp32
    features: Tensor  # [num_rows, max_new, num_layers * hidden] raw hidden states of the chosen layers


class TargetModel:
    """Wraps a Hugging Face `AutoModelForCausalLM` for verification and feature extraction."""

    def __init__(self, model: nn.Module, layer_ids: Sequence[int] | None = None):
        self.model = model.eval()
        self.config = model.config
        text_config = getattr(self.config, "text_config", None) or self.config
        self.num_layers: int = text_config.num_hidden_layers
        self.hidden_size: int = text_config.hidden_size
        self.vocab_size: int = text_config.vocab_size
        self.num_kv_heads: int = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
        self.head_dim: int = getattr(text_config, "head_dim", None) or self.hidden_size // text_config.num_attention_heads
        self.layer_ids: tuple[int, ...] = ()
        self.set_layer_ids(layer_ids if layer_ids is not None else default_target_layer_ids(self.num_layers))
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; accept both generations.
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self._first_param = next(model.parameters())
        # On the Triton path (CUDA, or DSPARK_KERNELS=triton under the interpreter) verification attention is
        # the varlen kernel: no padded 4-D mask, no repeat_kv copy. Elsewhere the model keeps its own attention.
        self.varlen_attention: bool = use_varlen_attention(self.model)
        # On the CPU, SDPA with grouped KV heads read in place (sdpa_gqa.py): no repeat_kv copy per verify step.
        if not self.varlen_attention:
            use_sdpa_gqa(self.model)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        layer_ids: Sequence[int] | None = None,
    ) -> "TargetModel":
        """Load a local directory or a hub id (online users); `HF_HUB_OFFLINE=1` keeps it local. A
        random-weight directory (`dspark_core.random_init`) is built from its config instead."""
        from dspark_core.random_init import load_causal_lm

        return cls(load_causal_lm(path, dtype, device), layer_ids)

    def set_layer_ids(self, layer_ids: Sequence[int]) -> None:
        ids = tuple(int(i) for i in layer_ids)
        bad = [i for i in ids if not -1 <= i < self.num_layers - 1]
        if bad:
            raise ValueError(
                f"target layer ids {bad} out of range: use -1 (embeddings) … {self.num_layers - 2}; "
                f"the last layer ({self.num_layers - 1}) is post-norm in Hugging Face and never a draft feature"
            )
        if list(ids) != sorted(set(ids)):
            raise ValueError(f"target layer ids must be strictly increasing, got {list(ids)}")
        self.layer_ids = ids

    @property
    def device(self) -> torch.device:
        return self._first_param.device  # `module.to()` keeps Parameter objects, so this follows the model

    @property
    def dtype(self) -> torch.dtype:
        return self._first_param.dtype

    def input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def output_embeddings(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def new_cache(self, num_slots: int, capacity: int) -> KVSlots:
        return KVSlots.allocate(
            self.num_layers, num_slots, self.num_kv_heads, capacity, self.head_dim, self.dtype, self.device
        )

    @torch.no_grad()
    def forward(
        self, cache: KVSlots, rows: Tensor, token_ids: Tensor, num_new: Tensor, *, logits_at: Tensor | None = None
    ) -> TargetOutput:
        """Run `token_ids` ([num_rows, max_new], right-padded, `num_new` valid each) after slots `rows`.

        Appends the valid new positions to each slot. Logits and features of padded positions are
        garbage and must be ignored by the caller. `logits_at` ([num_rows, k] positions in 0 … max_new − 1)
        computes logits only there (a prefill needs one per prompt, not one per prompt token): the
        returned logits are then [num_rows, k, vocab]. Features always cover every position.
        """
        cover = covering_range(cache.lengths, rows) if _DynamicLayer is not None else None
        if cover is not None:
            return self._forward_covering(cache, cover, token_ids, num_new, logits_at)
        num_rows, max_new = token_ids.shape
        past_lengths = cache.lengths[rows]  # [num_rows]
        cache.check_room(rows, num_new)
        max_past = int(past_lengths.max()) if num_rows else 0
        arange_new = torch.arange(max_new, device=token_ids.device)
        position_ids = past_lengths[:, None] + arange_new[None, :]
        buffers = cache.attention_buffers(rows, max_past, max_past + max_new) if _DynamicLayer is not None else None
        hf_cache = self._hf_cache(cache, rows, max_past, buffers)
        kwargs = {}
        keep = inverse = None
        if logits_at is not None and self._has_logits_to_keep:
            keep, inverse = torch.unique(logits_at, return_inverse=True)  # [U] positions, [num_rows, k] → U
            kwargs["logits_to_keep"] = keep
        out = self.model(
            input_ids=token_ids,
            attention_mask=self._attention_mask(cache, rows, max_past, num_new, max_new),
            position_ids=position_ids,
            use_cache=True,
            output_hidden_states=bool(self.layer_ids),
            **{self._cache_kwarg: hf_cache},
            **kwargs,
        )
        if buffers is not None:
            new_kv = [(k[:, :, max_past:], v[:, :, max_past:]) for k, v in buffers]
        else:
            new_kv = [(k[:, :, max_past:], v[:, :, max_past:]) for k, v in _cache_layers(hf_cache)]
        cache.append(rows, new_kv, num_new)
        if self.layer_ids:
            features = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        else:
            features = token_ids.new_zeros((num_rows, max_new, 0), dtype=self.dtype)
        logits = out.logits.float()
        if logits_at is not None:
            if keep is not None:
                logits = logits[torch.arange(num_rows, device=logits.device)[:, None], inverse]
            else:
                logits = logits[torch.arange(num_rows, device=logits.device)[:, None], logits_at]
        return TargetOutput(logits=logits, features=features)

    def _forward_covering(
        self, cache: KVSlots, cover: tuple[Tensor, Tensor], token_ids: Tensor, num_new: Tensor, logits_at: Tensor | None
    ) -> TargetOutput:
        """`forward` over the slot range that covers the rows (`covering_range`): the idle slots in it take no
        new positions (num_new 0, so nothing is appended to them) and their outputs are dropped."""
        span, at = cover
        padded = token_ids.new_zeros((len(span), token_ids.shape[1]))
        padded[at] = token_ids
        span_new = num_new.new_zeros(len(span))
        span_new[at] = num_new
        span_logits_at = None
        if logits_at is not None:
            span_logits_at = logits_at.new_zeros((len(span), logits_at.shape[1]))
            span_logits_at[at] = logits_at
        out = self.forward(cache, span, padded, span_new, logits_at=span_logits_at)
        return TargetOutput(logits=out.logits[at], features=out.features[at])

    def _hf_cache(self, cache: KVSlots, rows: Tensor, max_past: int, buffers):
        from transformers import DynamicCache

        hf_cache = DynamicCache()
        if buffers is not None:
            hf_cache.layers = [_SlotLayer(k, v, max_past) for k, v in buffers]
        elif max_past > 0:
            for layer, (k, v) in enumerate(cache.gather(rows, max_past)):
                hf_cache.update(k, v, layer)
        return hf_cache

    def _attention_mask(self, cache: KVSlots, rows: Tensor, max_past: int, num_new: Tensor, max_new: int) -> Tensor:
        """Which positions each new token attends to. SDPA: the final [R, 1, max_new, max_past + max_new] boolean
        mask (each row's own cached positions, then causal over its valid new ones), which Hugging Face passes
        through as is; other attention implementations: the 2-D padding mask they expand themselves."""
        past_valid = cache.valid_mask(rows, max_past)  # [R, max_past]
        arange_new = torch.arange(max_new, device=num_new.device)
        new_valid = arange_new[None, :] < num_new[:, None]  # [R, max_new]
        if getattr(self.config, "_attn_implementation", None) not in ("sdpa", SDPA_GQA):
            return torch.cat([past_valid, new_valid], dim=1).long()
        causal = arange_new[None, :] <= arange_new[:, None]  # [max_new (query), max_new (key)]
        # Every query also sees itself: a padded one, or one of an idle slot (`_forward_covering`: nothing cached,
        # nothing new), would otherwise see no key at all and SDPA would fill its row, ignored anyway, with NaN.
        diagonal = arange_new[None, :] == arange_new[:, None]
        new_part = (causal[None, :, :] & new_valid[:, None, :]) | diagonal[None, :, :]  # [R, max_new, max_new]
        past_part = past_valid[:, None, :].expand(-1, max_new, -1)  # [R, max_new, max_past]
        return torch.cat([past_part, new_part], dim=2)[:, None]


if _DynamicLayer is not None:

    class _SlotLayer(_DynamicLayer):
        """A Hugging Face cache layer over one layer's `KVSlots.attention_buffers` (k, v) [R, kv_heads, total,
        head_dim], holding `past` positions: `update` writes the new keys/values at [past, past + n) and
        returns views up to there, so nothing is concatenated."""

        def __init__(self, keys: Tensor, values: Tensor, past: int):
            super().__init__()
            self._key_buffer, self._value_buffer, self._past = keys, values, past
            self.keys, self.values = keys[:, :, :past], values[:, :, :past]
            self.device = keys.device
            self.is_initialized = True

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            end = self._past + key_states.shape[-2]
            self._key_buffer[:, :, self._past : end] = key_states
            self._value_buffer[:, :, self._past : end] = value_states
            self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
            return self.keys, self.values


def _cache_layers(hf_cache) -> list[tuple[Tensor, Tensor]]:
    """Key/value tensors of a `DynamicCache`, across the transformers 4 → 5 layout change."""
    if hasattr(hf_cache, "layers"):
        return [(layer.keys, layer.values) for layer in hf_cache.layers]
    return list(zip(hf_cache.key_cache, hf_cache.value_cache))
