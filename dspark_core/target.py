"""The target model: any Hugging Face causal LM, run over a batch of requests whose KV caches differ in length.

Speculative decoding needs three things from the target that plain `generate()` does not give:
logits for every verified position at once, the raw hidden states of chosen layers (the drafters'
input features), and a cache that can be cut back to the accepted length after each step. The cache
here is a slot tensor per layer (`[num_slots, kv_heads, capacity, head_dim]`) plus a length per
slot, so rollback is just lowering a length: rejected positions are masked out on the next forward
and overwritten when the slot grows again. A forward over a subset of slots hands Hugging Face a
`DynamicCache` cut to the longest slot and a 2-D attention mask that hides each slot's unused tail;
the new keys/values are scattered back behind each slot's own length.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from dspark_core.kv_slots import KVSlots


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

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        layer_ids: Sequence[int] | None = None,
    ) -> "TargetModel":
        """Load a local directory or a hub id (online users); `HF_HUB_OFFLINE=1` keeps it local."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
        return cls(model, layer_ids)

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
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def output_embeddings(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def new_cache(self, num_slots: int, capacity: int) -> KVSlots:
        return KVSlots.allocate(
            self.num_layers, num_slots, self.num_kv_heads, capacity, self.head_dim, self.dtype, self.device
        )

    @torch.no_grad()
    def forward(self, cache: KVSlots, rows: Tensor, token_ids: Tensor, num_new: Tensor) -> TargetOutput:
        """Run `token_ids` ([num_rows, max_new], right-padded, `num_new` valid each) after slots `rows`.

        Appends the valid new positions to each slot. Logits and features of padded positions are
        garbage and must be ignored by the caller.
        """
        from transformers import DynamicCache

        num_rows, max_new = token_ids.shape
        past_lengths = cache.lengths[rows]  # [num_rows]
        cache.check_room(rows, num_new)
        max_past = int(past_lengths.max()) if num_rows else 0
        hf_cache = DynamicCache()
        if max_past > 0:
            for layer, (k, v) in enumerate(cache.gather(rows, max_past)):
                hf_cache.update(k, v, layer)
        arange_new = torch.arange(max_new, device=self.device)
        past_valid = cache.valid_mask(rows, max_past)
        new_valid = arange_new[None, :] < num_new[:, None]
        attention_mask = torch.cat([past_valid, new_valid], dim=1).long()
        position_ids = past_lengths[:, None] + arange_new[None, :]
        out = self.model(
            input_ids=token_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            output_hidden_states=bool(self.layer_ids),
            **{self._cache_kwarg: hf_cache},
        )
        new_kv = [(k[:, :, max_past:], v[:, :, max_past:]) for k, v in _cache_layers(hf_cache)]
        cache.append(rows, new_kv, num_new)
        if self.layer_ids:
            features = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        else:
            features = token_ids.new_zeros((num_rows, max_new, 0), dtype=self.dtype)
        return TargetOutput(logits=out.logits.float(), features=features)


def _cache_layers(hf_cache) -> list[tuple[Tensor, Tensor]]:
    """Key/value tensors of a `DynamicCache`, across the transformers 4 → 5 layout change."""
    if hasattr(hf_cache, "layers"):
        return [(layer.keys, layer.values) for layer in hf_cache.layers]
    return list(zip(hf_cache.key_cache, hf_cache.value_cache))
