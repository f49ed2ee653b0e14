"""The target cache: what a draft learns from (DeepSpec recipe, spec §3).

The target answers the training prompts itself (plain decoding, seeded), so the draft learns the
target's own distribution rather than a dataset's. One full target forward over each prompt+answer
then records, per position t, the raw hidden states of the draft's `target_layer_ids` (the same
features a drafter sees at inference) and the target's logits (the target's prediction of token
t+1; the loss needs them at temperature 1 for the L1 term and the acceptance label).

Loss region: training anchors are answer positions only, `prompt_len ≤ anchor ≤ T − 2`. At
inference the first anchor is the first generated token (position `prompt_len`: prefill emits it),
so the last prompt token is never an anchor and is not trained as one.

Size: logits are [T, vocab] per sequence, fine for the tiny targets this CPU reference trains;
a real-vocabulary run would store them in bf16 (`logits_dtype`) or recompute them on the fly.
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

CACHE_FORMAT_VERSION = 1


@dataclass
class TargetSequence:
    token_ids: Tensor  # [T] long: prompt then the target's own answer
    features: Tensor  # [T, num_layers * hidden] raw hidden states of the cache's layer_ids
    logits: Tensor  # [T, vocab]: row t is the target's prediction of token t+1
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

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def feature_size(self) -> int:
        return int(self.sequences[0].features.shape[-1])

    @property
    def vocab_size(self) -> int:
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
            },
            Path(path),
        )

    @classmethod
    def load(cls, path: str | Path) -> "TargetCache":
        data = torch.load(Path(path), weights_only=True)
        if data.get("version") != CACHE_FORMAT_VERSION:
            raise ValueError(f"target cache {path}: format version {data.get('version')}, expected {CACHE_FORMAT_VERSION}")
        seqs = [
            TargetSequence(t, f, lg, int(p))
            for t, f, lg, p in zip(data["token_ids"], data["features"], data["logits"], data["prompt_lens"])
        ]
        return cls(seqs, tuple(data["layer_ids"]), data["meta"])


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
) -> TargetCache:
    """Generate answers with the target (plain decoding), then record features and logits.

    `layer_ids`: the draft config's `target_layer_ids` (default: the target's current ones); the
    target's own setting is restored afterwards. Request i samples from generator seed+i.
    """
    answers = generate_answers(
        target, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
        stop_token_ids=stop_token_ids, seed=seed, batch_size=batch_size,
    )
    saved = target.layer_ids
    if layer_ids is not None:
        target.set_layer_ids(layer_ids)
    try:
        ids = target.layer_ids
        sequences: list[TargetSequence] = []
        for start in range(0, len(prompts), batch_size):
            chunk = [list(p) + a for p, a in zip(prompts[start : start + batch_size], answers[start : start + batch_size])]
            for seq, prompt in zip(record_sequences(target, chunk, logits_dtype), prompts[start : start + batch_size]):
                seq.prompt_len = len(prompt)
                sequences.append(seq)
    finally:
        target.set_layer_ids(saved)
    meta = {"temperature": float(temperature), "max_new_tokens": int(max_new_tokens), "seed": int(seed)}
    return TargetCache(sequences, ids, meta)


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
    target: TargetModel, sequences: Sequence[Sequence[int]], logits_dtype: torch.dtype = torch.float32
) -> list[TargetSequence]:
    """One batched target forward (fresh KV slots) over whole sequences; prompt_len left at 0."""
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
            logits=out.logits[i, :n].to(logits_dtype).cpu(),
            prompt_len=0,
        )
        for i, n in enumerate(lengths.tolist())
    ]
