"""The configuration of a trained drafter: everything needed to rebuild its modules from a checkpoint."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

METHODS = ("dspark", "dflash", "eagle3")
HEADS = ("markov", "gated", "rnn", "none")
W1_ROWS = ("target", "draft")


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
    # Rows of Markov W1: "target" (one per target token, vLLM's `markov_w1` [vocab, r]) or "draft" (one per
    # draft-vocabulary token plus one row shared by every anchor outside it). A drafted token is always in the
    # draft vocabulary, so only an anchor can fall outside it: "draft" costs (draft vocab + 1)·r instead of
    # vocab·r, which on SmolLM2 (8,192 of 49,152) buys 6× the rank for the same bytes. Export scatters it back.
    markov_w1_rows: str = "target"
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
        if self.markov_w1_rows not in W1_ROWS:
            raise ValueError(f"unknown markov_w1_rows {self.markov_w1_rows!r}; valid: {', '.join(W1_ROWS)}")
        if self.markov_w1_rows == "draft" and (self.draft_vocab_size is None or self.head == "none"):
            raise ValueError("markov_w1_rows 'draft' indexes W1 by the draft vocabulary: it needs a Markov, gated "
                             "or rnn head and draft_vocab_size set")
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in [1, vocab_size = {self.vocab_size}], "
                             f"got {self.draft_vocab_size}")

    @property
    def output_vocab_size(self) -> int:
        """Rows of the LM head and of Markov W2: the draft vocabulary's size."""
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @property
    def markov_w1_size(self) -> int:
        """Rows of Markov W1: the target's vocabulary, or the draft vocabulary and one shared row."""
        return self.vocab_size if self.markov_w1_rows == "target" else self.output_vocab_size + 1

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
