"""The target cache: what a draft learns from (DeepSpec recipe, spec §3).

The target answers the training prompts itself (plain decoding, seeded), so the draft learns the
target's own distribution rather than a dataset's. One full target forward over each prompt+answer
then records, per position t, the raw hidden states of the draft's `target_layer_ids` (the same
features a drafter sees at inference) and the target's logits (the target's prediction of token
t+1; the loss needs them at temperature 1 for the L1 term and the acceptance label).

Loss region: training anchors are answer positions only, `prompt_len ≤ anchor ≤ T − 2`. At
inference the first anchor is the first generated token (position `prompt_len`: prefill emits it),
so the last prompt token is never an anchor and is not trained as one.

Size: logits are [T, vocab] per sequence, fine for the tiny targets this CPU reference trains. A real
vocabulary makes them most of the cache (SmolLM2's 49,152 columns in bf16: ≈ 98 KB per token against ≈ 6 KB of
features), and a draft with a reduced vocabulary reads only its own columns. So a cache may keep only those:
with `logit_ids`, each sequence's `logits` are the target's log-probabilities at those ids, normalised over
the whole vocabulary before the columns are dropped. That is exactly what the loss reads for such a draft
(dspark_core/training.py, `draft_vocab_sequences`), so training from it is the same as training from full
logits, at a sixth of the memory for 8,192 columns; what it cannot train is a draft whose vocabulary is not
among those ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from dspark_core.drafters.base import NoDrafter
from dspark_core.generate import GenerationConfig, generate
from dspark_core.target import TargetModel

CACHE_FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: full logits only (no logit_ids)


@dataclass
class TargetSequence:
    token_ids: Tensor  # [T] long: prompt then the target's own answer
    features: Tensor  # [T, num_layers * hidden] raw hidden states of the cache's layer_ids
    logits: Tensor  # [T, vocab] (or [T, len(logit_ids)] log-probs): row t is the target's prediction of token t+1
    prompt_len: int  # anchors are positions prompt_len … T−2

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_anchors(self) -> int:
        """Positions that can anchor a block (each needs at least one label after it)."""
        return max(0, self.num_tokens - 1 - self.prompt_len)


@dataclass
class TargetCache:
    sequences: list[TargetSequence]
    layer_ids: tuple[int, ...]  # target layers whose outputs `features` concatenates
    meta: dict = field(default_factory=dict)  # temperature, max_new_tokens, seed, …
    # None: `logits` are raw logits over the whole vocabulary. Else the ascending target ids of their columns,
    # which then hold log-probabilities normalised over all `target_vocab_size` tokens.
    logit_ids: Tensor | None = None
    target_vocab_size: int | None = None

    def __post_init__(self) -> None:
        if (self.logit_ids is None) != (self.target_vocab_size is None):
            raise ValueError("a target cache with logit_ids needs target_vocab_size, and only then")

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def feature_size(self) -> int:
        return int(self.sequences[0].features.shape[-1])

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary size (whatever columns the cache keeps)."""
        if self.target_vocab_size is not None:
            return self.target_vocab_size
        return int(self.sequences[0].logits.shape[-1])

    def save(self, path: str | Path) -> None:
        """One `.pt` file (torch.save of plain tensors and lists; `load` uses weights_only=True)."""
        torch.save(
            {
                "version": CACHE_FORMAT_VERSION,
                "layer_ids": list(self.layer_ids),
                "meta": dict(self.meta),
                "token_ids": [s.token_ids for s in self.sequences],
                "features": [s.features for s in self.sequences],
                "logits": [s.logits for s in self.sequences],
                "prompt_lens": [s.prompt_len for s in self.sequences],
                "logit_ids": self.logit_ids,
                "target_vocab_size": self.target_vocab_size,
            },
            Path(path),
        )

    @classmethod
    def load(cls, path: str | Path) -> "TargetCache":
        data = torch.load(Path(path), weights_only=True)
        if data.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"target cache {path}: format version {data.get('version')}, expected one of {READABLE_VERSIONS}")
        seqs = [
            TargetSequence(t, f, lg, int(p))
            for t, f, lg, p in zip(data["token_ids"], data["features"], data["logits"], data["prompt_lens"])
        ]
        return cls(seqs, tuple(data["layer_ids"]), data["meta"], data.get("logit_ids"), data.get("target_vocab_size"))


def build_target_cache(
    target: TargetModel,
    prompts: Sequence[Sequence[int]],
    *,
    layer_ids: Sequence[int] | None = None,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    stop_token_ids: tuple[int, ...] = (),
    seed: int = 0,
    batch_size: int = 32,
    logits_dtype: torch.dtype = torch.float32,
    logit_ids: Tensor | None = None,
) -> TargetCache:
    """Generate answers with the target (plain decoding), then record features and logits.

    `layer_ids`: the draft config's `target_layer_ids` (default: the target's current ones); the
    target's own setting is restored afterwards. Request i samples from generator seed+i.
    `logit_ids`: keep only these columns, as log-probabilities (the module's docstring says why).
    """
    answers = generate_answers(
        target, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
        stop_token_ids=stop_token_ids, seed=seed, batch_size=batch_size,
    )
    meta = {"temperature": float(temperature), "max_new_tokens": int(max_new_tokens), "seed": int(seed)}
    return record_cache(target, prompts, answers, layer_ids=layer_ids, batch_size=batch_size, logits_dtype=logits_dtype,
                        logit_ids=logit_ids, meta=meta)


def record_cache(
    target: TargetModel,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    *,
    layer_ids: Sequence[int] | None = None,
    batch_size: int = 32,
    logits_dtype: torch.dtype = torch.float32,
    logit_ids: Tensor | None = None,
    meta: dict | None = None,
) -> TargetCache:
    """The cache of prompt i followed by answer i: one target forward per batch. Kept apart from generation so
    that a caller can choose `logit_ids` from the answers before any logits are kept."""
    if logit_ids is not None:
        logit_ids = torch.as_tensor(logit_ids, dtype=torch.long)
        if logit_ids.dim() != 1 or not bool((logit_ids[1:] > logit_ids[:-1]).all()):
            raise ValueError("logit_ids must be ascending distinct target ids")
    saved = target.layer_ids
    if layer_ids is not None:
        target.set_layer_ids(layer_ids)
    try:
        ids = target.layer_ids
        sequences: list[TargetSequence] = []
        for start in range(0, len(prompts), batch_size):
            chunk = [list(p) + list(a) for p, a in zip(prompts[start : start + batch_size], answers[start : start + batch_size])]
            for seq, prompt in zip(record_sequences(target, chunk, logits_dtype, logit_ids), prompts[start : start + batch_size]):
                seq.prompt_len = len(prompt)
                sequences.append(seq)
    finally:
        target.set_layer_ids(saved)
    return TargetCache(sequences, ids, dict(meta or {}), logit_ids,
                       None if logit_ids is None else int(target.vocab_size))


def generate_answers(
    target: TargetModel,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    stop_token_ids: tuple[int, ...] = (),
    seed: int = 0,
    batch_size: int = 32,
) -> list[list[int]]:
    """The target's own answers (plain decoding through the one generation loop)."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, stop_token_ids=stop_token_ids)
    answers: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        gens = [torch.Generator(device="cpu").manual_seed(seed + start + i) for i in range(len(chunk))]
        answers += [r.output_ids for r in generate(target, NoDrafter(), chunk, config, generators=gens)]
    return answers


@torch.no_grad()
def record_sequences(
    target: TargetModel, sequences: Sequence[Sequence[int]], logits_dtype: torch.dtype = torch.float32,
    logit_ids: Tensor | None = None,
) -> list[TargetSequence]:
    """One batched target forward (fresh KV slots) over whole sequences; prompt_len left at 0. With
    `logit_ids`: log-probabilities at those ids (normalised in fp32 over the whole vocabulary) instead of logits."""
    device = target.device
    lengths = torch.tensor([len(s) for s in sequences], device=device)
    padded = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.long, device=device)
    for i, s in enumerate(sequences):
        padded[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    cache = target.new_cache(len(sequences), padded.shape[1])
    out = target.forward(cache, torch.arange(len(sequences), device=device), padded, lengths)
    return [
        TargetSequence(
            token_ids=padded[i, :n].cpu(),
            features=out.features[i, :n].cpu(),
            logits=_kept_logits(out.logits[i, :n], logit_ids).to(logits_dtype).cpu(),
            prompt_len=0,
        )
        for i, n in enumerate(lengths.tolist())
    ]


def _kept_logits(logits: Tensor, logit_ids: Tensor | None) -> Tensor:
    if logit_ids is None:
        return logits
    return torch.log_softmax(logits.float(), -1)[:, logit_ids.to(logits.device)]
