"""Exact output distributions of a tiny target, and the χ² test that compares samples against them.

The losslessness tests need the *true* joint law of the first k generated tokens, computed without
any of the code under test: plain Hugging Face forwards over every prefix (V^(k−1) of them), softmax
at the sampling temperature in float64. With V = 8 and k = 3 that is 1 + 8 + 64 prompts.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Iterable, Sequence

import numpy as np
import torch
from scipy import stats


@torch.no_grad()
def exact_joint(model: torch.nn.Module, prompt: Sequence[int], num_tokens: int, temperature: float) -> np.ndarray:
    """P(x_1 … x_k | prompt) as an array of shape [V] * k, from plain full forwards of `model`."""
    vocab = model.config.vocab_size
    joint = np.ones(())
    for depth in range(num_tokens):
        prefixes = list(itertools.product(range(vocab), repeat=depth))  # lexicographic, matches reshape
        inputs = torch.tensor([list(prompt) + list(p) for p in prefixes], dtype=torch.long)
        logits = model(input_ids=inputs).logits[:, -1].double()  # [V^depth, V]
        probs = torch.softmax(logits / temperature, dim=-1).numpy()
        joint = joint[..., None] * probs.reshape((vocab,) * depth + (vocab,))
    return joint


def count_prefixes(sequences: Iterable[Sequence[int]], num_tokens: int, vocab: int) -> np.ndarray:
    """Histogram of the first `num_tokens` tokens of each sequence, shape [V] * k."""
    counts = np.zeros((vocab,) * num_tokens, dtype=np.int64)
    for seq, n in Counter(tuple(s[:num_tokens]) for s in sequences).items():
        if len(seq) != num_tokens:
            raise ValueError(f"a sequence has fewer than {num_tokens} tokens: {seq}")
        counts[seq] += n
    return counts


def chi2_gof(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson χ² goodness of fit of `counts` against `probs`; returns (statistic, dof, p-value).

    Cells with expected count below `min_expected` are pooled into one cell (and if that pool is
    itself too small, the smallest kept cells join it), the usual rule for the χ² approximation.
    A cell the model gives probability 0 but the sample hits makes the fit fail outright (p = 0).
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    total = counts.sum()
    if total <= 0:
        raise ValueError("no samples")
    if bool(((probs <= 0) & (counts > 0)).any()):
        return float("inf"), 0, 0.0
    expected = probs / probs.sum() * total
    order = np.argsort(expected)
    small = expected[order] < min_expected
    num_small = int(small.sum())
    while num_small < len(order) and 0 < expected[order[:num_small]].sum() < min_expected:
        num_small += 1
    pooled, kept = order[:num_small], order[num_small:]
    obs = list(counts[kept])
    exp = list(expected[kept])
    if num_small and expected[pooled].sum() > 0:
        obs.append(counts[pooled].sum())
        exp.append(expected[pooled].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    statistic = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    dof = len(obs_a) - 1
    if dof < 1:
        raise ValueError("fewer than two cells after pooling: the test has no power")
    return statistic, dof, float(stats.chi2.sf(statistic, dof))
