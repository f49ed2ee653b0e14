"""Names a suite uses must name something: each matrix, defaults, include and exclude value that refers to
a target, drafter, task or policy must be defined in the suite (or be a built-in: drafter `none`,
policies full/scheduler/budget), and each task must be one inputs.tasks knows, so that user task files
work and a typo is caught with the nearest name and the full list.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from harness.suite.document import DocPath, Locations
from harness.suite.errors import did_you_mean, show
from harness.suite.schema import POLICIES, SuiteDoc, drafters_of, policies_of

NAMED_AXES = ("target", "drafter", "task", "policy")


def check_references(doc: SuiteDoc, locations: Locations, known_tasks: Sequence[str]) -> None:
    """Raise a SuiteError at the first name that refers to nothing."""
    for key, entry in doc.tasks.items():
        task = entry.dataset or key
        if task not in known_tasks:
            where = ("tasks", key, "dataset") if entry.dataset else ("tasks", key)
            raise locations.error(where, f"unknown task {show(task)}{did_you_mean(task, known_tasks)}; tasks: "
                                         f"{', '.join(known_tasks)} (a task is a YAML file in inputs/tasks/ "
                                         "or $HARNESS_TASKS_DIR)",
                                  at="value" if entry.dataset else "key")
    for key, policy in doc.policies.items():
        if key in POLICIES and policy.name != key:
            raise locations.error(("policies", key, "name"), f"a policy named after the built-in {show(key)} must be "
                                                             f"one (name: {key}), not {show(policy.name)}")
    defined = {
        "target": list(doc.targets),
        "drafter": list(drafters_of(doc.drafters)),
        "task": list(doc.tasks),
        "policy": list(policies_of(doc.policies)),
    }
    for path, axis, value in _uses(doc):
        if value not in defined[axis]:
            raise locations.error(path, _undefined(axis, value, defined[axis]))


def _uses(doc: SuiteDoc) -> Iterable[tuple[DocPath, str, Any]]:
    """(path, axis, name) of every place the document names a target, drafter, task or policy."""
    for axis in NAMED_AXES:
        if getattr(doc.defaults, axis) is not None:
            yield ("defaults", axis), axis, getattr(doc.defaults, axis)
        for i, value in enumerate(getattr(doc.matrix, axis) or []):
            yield ("matrix", axis, i), axis, value
        for n, entry in enumerate(doc.matrix.include):
            if getattr(entry, axis) is not None:
                yield ("matrix", "include", n, axis), axis, getattr(entry, axis)
        for n, rule in enumerate(doc.matrix.exclude):
            for i, value in enumerate(getattr(rule, axis) or []):
                yield ("matrix", "exclude", n, axis, i), axis, value


def _undefined(axis: str, value: Any, defined: list[str]) -> str:
    section = {"target": "targets", "drafter": "drafters", "task": "tasks", "policy": "policies"}[axis]
    message = f"{axis} {show(value)} is not defined{did_you_mean(value, defined)}; defined: {', '.join(defined) or 'none'}"
    if axis == "policy" and value in ("static", "threshold"):
        example = "{static3: {name: static, verify_length: 3}}" if value == "static" else \
            "{thr07: {name: threshold, threshold: 0.7}}"
        return f"policy {show(value)} needs parameters: define one under policies:, e.g. policies: {example}"
    return f"{message} (define it under {section}:)"
