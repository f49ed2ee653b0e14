"""Which candidate cell may be judged against which baseline cell, on which metrics, and why not.

A candidate cell is paired with the baseline cell of the same `cell_id` (a hash of the measurement's
parameters, `contracts.cells.Cell.cell_id`). What it may be judged on depends on the metric: each metric
declares its scope beside its definition (`harness.metrics.dependencies`):

- CONTENT metrics (acceptance, per-position acceptance, ECE/Brier) compare where the content parts agree
  (`provenance.content_parts`: params, target/draft/dataset hashes, backend version, device kind, the
  versions of torch, transformers, vllm, sglang and triton) — on any CPU model;
- HARDWARE metrics (throughput, latency, speedup) compare only where, in addition, the host fingerprint
  and the stored `comparability_key` (which folds the host in) agree.

When a scope does not match, a bare "not comparable" would leave the reader guessing, so its parts are
diffed and named: the host fingerprint and the host fields that differ ("hardware differs"), the
packages, the provenance and the cell parameters ("content differs").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.gate.data import CellInfo, RunInfo
from harness.metrics.dependencies import Scope
from harness.provenance import CONTENT_PROVENANCE_KEYS, ENGINE_PACKAGES, FINGERPRINT_KEYS, content_parts


@dataclass(frozen=True)
class CellMatch:
    cell_id: str
    label: str
    comparable: bool  # on CONTENT: some metric of the cell can be judged
    reasons: tuple[str, ...] = ()  # why not on CONTENT, one readable part each
    hardware_reasons: tuple[str, ...] = ()  # why not on HARDWARE besides; empty: the same hardware

    def comparable_on(self, scope: Scope) -> bool:
        return self.comparable and not (scope.host and self.hardware_reasons)

    def why_not(self, scope: Scope) -> str:
        """'hardware differs: host fingerprint …' for a scope this cell does not compare on."""
        if not self.comparable:
            return "; ".join(self.reasons)
        return f"{scope.why}: " + "; ".join(self.hardware_reasons)


def _short(value: Any, width: int = 24) -> str:
    text = "∅" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys, so a params diff names `task.max_new_tokens`, not `task`."""
    if not isinstance(value, Mapping):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _diff(kind: str, base: Mapping[str, Any], cand: Mapping[str, Any], keys=None) -> list[str]:
    keys = sorted(set(base) | set(cand)) if keys is None else keys
    return [f"{kind} {k}: {_short(base.get(k))} → {_short(cand.get(k))}" for k in keys if base.get(k) != cand.get(k)]


def content_difference(cand_run: RunInfo, cand: CellInfo, base_run: RunInfo, base: CellInfo) -> list[str]:
    """The content parts (packages, provenance, params) that differ, baseline → candidate; empty: none."""
    b = content_parts(base.params, base.provenance, base_run.packages)
    c = content_parts(cand.params, cand.provenance, cand_run.packages)
    reasons = _diff("package", b["packages"], c["packages"], ENGINE_PACKAGES)
    reasons += _diff("provenance", b["provenance"], c["provenance"], CONTENT_PROVENANCE_KEYS)
    reasons += _diff("param", _flatten(b["params"]), _flatten(c["params"]))
    return reasons


def hardware_difference(cand_run: RunInfo, cand: CellInfo, base_run: RunInfo, base: CellInfo) -> list[str]:
    """What differs beyond the content: the host fingerprint and its fields, or (all parts agreeing) the
    stored comparability keys themselves; empty: the same hardware."""
    reasons: list[str] = []
    if cand_run.host_fingerprint != base_run.host_fingerprint:
        reasons.append(f"host fingerprint: {_short(base_run.host_fingerprint)} → {_short(cand_run.host_fingerprint)}")
        reasons += _diff("host", base_run.host, cand_run.host, FINGERPRINT_KEYS)  # the fields it hashes
    elif cand.comparability_key is None or cand.comparability_key != base.comparability_key:
        reasons.append(
            f"comparability key: {_short(base.comparability_key)} → {_short(cand.comparability_key)} "
            "(host, packages, provenance and params agree)"
        )
    return reasons


def explain_difference(cand_run: RunInfo, cand: CellInfo, base_run: RunInfo, base: CellInfo) -> list[str]:
    """Every part that differs, baseline → candidate, one string each: hardware first, then content."""
    return hardware_difference(cand_run, cand, base_run, base) + content_difference(cand_run, cand, base_run, base)


def match_cells(
    cand_run: RunInfo, cand_cells: Mapping[str, CellInfo], base_run: RunInfo, base_cells: Mapping[str, CellInfo]
) -> list[CellMatch]:
    """One match per candidate cell with at least one ok repeat (failed cells are reported elsewhere):
    comparable on CONTENT when the content parts agree, and on HARDWARE when the host does too."""
    out: list[CellMatch] = []
    for cell_id, cand in cand_cells.items():
        if not cand.ok_repeats:
            continue
        base = base_cells.get(cell_id)
        if base is None:
            out.append(CellMatch(cell_id, cand.label, False, ("no baseline cell with this id",)))
        elif not base.ok_repeats:
            out.append(CellMatch(cell_id, cand.label, False, ("the baseline cell failed",)))
        else:
            content = content_difference(cand_run, cand, base_run, base)
            hardware = tuple(hardware_difference(cand_run, cand, base_run, base))
            if content:
                out.append(CellMatch(cell_id, cand.label, False, (*hardware, *content), hardware))
            else:
                out.append(CellMatch(cell_id, cand.label, True, (), hardware))
    return out
