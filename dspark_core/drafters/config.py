"""The configuration of a trained drafter: everything needed to rebuild its modules from a checkpoint."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

METHODS = ("dspark", "dflash", "eagle3")
HEADS = ("markov", "gated", "rnn", "none")


@dataclass(frozen=True)
class DraftConfig:
    method: str  # one of METHODS
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int  # draft decoder layers (DSpark reference: 5; Eagle3-style: 1)
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]  # 0-based: residual stream after that target layer
    mask_token_id: int  # fills block slots 1 … γ−1 (DSpark/DFlash)
    block_size: int = 7  # training block (γ slots: anchor + γ−1 masks); inference may use fewer
    head: str = "markov"  # sequential head: markov (default), gated (gated Markov), rnn, none (DFlash)
    markov_rank: int = 256  # r of W1 [V, r] and W2 [r → V]; the paper: 64 clearly worse, 512 no gain
    confidence_head: bool = True  # σ(Linear([h_k ; W1[x_{k−1}]])): needs a head with W1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    # A reduced draft vocabulary (EAGLE-3's and vLLM's `draft_vocab_size` with its `d2t` map): the LM head and
    # Markov W2 cover only these many of the target's tokens (the model's `draft_to_target` buffer lists
    # them), so drafting reads a fraction of the 49k-row head. None: the target's whole vocabulary.
    draft_vocab_size: int | None = None
    extra: dict = field(default_factory=dict, hash=False, compare=False)  # provenance, STS temperatures, …

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown draft method {self.method!r}; valid: {', '.join(METHODS)}")
        if self.head not in HEADS:
            raise ValueError(f"unknown draft head {self.head!r}; valid: {', '.join(HEADS)}")
        if self.method != "dspark" and (self.head != "none" or self.confidence_head):
            raise ValueError(f"{self.method} has no sequential or confidence head: set head='none', confidence_head=False")
        if self.confidence_head and self.head == "none":
            raise ValueError("the confidence head reads W1[x_{k-1}]: it needs a markov, gated or rnn head")
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in [1, vocab_size = {self.vocab_size}], "
                             f"got {self.draft_vocab_size}")

    @property
    def output_vocab_size(self) -> int:
        """Rows of the LM head and of Markov W2: the draft vocabulary's size."""
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @property
    def num_target_features(self) -> int:
        return len(self.target_layer_ids)

    def to_json(self) -> str:
        data = asdict(self)
        data["target_layer_ids"] = list(self.target_layer_ids)
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "DraftConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown draft config keys {unknown}; valid: {sorted(known)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> "DraftConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))
