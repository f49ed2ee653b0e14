"""Drafters by name: a draft config shaped like its target, and a drafter built from a method and checkpoint."""

from __future__ import annotations

from typing import Any

from dspark_core.drafters.base import Drafter, NoDrafter
from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.draft_model import load_draft_model
from dspark_core.drafters.models import as_drafter
from dspark_core.drafters.ngram import NgramDrafter
from dspark_core.target import TargetModel, default_target_layer_ids

DRAFTERS = ("dspark", "dflash", "eagle3", "draft_model", "ngram", "none")


def draft_config_for(
    target: TargetModel,
    method: str,
    *,
    mask_token_id: int,
    head: str = "markov",
    num_layers: int | None = None,
    markov_rank: int = 256,
    confidence_head: bool | None = None,
    block_size: int = 7,
    target_layer_ids: tuple[int, ...] | None = None,
    num_target_features: int = 5,
    draft_vocab_size: int | None = None,
    markov_w1_rows: str = "target",
) -> DraftConfig:
    """A draft shaped like the target (as DeepSpec builds it): same hidden size, heads and vocabulary (or
    `draft_vocab_size` of its tokens: set them with `TargetFedDraft.set_draft_vocabulary`)."""
    t: Any = getattr(target.config, "text_config", None) or target.config  # a transformers config: dynamic fields
    if method not in ("dspark", "dflash", "eagle3"):
        raise ValueError(f"{method!r} is not a trainable drafter; valid: dspark, dflash, eagle3")
    is_dspark = method == "dspark"
    rope = getattr(t, "rope_theta", None) or (getattr(t, "rope_parameters", None) or {}).get("rope_theta", 1e6)
    return DraftConfig(
        method=method,
        vocab_size=target.vocab_size,
        hidden_size=target.hidden_size,
        intermediate_size=t.intermediate_size,
        num_layers=num_layers if num_layers is not None else (1 if method == "eagle3" else 5),
        num_attention_heads=t.num_attention_heads,
        num_kv_heads=target.num_kv_heads,
        head_dim=target.head_dim,
        target_hidden_size=target.hidden_size,
        target_layer_ids=tuple(target_layer_ids or default_target_layer_ids(target.num_layers, num_target_features)),
        mask_token_id=mask_token_id,
        block_size=block_size,
        head=head if is_dspark else "none",
        markov_rank=markov_rank,
        confidence_head=(is_dspark and head != "none") if confidence_head is None else confidence_head,
        rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
        rope_theta=float(rope),
        draft_vocab_size=draft_vocab_size,
        markov_w1_rows=markov_w1_rows,
    )


def build_drafter(method: str, *, checkpoint: str | None = None, target: TargetModel | None = None, **options) -> Drafter:
    """`none` and `ngram` need nothing; `draft_model` loads `checkpoint` as a Hugging Face causal LM (options:
    `target_tokenizer`, `dtype`, `device`, see `load_draft_model`); the other model drafters load a directory
    from `save_draft`."""
    if method == "none":
        return NoDrafter()
    if method == "ngram":
        return NgramDrafter(**options)
    if method not in DRAFTERS:
        raise ValueError(f"unknown drafter {method!r}; valid: {', '.join(DRAFTERS)}")
    if checkpoint is None:
        raise ValueError(f"drafter {method!r} needs a checkpoint directory")
    if method == "draft_model":
        return load_draft_model(checkpoint, target=target, **options)
    from dspark_core.checkpoint import load_draft

    model = load_draft(checkpoint, device=target.device if target is not None else "cpu", target=target)
    if model.config.method != method:
        raise ValueError(f"checkpoint {checkpoint} holds a {model.config.method!r} draft, not {method!r}")
    return as_drafter(model)
