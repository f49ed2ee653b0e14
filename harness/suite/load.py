"""`load_suite` / `parse_suite_text`: a suite file (or the text a run stored) as a validated, frozen `Suite`.

A run stores `Suite.resolved_text`, the canonical YAML of the merged document (includes resolved, keys
sorted, no `include:`), and the gate re-parses that text: it needs no other file, and parsing it gives
the same hash, the same gates and the same cells as the original load. Loading also expands the suite
once, so a combination that cannot run is reported now, at its line, rather than mid-run.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from harness.gate.rules import GateRule, Validity
from harness.metrics import SLA
from harness.suite.document import Locations, canonical_text, read_document, read_suite_file
from harness.suite.errors import SuiteError, clip, did_you_mean, show
from harness.suite.backend_options import check_backend_options
from harness.suite.expand import expand
from harness.suite.limits import check_limits
from harness.suite import metric_names
from harness.suite.references import check_references
from harness.suite.schema import (Defaults, DrafterEntry, Matrix, PolicyEntry, ResourcesEntry, SuiteDoc, TargetEntry,
                                  TaskEntry, validate)

PathLike = str | os.PathLike[str]


@dataclass(frozen=True, eq=False)
class Suite:
    """A validated suite. Two suites are the same suite when their `hash`es are equal."""

    name: str
    version: int
    description: str
    path: str  # the file it was read from, or "<text>"
    text: str  # that file's text as written (without what it includes)
    resolved_text: str  # canonical YAML of the merged document: what a run stores, what the gate re-parses
    hash: str  # sha256 of resolved_text
    defaults: Defaults  # incl. seed, warmup, repeats
    matrix: Matrix
    gates: tuple[GateRule, ...]  # sorted by metric
    validity: Validity
    sla: SLA | None
    targets: dict[str, TargetEntry]
    drafters: dict[str, DrafterEntry]  # as defined; the built-in `none` is added by schema.drafters_of
    tasks: dict[str, TaskEntry]
    policies: dict[str, PolicyEntry]  # as defined; built-ins are added by schema.policies_of
    backend_options: dict[str, dict[str, object]]
    resources: dict[str, ResourcesEntry] = field(default_factory=dict)  # per backend (harness.executors)
    locations: Locations = field(repr=False, default_factory=Locations)  # where each part is written

    @property
    def repeats(self) -> int:
        return self.defaults.repeats


def load_suite(path: PathLike, *, tasks_dirs: PathLike | Iterable[PathLike] | None = None) -> Suite:
    """Read and validate the suite at `path`; `tasks_dirs` as for inputs.tasks.list_tasks."""
    file = os.fspath(path)
    if not os.path.isfile(file):
        parent = Path(file).parent
        siblings = sorted(p.name for p in parent.glob("*.yaml")) if parent.is_dir() else []
        listing = f"; suites there: {', '.join(siblings)}" if siblings else ""
        raise SuiteError(f"{file}: no such suite file{did_you_mean(Path(file).name, siblings)}{listing}")
    return parse_suite_text(read_suite_file(file), file, tasks_dirs=tasks_dirs)


def parse_suite_text(text: str, path: str = "<text>", *,
                     tasks_dirs: PathLike | Iterable[PathLike] | None = None) -> Suite:
    """Validate suite text; `path` names it in errors and anchors its includes (a name in angle brackets
    is not on disk: such text cannot include, which `resolved_text` never needs)."""
    document = read_document(text, path)
    if "matrix" not in document.data:
        raise SuiteError("no matrix: this file defines no cells, so it is a fragment to `include:` from a suite, "
                         "not a runnable suite", mark=document.locations.mark(()))
    doc = validate(document.data, document.locations)
    check_references(doc, document.locations, _known_tasks(tasks_dirs))
    check_limits(doc, document.locations)
    check_backend_options(doc.backend_options, document.locations)
    check_gate_metrics(doc, document.locations)
    resolved = canonical_text(document.data, order=SuiteDoc.model_fields)
    suite = Suite(
        name=doc.name, version=doc.version, description=doc.description, path=path, text=text,
        resolved_text=resolved, hash=hashlib.sha256(resolved.encode()).hexdigest(),
        defaults=doc.defaults, matrix=doc.matrix,
        gates=tuple(GateRule(metric=metric, **doc.gates[metric].model_dump()) for metric in sorted(doc.gates)),
        validity=Validity(**doc.validity.model_dump()),
        sla=SLA(**doc.sla.model_dump()) if doc.sla is not None else None,
        targets=doc.targets, drafters=doc.drafters, tasks=doc.tasks, policies=doc.policies,
        backend_options=doc.backend_options, resources=doc.resources, locations=document.locations,
    )
    expand(suite)
    return suite


def check_gate_metrics(doc: SuiteDoc, locations: Locations) -> None:
    """A gate names a metric the harness records (harness.suite.metric_names), or the suite is refused."""
    for metric in doc.gates:
        if not metric_names.known_metric(metric):
            choices = metric_names.choices()
            raise locations.error(("gates", metric), f"unknown metric {show(metric)}{did_you_mean(metric, choices)}; "
                                                     f"metrics: {clip(', '.join(choices), 600)}", at="key")


def _known_tasks(tasks_dirs: PathLike | Iterable[PathLike] | None) -> list[str]:
    from inputs.tasks import TaskConfigError, list_tasks

    try:
        return list_tasks(tasks_dirs)
    except TaskConfigError as e:
        raise SuiteError(f"cannot list tasks: {e}") from None
