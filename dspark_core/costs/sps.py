"""SPS tables: target verification steps per second as a function of B, the tokens verified in one batch.

The scheduler (dspark_core/scheduler.py) trades expected accepted tokens against step speed, so it needs
SPS(B) for the hardware it runs on. On a GPU that curve is a staircase, not a smooth line: a step costs
the same for every B inside one tile / wave / CUDA-graph bucket and jumps when B crosses into the next.

Lookup rule (ceiling): SPS(B) is the value measured at the smallest measured batch size B_i >= B.
- It is what an engine really runs: with CUDA graphs a batch of B tokens is padded up to the next captured
  size, so measuring at the capture sizes makes the table exact.
- Between measured points it is conservative: latency never decreases with B, so the next larger point
  never over-states the speed. Nearest-below would be optimistic right after a jump and make the scheduler
  admit tokens that push the batch over a cliff it cannot see.
- Past the largest measured point B_max the step is assumed compute-bound: time grows in proportion to B,
  SPS(B) = SPS(B_max) * B_max / B. Per-token cost does not grow with the batch on real hardware, so this is
  again a lower bound on the true speed.

A table carries the fingerprint of what it was measured on (device name, dtype, target id, context
length): a table is only valid for that combination. JSON files hold any number of tables, one per
fingerprint; `table_files.load_sps_table` picks the one that matches exactly or says which fields differ.

The JSON files that hold them, keyed by fingerprint, are `dspark_core.costs.table_files`; the measuring
(`profile_sps`) is the in-house engine's (`backends/inhouse/profile.py`).
"""

from __future__ import annotations

import csv
import math
import numbers
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from torch import Tensor

from dspark_core.costs.fingerprint import SPSFingerprint, is_number, reject_unknown


@dataclass(frozen=True)
class SPSTable:
    """Measured (B, steps/s) points, B strictly increasing; looked up with the ceiling rule above."""

    batch_sizes: tuple[int, ...]  # [num_points] tokens verified per step, strictly increasing, >= 1
    steps_per_second: tuple[float, ...]  # [num_points] finite, > 0
    fingerprint: SPSFingerprint | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)  # how it was measured (free-form)

    def __post_init__(self) -> None:
        # numpy scalars are welcome; bools and non-integral sizes are not.
        sizes = tuple(int(b) if is_number(b, numbers.Integral) else b for b in self.batch_sizes)
        sps = tuple(float(s) if is_number(s, numbers.Real) else s for s in self.steps_per_second)
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "steps_per_second", sps)
        if self.fingerprint is not None:
            object.__setattr__(self, "fingerprint", SPSFingerprint.coerce(self.fingerprint))
        if not sizes:
            raise ValueError("an SPS table needs at least one (batch_size, steps_per_second) point")
        if len(sizes) != len(sps):
            raise ValueError(f"{len(sizes)} batch sizes but {len(sps)} steps_per_second values")
        bad = [b for b in sizes if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if bad:
            raise ValueError(f"batch sizes must be integers >= 1, got {bad}")
        unordered = [(a, b) for a, b in zip(sizes, sizes[1:]) if b <= a]
        if unordered:
            raise ValueError(f"batch sizes must be strictly increasing; out of order: {unordered}")
        bad_sps = [(b, s) for b, s in zip(sizes, self.steps_per_second)
                   if not isinstance(s, float) or not math.isfinite(s) or s <= 0]
        if bad_sps:
            raise ValueError(f"steps_per_second must be finite and > 0; bad (batch_size, value): {bad_sps}")

    @classmethod
    def from_points(
        cls,
        points: Iterable[tuple[int, float]],
        fingerprint: SPSFingerprint | Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> "SPSTable":
        """From (B, steps/s) pairs in any order (e.g. a published H100 curve); duplicate B is an error."""
        pts = sorted((b, s) for b, s in points)
        dups = sorted({a[0] for a, b in zip(pts, pts[1:]) if a[0] == b[0]})
        if dups:
            raise ValueError(f"duplicate batch sizes {dups}")
        return cls(tuple(b for b, _ in pts), tuple(s for _, s in pts), _coerce(fingerprint), dict(meta or {}))

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def __call__(self, batch_size: int) -> float:
        """SPS at one B (ceiling rule; proportional decay past the largest measured B)."""
        return float(self.lookup(torch.tensor([batch_size]))[0])

    def lookup(self, batch_sizes: Tensor) -> Tensor:
        """SPS at many B at once: batch_sizes [n] integer → [n] float64 on the same device."""
        if batch_sizes.numel() and int(batch_sizes.min()) < 1:
            raise ValueError("SPS is defined for batch sizes >= 1")
        device = batch_sizes.device
        sizes = self._sizes_t.to(device)  # [num_points]
        sps = self._sps_t.to(device)  # [num_points]
        idx = torch.searchsorted(sizes, batch_sizes.to(torch.long))  # first measured B_i >= B
        inside = sps[idx.clamp(max=len(sizes) - 1)]
        beyond = sps[-1] * self.max_batch_size / batch_sizes.to(torch.float64)
        return torch.where(idx < len(sizes), inside, beyond)

    def lookup_range(self, start: int, stop: int, device: torch.device | str = "cpu") -> Tensor:
        """SPS(B) for B = start … stop − 1: [stop − start] float64, sliced from a dense table kept per device
        (the scheduler asks for B = R … R + R·γ every step; a slice is cheaper than a search)."""
        if start < 1:
            raise ValueError("SPS is defined for batch sizes >= 1")
        key = str(device)
        dense = self._dense_by_device.get(key)
        if dense is None or dense.numel() < stop:
            size = max(stop, 2 * (dense.numel() if dense is not None else 0), self.max_batch_size + 1)
            dense = self._dense_by_device[key] = self.dense(size - 1, device)
        return dense[start:stop]

    def dense(self, max_batch_size: int, device: torch.device | str = "cpu") -> Tensor:
        """[max_batch_size + 1] float64 with SPS(B) at index B (index 0 is NaN): a lookup table for loops."""
        out = torch.full((max_batch_size + 1,), float("nan"), dtype=torch.float64, device=device)
        out[1:] = self.lookup(torch.arange(1, max_batch_size + 1, device=device))
        return out

    def monotone(self) -> "SPSTable":
        """The same points with SPS made non-increasing in B (running minimum): a larger batch is never
        faster, so a higher value at a larger B is measurement noise."""
        running = torch.tensor(self.steps_per_second, dtype=torch.float64).cummin(0).values.tolist()
        return SPSTable(self.batch_sizes, tuple(running), self.fingerprint, dict(self.meta))

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint.to_dict() if self.fingerprint is not None else None,
            "batch_sizes": list(self.batch_sizes),
            "steps_per_second": list(self.steps_per_second),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SPSTable":
        reject_unknown(data, ["fingerprint", "batch_sizes", "steps_per_second", "meta"], "SPS table")
        for key in ("batch_sizes", "steps_per_second"):
            if not isinstance(data.get(key), list):
                raise ValueError(f"SPS table {key} must be a list, got {data.get(key)!r}")
        fp = data.get("fingerprint")
        return cls(
            tuple(data["batch_sizes"]), tuple(data["steps_per_second"]),
            SPSFingerprint.from_dict(fp) if fp is not None else None, dict(data.get("meta") or {}),
        )

    @cached_property
    def _dense_by_device(self) -> dict[str, Tensor]:
        return {}

    @cached_property
    def _sizes_t(self) -> Tensor:
        return torch.tensor(self.batch_sizes, dtype=torch.long)

    @cached_property
    def _sps_t(self) -> Tensor:
        return torch.tensor(self.steps_per_second, dtype=torch.float64)


def step_sps_table(
    max_batch_size: int, tile: int, base_latency_s: float, tile_latency_s: float,
    fingerprint: SPSFingerprint | Mapping[str, Any] | None = None,
) -> SPSTable:
    """Synthetic staircase for tests: latency(B) = base + tile_latency · ceil(B / tile), measured at every
    step's right edge (tile, 2·tile, …), so the ceiling lookup reproduces it exactly for B <= max."""
    bad_latency = min(base_latency_s, tile_latency_s) < 0 or base_latency_s + tile_latency_s <= 0
    if tile < 1 or max_batch_size < 1 or bad_latency:
        raise ValueError("need tile, max_batch_size >= 1, latencies >= 0 and a positive step latency")
    edges = list(range(tile, max_batch_size + tile, tile))
    return SPSTable(
        tuple(edges), tuple(1.0 / (base_latency_s + tile_latency_s * (b // tile)) for b in edges), _coerce(fingerprint),
        {"synthetic": {"tile": tile, "base_latency_s": base_latency_s, "tile_latency_s": tile_latency_s}},
    )


def _coerce(fingerprint: SPSFingerprint | Mapping[str, Any] | None) -> SPSFingerprint | None:
    return SPSFingerprint.coerce(fingerprint) if fingerprint is not None else None


def read_sps_csv(path: str | Path, fingerprint: SPSFingerprint | Mapping[str, Any] | None = None) -> SPSTable:
    """A curve from a CSV file with a header row `batch_size,steps_per_second` (other columns ignored)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        need = {"batch_size", "steps_per_second"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise ValueError(f"{path}: need CSV columns {sorted(need)}, got {reader.fieldnames}")
        try:
            points = [(int(row["batch_size"]), float(row["steps_per_second"])) for row in reader]
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    return SPSTable.from_points(points, fingerprint, {"source": str(path)})
