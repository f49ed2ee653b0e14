"""Which candidate cell may be judged against which baseline cell, and why not when it may not.

A candidate cell is paired with the baseline cell of the same `cell_id` (a hash of the measurement's
parameters, `harness.cells.Cell.cell_id`), and the two are comparable iff their `comparability_key`s are
equal: the key folds in what the numbers depend on beyond the parameters — the host, the versions of the
packages that do the work, and the content of target, draft and dataset. When keys differ, a bare "not
comparable" would leave the reader guessing, so the parts that feed the key are diffed and named: the
host fingerprint (and the host fields that differ), the versions of torch, transformers, vllm, sglang and
triton, the provenance hashes and backend version, and the cell parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from harness.gate.data import CellInfo, RunInfo

PACKAGES = ("torch", "transformers", "vllm", "sglang", "triton")
PROVENANCE = ("target_hash", "draft_hash", "dataset_hash", "backend_version")


@dataclass(frozen=True)
class CellMatch:
    cell_id: str
    label: str
    comparable: bool
    reasons: tuple[str, ...] = ()  # why not, one readable part each


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


def explain_difference(cand_run: RunInfo, cand: CellInfo, base_run: RunInfo, base: CellInfo) -> list[str]:
    """The parts behind two different comparability keys, baseline → candidate, one string each."""
    reasons: list[str] = []
    if cand_run.host_fingerprint != base_run.host_fingerprint:
        reasons.append(f"host fingerprint: {_short(base_run.host_fingerprint)} → {_short(cand_run.host_fingerprint)}")
        reasons += _diff("host", _flatten(base_run.host), _flatten(cand_run.host))
    reasons += _diff("package", base_run.packages, cand_run.packages, PACKAGES)
    reasons += _diff("provenance", base.provenance, cand.provenance, PROVENANCE)
    reasons += _diff("param", _flatten(base.params), _flatten(cand.params))
    if not reasons:
        reasons.append(
            f"comparability key: {_short(base.comparability_key)} → {_short(cand.comparability_key)} "
            "(host, packages, provenance and params agree)"
        )
    return reasons


def match_cells(
    cand_run: RunInfo, cand_cells: Mapping[str, CellInfo], base_run: RunInfo, base_cells: Mapping[str, CellInfo]
) -> list[CellMatch]:
    """One match per candidate cell with at least one ok repeat (failed cells are reported elsewhere)."""
    out: list[CellMatch] = []
    for cell_id, cand in cand_cells.items():
        if not cand.ok_repeats:
            continue
        base = base_cells.get(cell_id)
        if base is None:
            out.append(CellMatch(cell_id, cand.label, False, ("no baseline cell with this id",)))
        elif not base.ok_repeats:
            out.append(CellMatch(cell_id, cand.label, False, ("the baseline cell failed",)))
        elif cand.comparability_key is None or cand.comparability_key != base.comparability_key:
            out.append(CellMatch(cell_id, cand.label, False, tuple(explain_difference(cand_run, cand, base_run, base))))
        else:
            out.append(CellMatch(cell_id, cand.label, True))
    return out
