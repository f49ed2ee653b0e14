"""The regression gate: is a candidate run worse than a baseline run, significantly and by more than allowed?

    rules.py          GateRule, Validity: what a suite's `gates:` and `validity:` say (the contract)
    data.py           the only SQL: runs, cells, windowed per-prompt step sums, confidences, per-repeat values
    pairing.py        prompts both runs measured, grouped into conversations (the bootstrap's unit)
    stats.py          paired bootstrap (ratio metrics, ECE), Mann-Whitney + Hodges-Lehmann, MDE
    comparability.py  candidate ↔ baseline cell by cell id; why two comparability keys differ
    validity.py       whether a run may be judged at all
    verdict.py        regression / improvement / pass / inconclusive from a rule and an estimate
    evaluate.py       run_gate(candidate, baseline, rules, validity) → GateReport
    report.py         GateReport, Comparison, ExitCode
    format.py         text, markdown and JUnit XML renderings
    compare.py        compare_runs: two runs side by side, with the gate's intervals, no gate verdicts
"""

from __future__ import annotations

import importlib

# Re-exported lazily, so that `harness.gate.rules` (read by the suite loader) imports neither duckdb nor numpy.
_EXPORTS = {
    "harness.gate.compare": ("CompareRow", "compare_runs", "compare_table"),
    "harness.gate.comparability": ("CellMatch", "match_cells"),
    "harness.gate.evaluate": ("run_gate",),
    "harness.gate.format": ("render", "to_junit", "to_markdown", "to_text"),
    "harness.gate.report": ("Comparison", "ExitCode", "FailedCell", "GateReport"),
    "harness.gate.rules": ("GateRule", "Validity"),
    "harness.gate.stats": ("Estimate", "mann_whitney", "paired_bootstrap", "ratio_bootstrap", "repeats_test"),
    "harness.gate.validity": ("ValidityReport", "check_validity"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'harness.gate' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
