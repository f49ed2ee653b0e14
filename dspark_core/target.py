"""The target model: any Hugging Face causal LM, run over a batch of requests whose KV caches differ in length.

Speculative decoding needs three things from the target that plain `generate()` does not give:
logits for every verified position at once, the raw hidden states of chosen layers (the drafters'
input features), and a cache that can be cut back to the accepted length after each step. The cache
is `KVSlots` (kv_slots.py): a slot tensor per layer plus a length per slot, so rollback is just
lowering a length. A forward over slots reads them in place (views of a contiguous range of slots,
or of the range covering rows with a few holes) and writes each new position once.

Two forwards, the same numbers: Llama-family models on SDPA (Llama, Mistral, Qwen2, Qwen3: the CPU
targets) run `decoder_forward.py`, the model's own submodules in one loop without Hugging Face's
per-layer plumbing; any other model runs Hugging Face's forward over a `DynamicCache` whose layers
write into the slots (`kv_slots.hf_cache`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

from dspark_core import decoder_forward as lean_forward
from dspark_core.decoder_forward import decoder_forward
from dspark_core.kernels.attention_ref import use_varlen_attention
from dspark_core.kv_slots import _DynamicLayer, KVSlots, covering_range, hf_cache, hf_cache_layers
from dspark_core.sdpa_gqa import ATTN_IMPLEMENTATION as SDPA_GQA, use_sdpa_gqa


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
        # Llama-family models on SDPA run `decoder_forward` (the same submodules without Hugging Face's per-layer
        # plumbing, new keys/values written once behind each row); anything else runs Hugging Face's forward.
        self.lean: bool = not self.varlen_attention and lean_forward.supports(self.model)
        self._fused: lean_forward.Fused | None = None  # built at the first lean forward
        self.pack_weights: bool = True  # prepacked projections and LM head where they pay (decoder_forward.packed)
        self.bf16_linear: bool = True  # bf16 on the CPU: packed for the C++ bf16 kernel where it runs, not oneDNN
        self.decode_products: bool = True  # bf16/fp16 decode steps' attention as fp32 products (decode_attention.py)
        self.fused_pointwise: bool = True  # bf16 on the CPU: norms, rotary, SiLU·up as C++ calls (decoder_forward)

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
        cover = covering_range(cache.lengths, rows) if self.lean or _DynamicLayer is not None else None
        if cover is not None:
            # The slot range around rows with a few holes: idle slots take no new positions (num_new 0, so
            # nothing is appended to them) and their outputs are dropped.
            spread_at = cover.spread(logits_at) if logits_at is not None else None
            out = self.forward(cache, cover.span, cover.spread(token_ids), cover.spread(num_new), logits_at=spread_at)
            return TargetOutput(logits=cover.pick(out.logits), features=cover.pick(out.features))
        keep = inverse = None
        if logits_at is not None:
            keep, inverse = torch.unique(logits_at, return_inverse=True)  # [U] positions, [num_rows, k] → U
        if self.lean:
            window = cache.window(rows, num_new, token_ids.shape[1])
            self._fused = lean_forward.fused_for(self.model, self._fused, self.pack_weights, self.bf16_linear)
            logits, features = decoder_forward(self.model, self._fused, window, token_ids, self.layer_ids, keep,
                                               self.decode_products, self.fused_pointwise)
            window.close()
        else:
            logits, features = self._hf_forward(cache, rows, token_ids, num_new, keep)
        logits = logits.float()
        if inverse is not None:
            logits = logits[torch.arange(len(rows), device=logits.device)[:, None], inverse]
        return TargetOutput(logits=logits, features=features)

    def _hf_forward(
        self, cache: KVSlots, rows: Tensor, token_ids: Tensor, num_new: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Hugging Face's own forward over the slots (`kv_slots.hf_cache`): (logits at `keep` or everywhere,
        features). For models `decoder_forward` does not cover, and the varlen attention path."""
        num_rows, max_new = token_ids.shape
        past_lengths = cache.lengths[rows]  # [num_rows]
        cache.check_room(rows, num_new)
        max_past = int(past_lengths.max()) if num_rows else 0
        position_ids = past_lengths[:, None] + torch.arange(max_new, device=token_ids.device)[None, :]
        if _DynamicLayer is not None:
            buffers = cache.attention_buffers(rows, max_past, max_past + max_new)
            past_kv = hf_cache(buffers, max_past)
        else:  # pragma: no cover - transformers < 4.56
            buffers = None
            past_kv = hf_cache(None, max_past, cache.gather(rows, max_past) if max_past else ())
        kwargs = {}
        if keep is not None and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = keep
        out = self.model(
            input_ids=token_ids,
            attention_mask=self._attention_mask(cache, rows, max_past, num_new, max_new),
            position_ids=position_ids,
            use_cache=True,
            output_hidden_states=bool(self.layer_ids),
            **{self._cache_kwarg: past_kv},
            **kwargs,
        )
        layers = buffers if buffers is not None else hf_cache_layers(past_kv)
        cache.append(rows, [(k[:, :, max_past:], v[:, :, max_past:]) for k, v in layers], num_new)
        if self.layer_ids:
            features = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        else:
            features = token_ids.new_zeros((num_rows, max_new, 0), dtype=self.dtype)
        logits = out.logits
        if keep is not None and not self._has_logits_to_keep:
            logits = logits[:, keep]
        return logits, features

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
        # Every query also sees itself: a padded one, or one of an idle slot (a covering forward: nothing cached,
        # nothing new), would otherwise see no key at all and SDPA would fill its row, ignored anyway, with NaN.
        diagonal = arange_new[None, :] == arange_new[:, None]
        new_part = (causal[None, :, :] & new_valid[:, None, :]) | diagonal[None, :, :]  # [R, max_new, max_new]
        past_part = past_valid[:, None, :].expand(-1, max_new, -1)  # [R, max_new, max_past]
        return torch.cat([past_part, new_part], dim=2)[:, None]
