"""What the paired bootstrap resamples: prompts both runs measured, grouped into conversations.

Pairing is by `prompt_key` ("<task>:<sample index>:<turn>"), stable across runs: only prompts that both
the baseline and the candidate cell measured in their windows are compared, so a prompt that fell
outside one window cannot move the result by its difficulty alone. The resampled unit is the
conversation (its sample index): turns of one conversation share a context, so their acceptance is
correlated, and resampling them independently would understate the variance. Single-turn tasks have one
prompt per unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Pairing:
    prompt_keys: tuple[str, ...]  # [pairs] prompts common to both runs, sorted
    base_index: np.ndarray  # [pairs] int64: row of each pair among the baseline's prompts
    cand_index: np.ndarray  # [pairs] int64: row among the candidate's prompts
    unit: np.ndarray  # [pairs] int64: the unit (conversation) each pair belongs to, 0 … num_units − 1
    num_units: int
    num_unpaired: int  # prompts measured by only one of the two runs

    def per_unit(self, values: np.ndarray, side: str) -> np.ndarray:
        """Per-prompt values of one side ("base" | "cand") summed per unit: [num_units]."""
        index = self.base_index if side == "base" else self.cand_index
        return np.bincount(self.unit, weights=np.asarray(values, dtype=np.float64)[index], minlength=self.num_units)


def pair_prompts(
    base_keys: Sequence[str], cand_keys: Sequence[str], cand_units: Sequence[str]
) -> Pairing:
    """Pairs of the prompts both sides have; units named by the candidate (`cand_units[i]` of `cand_keys[i]`)."""
    base_pos = {k: i for i, k in enumerate(base_keys)}
    cand_pos = {k: i for i, k in enumerate(cand_keys)}
    common = sorted(base_pos.keys() & cand_pos.keys())
    unit_ids: dict[str, int] = {}
    units = [unit_ids.setdefault(cand_units[cand_pos[k]], len(unit_ids)) for k in common]
    return Pairing(
        prompt_keys=tuple(common),
        base_index=np.array([base_pos[k] for k in common], dtype=np.int64),
        cand_index=np.array([cand_pos[k] for k in common], dtype=np.int64),
        unit=np.array(units, dtype=np.int64),
        num_units=len(unit_ids),
        num_unpaired=len(base_pos) + len(cand_pos) - 2 * len(common),
    )
