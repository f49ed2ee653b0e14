"""Suites: flat, versioned YAML files that declare what to measure, expanded into `contracts.cells.Cell`s.

    from harness.suite import load_suite, expand, select, check_paths

    suite = load_suite("suites/cpu.yaml")           # validated; SuiteError (one line, file:line:col) if not
    cells = select(expand(suite), ["drafter=dspark", "gamma=3"])
    check_paths(suite, cells)                      # the model directories those cells load exist
    store(suite.resolved_text, suite.hash)         # the gate re-parses it: parse_suite_text(resolved_text)

Modules: `document` (safe YAML with line/column marks, include merging), `schema` (the sections and their
fields), `references` (names that must be defined), `limits` (ceilings on sizes), `backend_options` (each
backend's options), `metric_names` (what a gate may name), `load` (Suite), `expand` (cells, --only),
`paths` (check_paths, over inputs.model_refs), `errors` (SuiteError).
"""

from harness.suite.document import SUITE_VERSION
from harness.suite.errors import Mark, SuiteError
from harness.suite.expand import SELECT_AXES, expand, select
from harness.suite.load import Suite, load_suite, parse_suite_text
from harness.suite.paths import check_paths

__all__ = [
    "Mark", "SELECT_AXES", "SUITE_VERSION", "Suite", "SuiteError", "check_paths", "expand", "load_suite",
    "parse_suite_text", "select",
]
