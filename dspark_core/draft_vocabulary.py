"""Choosing a reduced draft vocabulary (EAGLE-3's `d2t`): the target tokens a draft may propose.

A draft's LM head over a 49 k-word vocabulary is most of a one-layer draft's cost, in training (the head,
softmax and L1 over every supervised position) and in drafting (one read of the whole head per block). The
target's own answers use a small part of its vocabulary, so a draft restricted to the tokens they use most
loses little: a token outside it can never be drafted (its position is rejected, as any miss is), and the
verifier still emits it exactly. `coverage` measures that loss before training: the share of answer tokens
that the vocabulary holds, on answers the choice did not see.

The choice ranks tokens by their count in the target's answers (what the draft must predict), then by a
second count (any larger text in the same domains, so that rare-but-real tokens beat never-seen ones), then by
id; tokens in `always` (stop tokens) are kept whatever their counts. Deterministic for the same counts.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor


def token_counts(token_streams: Iterable[Tensor | list[int]], vocab_size: int) -> Tensor:
    """Occurrences of every token id over the streams → [vocab_size] int64."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for tokens in token_streams:
        ids = torch.as_tensor(tokens, dtype=torch.long).flatten()
        if ids.numel():
            counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def choose_draft_vocabulary(counts: Tensor, size: int, *, secondary: Tensor | None = None,
                            always: Iterable[int] = ()) -> Tensor:
    """The `size` most frequent target ids by `counts`, ties broken by `secondary` counts and then by the lower
    id, with every id in `always` included → ascending int64 [size] (the order `draft_to_target` keeps)."""
    vocab_size = int(counts.numel())
    forced = sorted({int(t) for t in always})
    if not 1 <= size <= vocab_size:
        raise ValueError(f"a draft vocabulary needs 1 … {vocab_size} tokens, got {size}")
    if len(forced) > size or any(not 0 <= t < vocab_size for t in forced):
        raise ValueError(f"`always` must be at most {size} ids in [0, {vocab_size}), got {forced}")
    second = torch.zeros(vocab_size, dtype=torch.long) if secondary is None else secondary.long()
    # Lexicographic (count, secondary) as one key: secondary < its total + 1 fits beneath each count step.
    key = counts.long() * (int(second.sum()) + 1) + second
    key[forced] = -1  # placed by hand below
    order = torch.argsort(-key, stable=True)  # stable: equal keys keep ascending ids
    chosen = torch.cat([torch.tensor(forced, dtype=torch.long), order[: size - len(forced)]])
    return torch.sort(chosen).values


def coverage(vocabulary: Tensor, token_streams: Iterable[Tensor | list[int]]) -> float:
    """Share of the tokens in the streams that `vocabulary` holds (the ceiling on first-position acceptance
    under greedy verification of a perfect draft); nan without tokens."""
    inside = total = 0
    for tokens in token_streams:
        ids = torch.as_tensor(tokens, dtype=torch.long).flatten()
        inside += int(torch.isin(ids, vocabulary).sum())
        total += int(ids.numel())
    return inside / total if total else float("nan")
