"""Step costs: what one engine step costs when it may also run the draft forward (companion of SPS tables).

The in-house engine's step drafts g tokens for each of R requests (g = 0: no draft forward at all), then
verifies a right-padded [R, W] block, W = 1 + the longest verify length. Its time is modelled as

    draft_seconds(R, g) + verify_seconds(R, W)

where the verify part is everything but the draft forward: target forward, verification, the drafter
observing the new tokens, bookkeeping (W = 1 is a plain decoding step). `CostAwareScheduler`
(dspark_core/scheduler.py) compares drafting against plain decoding with it. An SPS(B) table cannot:
it prices B verified tokens, not R padded rows, and knows nothing of the draft forward.

The in-house engine measures a table by timing real `speculative_step`s (`backends/inhouse/profile.py`).
Tables are stored in the SPS JSON files (`dspark_core.costs.table_files`), keyed by the same fingerprint.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import torch

from dspark_core.costs.fingerprint import SPSFingerprint, is_number, reject_unknown


@dataclass(frozen=True)
class StepCostTable:
    """Measured seconds per engine step: draft_seconds(R, g) + verify_seconds(R, W).

    - `verify_s[i][k]`: a step over `rows[i]` requests whose verify block is `widths[k]` wide (1 + the longest
      verify length), *without* the draft forward: target forward, verification, the drafter observing the
      new tokens, bookkeeping. Width 1 is a plain decoding step.
    - `draft_s[i][k]`: the draft forward proposing `draft_lengths[k]` tokens for each of `rows[i]` requests.
    Lookup: linear in R between measured row counts, proportional to R past the largest (per-request cost does
    not fall with more requests), R below the smallest reads the smallest; W and g take the smallest measured
    value >= them (ceiling, as SPS), proportional past the largest. g = 0 costs nothing.
    """

    rows: tuple[int, ...]  # [num_rows] requests per step, strictly increasing, >= 1
    widths: tuple[int, ...]  # [num_widths] verify block widths, strictly increasing, >= 1
    verify_s: tuple[tuple[float, ...], ...]  # [num_rows][num_widths] seconds
    draft_lengths: tuple[int, ...]  # [num_lengths] tokens drafted per request, strictly increasing, >= 1
    draft_s: tuple[tuple[float, ...], ...]  # [num_rows][num_lengths] seconds
    fingerprint: SPSFingerprint | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("rows", "widths", "draft_lengths"):
            values = tuple(getattr(self, name))
            object.__setattr__(self, name, values)
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if not values or bad or any(b <= a for a, b in zip(values, values[1:])):
                raise ValueError(f"step costs: {name} must be strictly increasing integers >= 1, got {list(values)}")
        for name, cols in (("verify_s", self.widths), ("draft_s", self.draft_lengths)):
            grid = tuple(
                tuple(float(x) if is_number(x, numbers.Real) else x for x in row) for row in getattr(self, name)
            )
            object.__setattr__(self, name, grid)
            if len(grid) != len(self.rows) or any(len(row) != len(cols) for row in grid):
                raise ValueError(f"step costs: {name} must be [{len(self.rows)} rows][{len(cols)}] seconds")
            if any(not isinstance(x, float) or not math.isfinite(x) or x <= 0 for row in grid for x in row):
                raise ValueError(f"step costs: {name} must hold finite seconds > 0")
        if self.fingerprint is not None:
            object.__setattr__(self, "fingerprint", SPSFingerprint.coerce(self.fingerprint))

    def monotone(self) -> "StepCostTable":
        """The same table made non-decreasing in R and in W (g): a bigger step is never cheaper, so a cost above
        that of some bigger step was disturbed (on a shared machine other work only ever adds time) and is
        lowered to it (running minimum from the largest size down, over W or g, then over R)."""

        def fix(grid):
            t = torch.tensor(grid, dtype=torch.float64).flip(0, 1)
            t = t.cummin(1).values.cummin(0).values.flip(0, 1)
            return tuple(tuple(row) for row in t.tolist())

        return StepCostTable(self.rows, self.widths, fix(self.verify_s), self.draft_lengths, fix(self.draft_s),
                             self.fingerprint, dict(self.meta))

    def verify_seconds(self, num_rows: int, width: int) -> float:
        return self._lookup(self.verify_s, self.widths, num_rows, width)

    def draft_seconds(self, num_rows: int, num_drafts: int) -> float:
        return 0.0 if num_drafts <= 0 else self._lookup(self.draft_s, self.draft_lengths, num_rows, num_drafts)

    def curves(self, num_rows: int, num_drafts: int) -> tuple[list[float], list[float]]:
        """At `num_rows` requests: (verify seconds for W = 0 … γ + 1 with index 0 unused, draft seconds for
        g = 0 … γ), cached: the scheduler asks every step."""
        key = (num_rows, num_drafts)
        hit = self._curves.get(key)
        if hit is None:
            verify = [math.inf] + [self.verify_seconds(num_rows, w) for w in range(1, num_drafts + 2)]
            draft = [self.draft_seconds(num_rows, g) for g in range(num_drafts + 1)]
            hit = self._curves[key] = (verify, draft)
        return hit

    def _lookup(self, grid, cols: tuple[int, ...], num_rows: int, col: int) -> float:
        if num_rows < 1 or col < 1:
            raise ValueError(f"step costs are defined for R >= 1 and W, g >= 1, got R={num_rows}, {col}")
        k = next((i for i, c in enumerate(cols) if c >= col), None)
        scale = 1.0 if k is not None else col / cols[-1]
        column = [row[k if k is not None else -1] for row in grid]
        rows = self.rows
        if num_rows >= rows[-1]:
            return column[-1] * num_rows / rows[-1] * scale
        i = next(i for i, r in enumerate(rows) if r >= num_rows)
        if rows[i] == num_rows or i == 0:
            return column[i] * scale
        t = (num_rows - rows[i - 1]) / (rows[i] - rows[i - 1])
        return (column[i - 1] + t * (column[i] - column[i - 1])) * scale

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint is not None else None,
            "rows": list(self.rows), "widths": list(self.widths), "verify_s": [list(r) for r in self.verify_s],
            "draft_lengths": list(self.draft_lengths), "draft_s": [list(r) for r in self.draft_s],
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StepCostTable":
        keys = ["fingerprint", "rows", "widths", "verify_s", "draft_lengths", "draft_s", "meta"]
        reject_unknown(data, keys, "step-cost table")
        for key in keys[1:6]:
            if not isinstance(data.get(key), list):
                raise ValueError(f"step-cost table {key} must be a list, got {data.get(key)!r}")
        fp = data.get("fingerprint")
        return cls(
            tuple(data["rows"]), tuple(data["widths"]), tuple(tuple(r) for r in data["verify_s"]),
            tuple(data["draft_lengths"]), tuple(tuple(r) for r in data["draft_s"]),
            SPSFingerprint.from_dict(fp) if fp is not None else None, dict(data.get("meta") or {}),
        )

    @cached_property
    def _curves(self) -> dict[tuple[int, int], tuple[list[float], list[float]]]:
        return {}
