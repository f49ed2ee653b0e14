"""N-gram prompt lookup: propose the tokens that followed the latest earlier occurrence of the suffix.

No model and no training: the baseline every engine ships (vLLM `ngram`). Drafts are deterministic,
so their draft distribution is one-hot (`draft_probs=None`) and verification stays exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dspark_core.drafters.base import DraftProposal, DraftStep, StatelessDrafter


class NgramDrafter(StatelessDrafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, state: None, step: DraftStep) -> DraftProposal:
        n = step.num_drafts
        tokens = torch.zeros(len(step.rows), n, dtype=torch.long)
        num_valid = torch.zeros(len(step.rows), dtype=torch.long)
        history = step.token_ids.cpu()
        for j, (row, length) in enumerate(zip(step.rows.tolist(), step.num_tokens[step.rows].tolist())):
            found = self.lookup(history[row, :length].tolist(), n)
            tokens[j, : len(found)] = torch.tensor(found, dtype=torch.long)
            num_valid[j] = len(found)
        device = step.token_ids.device
        return DraftProposal(tokens.to(device), None, None, num_valid.to(device))

    def lookup(self, seq: list[int], num_drafts: int) -> list[int]:
        """Longest suffix first (max_n … min_n); the latest earlier match wins."""
        for size in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            suffix = seq[-size:]
            for start in range(len(seq) - size - 1, -1, -1):
                if seq[start : start + size] == suffix:
                    return seq[start + size : start + size + num_drafts]
        return []
