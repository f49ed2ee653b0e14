"""The JSON files that hold SPS and step-cost tables, any number of each, keyed by fingerprint.

Format "dspark-sps-tables": version 1 holds SPS tables ("tables"); version 2 adds step-cost tables
("step_costs"). Version-1 files still load, and a file without step costs is still written as version 1, so
an older reader keeps reading what it can.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, cast

from dspark_core.costs.fingerprint import SPSFingerprint, reject_unknown
from dspark_core.costs.sps import SPSTable
from dspark_core.costs.step_costs import StepCostTable

SPS_FORMAT = "dspark-sps-tables"
SPS_FORMAT_VERSION = 2  # 2 added the optional "step_costs" list; version 1 files read unchanged
READABLE_VERSIONS = (1, 2)


def load_sps_tables(path: str | Path) -> list[SPSTable]:
    """Every table in an SPS file (validated)."""
    return _read_store(path)[0]


def load_step_cost_tables(path: str | Path) -> list[StepCostTable]:
    """Every step-cost table in an SPS file (none in a version-1 file)."""
    return _read_store(path)[1]


def _read_store(path: str | Path) -> tuple[list[SPSTable], list[StepCostTable]]:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != SPS_FORMAT:
        raise ValueError(f"{path}: not an SPS file (expected \"format\": \"{SPS_FORMAT}\")")
    reject_unknown(data, ["format", "version", "tables", "step_costs"], f"{path}")
    if data.get("version") not in READABLE_VERSIONS:
        raise ValueError(
            f"{path}: SPS format version {data.get('version')!r}; this code reads {list(READABLE_VERSIONS)}"
        )
    if data["version"] == 1 and "step_costs" in data:
        raise ValueError(f"{path}: \"step_costs\" needs format version 2")
    if not isinstance(data.get("tables"), list) or not isinstance(data.get("step_costs", []), list):
        raise ValueError(f"{path}: \"tables\" (and \"step_costs\") must be lists")
    stores: list[list[Any]] = []
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
    return cast(list[SPSTable], stores[0]), cast(list[StepCostTable], stores[1])


def load_sps_table(path: str | Path, fingerprint: SPSFingerprint | Mapping[str, Any]) -> SPSTable:
    """The table measured for exactly this fingerprint; the error names the closest one and what differs."""
    return _pick(path, load_sps_tables(path), fingerprint, "SPS table", "profile_sps")


def load_step_cost_table(path: str | Path, fingerprint: SPSFingerprint | Mapping[str, Any]) -> StepCostTable:
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


def save_sps_table(path: str | Path, table: SPSTable | StepCostTable) -> None:
    """Add `table` (an SPS or a step-cost table) to the file (created if absent), replacing a stored table of
    the same kind with the same fingerprint; the other kind is kept as it is."""
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
