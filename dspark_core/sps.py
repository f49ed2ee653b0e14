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
fingerprint; `load_sps_table` picks the one that matches exactly or says which fields differ.

The same JSON files also hold step-cost tables (`dspark_core.step_costs.StepCostTable`, the companion for
engines whose step runs the draft forward too) under "step_costs": format version 2; version-1 files, which
have none, still load, and a file without step costs is still written as version 1.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import numbers
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:
    from dspark_core.step_costs import StepCostTable

SPS_FORMAT = "dspark-sps-tables"
SPS_FORMAT_VERSION = 2  # 2 added the optional "step_costs" list; version 1 files read unchanged
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class SPSFingerprint:
    """What an SPS table is valid for; two tables with equal fingerprints describe the same setting."""

    device_name: str  # e.g. "NVIDIA H100 80GB HBM3", or the CPU's name
    dtype: str  # target weights/activations, e.g. "bfloat16"
    target_id: str  # model id or path, e.g. "Qwen/Qwen3-8B"
    context_len: int  # committed tokens per request the steps were measured at

    def __post_init__(self) -> None:
        for name in ("device_name", "dtype", "target_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"fingerprint {name} must be a non-empty string, got {value!r}")
        if isinstance(self.context_len, bool) or not isinstance(self.context_len, int) or self.context_len < 0:
            raise ValueError(f"fingerprint context_len must be an integer >= 0, got {self.context_len!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SPSFingerprint":
        _reject_unknown(data, [f.name for f in fields(cls)], "fingerprint")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ValueError(f"fingerprint is missing {missing}")
        return cls(**dict(data))

    @classmethod
    def coerce(cls, value: "SPSFingerprint | Mapping[str, Any]") -> "SPSFingerprint":
        return value if isinstance(value, SPSFingerprint) else cls.from_dict(value)


@dataclass(frozen=True)
class SPSTable:
    """Measured (B, steps/s) points, B strictly increasing; looked up with the ceiling rule above."""

    batch_sizes: tuple[int, ...]  # [num_points] tokens verified per step, strictly increasing, >= 1
    steps_per_second: tuple[float, ...]  # [num_points] finite, > 0
    fingerprint: SPSFingerprint | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)  # how it was measured (free-form)

    def __post_init__(self) -> None:
        # numpy scalars are welcome; bools and non-integral sizes are not.
        sizes = tuple(int(b) if _is_number(b, numbers.Integral) else b for b in self.batch_sizes)
        sps = tuple(float(s) if _is_number(s, numbers.Real) else s for s in self.steps_per_second)
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
        return cls(tuple(b for b, _ in pts), tuple(s for _, s in pts), fingerprint, dict(meta or {}))

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
        _reject_unknown(data, ["fingerprint", "batch_sizes", "steps_per_second", "meta"], "SPS table")
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
        tuple(edges), tuple(1.0 / (base_latency_s + tile_latency_s * (b // tile)) for b in edges), fingerprint,
        {"synthetic": {"tile": tile, "base_latency_s": base_latency_s, "tile_latency_s": tile_latency_s}},
    )


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


# --------------------------------------------------------------------------- JSON store, keyed by fingerprint


def load_sps_tables(path: str | Path) -> list[SPSTable]:
    """Every table in an SPS file (validated)."""
    return _read_store(path)[0]


def load_step_cost_tables(path: str | Path) -> list["StepCostTable"]:
    """Every step-cost table in an SPS file (none in a version-1 file)."""
    return _read_store(path)[1]


def _read_store(path: str | Path) -> tuple[list[SPSTable], list["StepCostTable"]]:
    from dspark_core.step_costs import StepCostTable  # its own module; it imports this one

    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != SPS_FORMAT:
        raise ValueError(f"{path}: not an SPS file (expected \"format\": \"{SPS_FORMAT}\")")
    _reject_unknown(data, ["format", "version", "tables", "step_costs"], f"{path}")
    if data.get("version") not in READABLE_VERSIONS:
        raise ValueError(
            f"{path}: SPS format version {data.get('version')!r}; this code reads {list(READABLE_VERSIONS)}"
        )
    if data["version"] == 1 and "step_costs" in data:
        raise ValueError(f"{path}: \"step_costs\" needs format version 2")
    if not isinstance(data.get("tables"), list) or not isinstance(data.get("step_costs", []), list):
        raise ValueError(f"{path}: \"tables\" (and \"step_costs\") must be lists")
    stores = []
    for key, kind in (("tables", SPSTable), ("step_costs", StepCostTable)):
        entries = []
        for i, entry in enumerate(data.get(key, [])):
            try:
                entries.append(kind.from_dict(entry))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}: {'table' if key == 'tables' else 'step_costs'} {i}: {e}") from None
        fps = [t.fingerprint for t in entries]
        if None in fps:
            raise ValueError(f"{path}: every stored table needs a fingerprint")
        if len(set(fps)) != len(fps):
            raise ValueError(f"{path}: two {'tables' if key == 'tables' else 'step_costs'} share one fingerprint")
        stores.append(entries)
    return stores[0], stores[1]


def load_sps_table(path: str | Path, fingerprint: SPSFingerprint | Mapping[str, Any]) -> SPSTable:
    """The table measured for exactly this fingerprint; the error names the closest one and what differs."""
    return _pick(path, load_sps_tables(path), fingerprint, "SPS table", "profile_sps")


def load_step_cost_table(path: str | Path, fingerprint: SPSFingerprint | Mapping[str, Any]) -> "StepCostTable":
    """The step-cost table measured for exactly this fingerprint (errors as `load_sps_table`)."""
    return _pick(path, load_step_cost_tables(path), fingerprint, "step-cost table", "profile_step_costs")


def _pick(path, tables: list, fingerprint, what: str, how: str):
    wanted = SPSFingerprint.coerce(fingerprint)
    for table in tables:
        if table.fingerprint == wanted:
            return table
    if not tables:
        raise LookupError(f"{path}: holds no {what}s")
    want = wanted.to_dict()

    def diff(t) -> dict[str, Any]:
        have = t.fingerprint.to_dict()
        return {k: have[k] for k in want if have[k] != want[k]}

    closest = min(tables, key=lambda t: len(diff(t)))
    raise LookupError(
        f"{path}: no {what} for {want}; closest differs in {diff(closest)} "
        f"({len(tables)} stored; measure this setting with {how})"
    )


def save_sps_table(path: str | Path, table: "SPSTable | StepCostTable") -> None:
    """Add `table` (an SPS or a step-cost table) to the file (created if absent), replacing a stored table of
    the same kind with the same fingerprint; the other kind is kept as it is."""
    from dspark_core.step_costs import StepCostTable

    if table.fingerprint is None:
        raise ValueError("only a table with a fingerprint can be stored")
    path = Path(path)
    tables, step_costs = _read_store(path) if path.exists() else ([], [])
    if isinstance(table, StepCostTable):
        step_costs = [t for t in step_costs if t.fingerprint != table.fingerprint] + [table]
    else:
        tables = [t for t in tables if t.fingerprint != table.fingerprint] + [table]
    doc: dict[str, Any] = {"format": SPS_FORMAT, "version": SPS_FORMAT_VERSION, "tables": [t.to_dict() for t in tables]}
    if step_costs:
        doc["step_costs"] = [t.to_dict() for t in step_costs]
    else:
        doc["version"] = 1  # nothing a version-1 reader cannot read
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)  # a reader never sees half a file


# --------------------------------------------------------------------------- measuring


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}:{platform.processor() or platform.machine() or 'unknown'}"


def fingerprint_for(target: Any, context_len: int, target_id: str | None = None) -> SPSFingerprint:
    """The fingerprint of `target` (a `TargetModel`) on its current device and dtype."""
    if target_id is None:
        target_id = getattr(target.config, "_name_or_path", "") or getattr(target.config, "model_type", "unknown")
    return SPSFingerprint(device_name(target.device), str(target.dtype).removeprefix("torch."), target_id, context_len)


@torch.no_grad()
def profile_sps(
    target: Any,
    batch_sizes: Sequence[int],
    context_len: int,
    *,
    tokens_per_request: int = 8,
    warmup: int = 2,
    repeats: int = 5,
    target_id: str | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> SPSTable:
    """Measure SPS(B) on the target's device with real `TargetModel.forward` calls over KV slots.

    Each B is laid out as a verify step would be: ceil(B / tokens_per_request) requests (γ + 1 = 8 tokens
    each by default, the last one takes the remainder), every request already holding `context_len`
    cached positions. The context keys/values are random rather than prefilled: attention costs the same
    whatever the values, and it spares a prefill of every slot. Each timed call appends B positions and is
    rolled back afterwards, so every repeat sees the same context. `warmup` untimed calls, then the median
    of `repeats` timed ones (CUDA synchronised around each); SPS = 1 / median latency.
    """
    sizes = sorted(int(b) for b in batch_sizes)
    if not sizes or sizes[0] < 1 or len(set(sizes)) != len(sizes):
        raise ValueError(f"batch_sizes must be distinct integers >= 1, got {list(batch_sizes)}")
    if tokens_per_request < 1 or repeats < 1 or warmup < 0 or context_len < 0:
        raise ValueError("need tokens_per_request >= 1, repeats >= 1, warmup >= 0, context_len >= 0")
    device = target.device
    max_rows = -(-sizes[-1] // tokens_per_request)
    cache = target.new_cache(max_rows, context_len + tokens_per_request)
    fill = torch.Generator(device=device).manual_seed(seed)  # on the device: no host copy of the cache
    for keys, values in zip(cache.keys, cache.values):
        keys.normal_(generator=fill)
        values.normal_(generator=fill)
    cache.lengths.fill_(context_len)
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    points = []
    latencies: dict[int, list[float]] = {}
    for b in sizes:
        num_rows = -(-b // tokens_per_request)
        width = min(b, tokens_per_request)
        num_new = torch.full((num_rows,), width, dtype=torch.long)
        num_new[-1] = b - width * (num_rows - 1)  # [num_rows], sums to b
        rows = torch.arange(num_rows, device=device)
        num_new = num_new.to(device)
        token_ids = torch.randint(0, target.vocab_size, (num_rows, width), generator=gen).to(device)
        times = []
        for i in range(warmup + repeats):
            sync()
            start = clock()
            target.forward(cache, rows, token_ids, num_new)
            sync()
            elapsed = clock() - start
            cache.rollback(rows, torch.full_like(num_new, context_len))
            if i >= warmup:
                times.append(elapsed)
        median = statistics.median(times)
        if median <= 0:
            raise RuntimeError(f"B={b}: the clock measured {median} s; use a finer clock")
        latencies[b] = times
        points.append((b, 1.0 / median))
    meta = {
        "method": "profile_sps", "tokens_per_request": tokens_per_request, "warmup": warmup, "repeats": repeats,
        "latencies_s": {str(b): t for b, t in latencies.items()}, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "torch": torch.__version__,
    }
    return SPSTable.from_points(points, fingerprint_for(target, context_len, target_id), meta)


# --------------------------------------------------------------------------- helpers


def _is_number(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _reject_unknown(data: Mapping[str, Any], valid: Sequence[str], where: str) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be an object, got {type(data).__name__}")
    for key in data:
        if key not in valid:
            near = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid: {', '.join(valid)}"
            raise ValueError(f"{where}: unknown key {key!r}{hint}")
