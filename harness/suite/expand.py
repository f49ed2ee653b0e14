"""A suite's cells: `expand(suite)`, a pure function (no I/O), and `select(cells, only)` for `--only`.

The rules, in the order they apply:

1. Product. The axes nest in one fixed order — backend, target, drafter, num_drafts, policy, task,
   temperature, load — each axis's values in the order written. The order is fixed rather than taken
   from the YAML so that reordering keys (and the key-sorted `resolved_text`) expands identically.
   An axis the matrix leaves out takes `defaults.<axis>`; else, for target/drafter/task, the one entry
   defined (an error when there are several); policy falls back to `full`, temperature to each task's
   own, and num_drafts is needed only once a drafter that drafts is in play. The load axis is the
   `concurrency` values (closed loop) followed by the `rate` values (open loop): one of them per cell.
2. Exclude. A product combination is dropped when it matches every key of some `matrix.exclude` rule
   (a list matches any of its values; `method` matches the drafter's method). Rules match the
   combination as written, before step 3, so `exclude: [{policy: full}]` keeps plain decoding (it comes
   from the other policies too).
3. Normalise. Plain decoding (method none) verifies nothing: num_drafts becomes 0 and policy full, so
   its γ and policy axes collapse. A drafting combination that cannot run is an error that names the
   exclude rule removing it: a static policy verifying more than γ drafts, or a confidence policy
   (threshold, scheduler, budget) with a drafter whose proposals carry no confidences (all but dspark).
   A target's `dtype: auto` becomes the dtype this machine runs fastest (`dspark_core.native_dtype.fast_dtype`:
   bfloat16 on CUDA and on CPUs with native bf16 matmuls, float32 elsewhere), so a cell, its id and its
   stored row name the dtype that ran, and a gate never compares a bf16 run with an fp32 one.
4. Include. Each `matrix.include` entry adds one cell after the product, whatever the exclude rules say
   (as asv does: an include is an explicit request). An axis the entry leaves out takes
   `defaults.<axis>`, else the first value of the matrix's axis (as step 1 resolves it); the load, the
   entry's concurrency or rate, else the default load, else the first load value.
5. Deduplicate by `Cell.cell_id`, keeping the first: the order is the product's, then the includes'.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from dspark_core.native_dtype import fast_dtype
from harness.suite.document import DocPath
from harness.suite.errors import SuiteError, did_you_mean, one_of, show
from harness.suite.schema import (BACKENDS, CONFIDENCE_METHODS, CONFIDENCE_POLICIES, BUILTIN_POLICIES,
                                  drafters_of, policies_of)

if TYPE_CHECKING:
    from harness.suite.load import Suite

ORDER = ("backend", "target", "drafter", "num_drafts", "policy", "task", "temperature", "load")
_SECTIONS = {"target": "targets", "drafter": "drafters", "task": "tasks"}


@dataclass(frozen=True)
class _Value:
    """One axis value and where the suite writes it (for errors)."""

    value: Any
    path: DocPath


def expand(suite: Suite) -> list[Cell]:
    """Every cell of the suite, deduplicated, in a deterministic order (rules in the module docstring)."""
    axes = _axes(suite)
    cells: dict[str, Cell] = {}
    for combination in itertools.product(*(axes[a] for a in ORDER)):
        raw = dict(zip(ORDER, combination))
        if not _excluded(suite, raw):
            cell = _cell(suite, raw, include=None)
            cells.setdefault(cell.cell_id, cell)
    for n, entry in enumerate(suite.matrix.include):
        cell = _cell(suite, _filled(suite, axes, entry, n), include=n)
        cells.setdefault(cell.cell_id, cell)
    return list(cells.values())


def _axes(suite: Suite) -> dict[str, list[_Value]]:
    axes: dict[str, list[_Value]] = {}
    for axis in ORDER[:-1]:
        values = getattr(suite.matrix, axis)
        if values is not None:
            axes[axis] = [_Value(v, ("matrix", axis, i)) for i, v in enumerate(values)]
        else:
            axes[axis] = [_fallback(suite, axis)]
    load = [_Value((kind, v), ("matrix", kind, i)) for kind in ("concurrency", "rate")
            for i, v in enumerate(getattr(suite.matrix, kind) or [])]
    if not load:
        load = [_Value((kind, getattr(suite.defaults, kind)), ("defaults", kind)) for kind in ("concurrency", "rate")
                if getattr(suite.defaults, kind) is not None]
    if not load:
        raise suite.locations.error(("matrix",), "no load: give matrix.concurrency (closed loop, conversations in "
                                                 "flight) or matrix.rate (open loop, requests/s), or a default",
                                    at="key")
    axes["load"] = load
    return axes


def _fallback(suite: Suite, axis: str) -> _Value:
    """The single value of an axis the matrix leaves out."""
    default = getattr(suite.defaults, axis, None)
    if default is not None:
        return _Value(default, ("defaults", axis))
    if axis == "policy":
        return _Value("full", ("matrix",))
    if axis in ("num_drafts", "temperature"):
        return _Value(None, ("matrix",))
    if axis == "backend":
        raise suite.locations.error(("matrix",), f"no backend: give matrix.backend or defaults.backend "
                                                 f"({', '.join(BACKENDS)})", at="key")
    defined = list(suite.drafters or drafters_of({})) if axis == "drafter" else list(getattr(suite, _SECTIONS[axis]))
    if len(defined) == 1:
        return _Value(defined[0], (_SECTIONS[axis], defined[0]))
    raise suite.locations.error(("matrix",), f"no {axis} axis: {len(defined)} {_SECTIONS[axis]} are defined "
                                             f"({', '.join(defined) or 'none'}); list the ones to run in "
                                             f"matrix.{axis} or set defaults.{axis}", at="key")


def _facts(suite: Suite, raw: dict[str, _Value]) -> dict[str, Any]:
    """A combination's values as exclude rules see them (as written, before normalisation)."""
    facts = {axis: raw[axis].value for axis in ORDER[:-1]}
    facts["method"] = drafters_of(suite.drafters)[facts["drafter"]].method
    if facts["temperature"] is None:
        facts["temperature"] = suite.tasks[facts["task"]].temperature
    kind, load = raw["load"].value
    facts["concurrency"] = load if kind == "concurrency" else None
    facts["rate"] = load if kind == "rate" else None
    return facts


def _excluded(suite: Suite, raw: dict[str, _Value]) -> bool:
    facts = _facts(suite, raw)
    return any(all(facts[key] in getattr(rule, key) for key in rule.model_fields_set)
               for rule in suite.matrix.exclude)


def _filled(suite: Suite, axes: dict[str, list[_Value]], entry: Any, n: int) -> dict[str, _Value]:
    """An include entry with its missing axes filled in: defaults.<axis>, else the axis's first value."""
    here: DocPath = ("matrix", "include", n)
    raw: dict[str, _Value] = {}
    for axis in ORDER[:-1]:
        if getattr(entry, axis) is not None:
            raw[axis] = _Value(getattr(entry, axis), (*here, axis))
        elif getattr(suite.defaults, axis, None) is not None:
            raw[axis] = _Value(getattr(suite.defaults, axis), ("defaults", axis))
        else:
            raw[axis] = axes[axis][0]
    for source, path in ((entry, here), (suite.defaults, ("defaults",))):
        given = [(kind, getattr(source, kind)) for kind in ("concurrency", "rate") if getattr(source, kind) is not None]
        if given:
            raw["load"] = _Value(given[0], (*path, given[0][0]))
            break
    else:
        raw["load"] = axes["load"][0]
    return raw


def _cell(suite: Suite, raw: dict[str, _Value], include: int | None) -> Cell:
    drafter_name = raw["drafter"].value
    drafter = drafters_of(suite.drafters)[drafter_name]
    if drafter.method == "none":
        num_drafts, policy = 0, BUILTIN_POLICIES["full"]
    else:
        num_drafts = raw["num_drafts"].value
        policy = policies_of(suite.policies)[raw["policy"].value]
        _check_runnable(suite, raw, include, num_drafts, policy)
        if drafter.synthetic_acceptance is not None and raw["backend"].value not in ("inhouse", "vllm"):
            raise suite.locations.error(raw["drafter"].path, f"drafter {drafter_name!r} has synthetic_acceptance, "
                                        f"which only the inhouse and vllm backends implement (vllm: its synthetic "
                                        f"rejection sampler), not {raw['backend'].value!r}")
    target_name, task_name = raw["target"].value, raw["task"].value
    target, task = suite.targets[target_name], suite.tasks[task_name]
    temperature = raw["temperature"].value if raw["temperature"].value is not None else task.temperature
    kind, load = raw["load"].value
    options = suite.backend_options.get(raw["backend"].value, {})
    return Cell(
        backend=raw["backend"].value,
        target=TargetSpec(name=target_name, path=target.path, dtype=fast_dtype() if target.dtype == "auto" else target.dtype),
        drafter=DrafterSpec(name=drafter_name, method=drafter.method, checkpoint=drafter.checkpoint, head=drafter.head,
                            synthetic_acceptance=None if drafter.synthetic_acceptance is None
                            else tuple(drafter.synthetic_acceptance)),
        num_drafts=num_drafts,
        task=TaskSpec(name=task.dataset or task_name, n_samples=task.n_samples, max_new_tokens=task.max_new_tokens,
                      temperature=float(temperature), multi_turn=task.multi_turn),
        policy=PolicySpec(name=policy.name, verify_length=policy.verify_length, threshold=policy.threshold,
                          sps_table=policy.sps_table),
        concurrency=load if kind == "concurrency" else None,
        rate=float(load) if kind == "rate" else None,
        warmup=suite.defaults.warmup,
        seed=suite.defaults.seed,
        sla=suite.sla,
        backend_options=tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items())),
    )


def _check_runnable(suite: Suite, raw: dict[str, _Value], include: int | None, num_drafts: int | None,
                    policy: Any) -> None:
    drafter, key = raw["drafter"].value, raw["policy"].value
    method = drafters_of(suite.drafters)[drafter].method
    if num_drafts is None:
        where = ("matrix", "include", include) if include is not None else raw["drafter"].path
        raise suite.locations.error(where, f"drafter {show(drafter)} drafts, so it needs num_drafts: give "
                                           f"matrix.num_drafts or defaults.num_drafts")
    if policy.name == "static" and policy.verify_length > num_drafts:
        problem = (f"policy {show(key)} verifies {policy.verify_length} drafts per step but num_drafts is "
                   f"{num_drafts} (drafter {show(drafter)})")
        fix = f"exclude the combination: exclude: [{{policy: {key}, num_drafts: {num_drafts}}}]"
    elif policy.name in CONFIDENCE_POLICIES and method not in CONFIDENCE_METHODS:
        problem = (f"policy {show(key)} ({policy.name}) reads draft confidences, which drafter {show(drafter)} "
                   f"(method {method}) does not give")
        fix = f"exclude the combination: exclude: [{{drafter: {drafter}, policy: {key}}}]"
    else:
        return
    if include is not None:
        raise suite.locations.error(("matrix", "include", include), f"{problem}; change this include entry")
    raise suite.locations.error(raw["policy"].path, f"{problem}; {fix}")


# --- --only -------------------------------------------------------------------------------------------

SELECT_AXES = ("backend", "target", "drafter", "method", "num_drafts", "task", "temperature", "concurrency",
               "rate", "policy")
SELECT_ALIASES = {"gamma": "num_drafts"}
_NUMERIC = ("num_drafts", "temperature", "concurrency", "rate")


def select(cells: Iterable[Cell], only: Iterable[str]) -> list[Cell]:
    """The cells matching every `AXIS=VALUE` of `only` (`--only`): different axes AND, the same axis
    (repeated, or `AXIS=A,B`) OR. Axes are Cell.axes() names (policy is the policy kind, e.g. threshold);
    `gamma` is num_drafts, so `--only gamma=3` leaves out plain cells (γ 0) unless `--only gamma=0` too.
    A value no cell has is an error listing the values there are."""
    cells = list(cells)
    wanted: dict[str, list[Any]] = {}
    for item in only:
        name, sep, text = item.partition("=")
        axis = SELECT_ALIASES.get(name.strip(), name.strip())
        if not sep or not text.strip():
            raise SuiteError(f"--only {show(item)}: expected AXIS=VALUE, e.g. drafter=dspark")
        if axis not in SELECT_AXES:
            raise SuiteError(f"--only {show(item)}: " + one_of("axis", name.strip(), SELECT_AXES + tuple(SELECT_ALIASES)))
        for value in text.split(","):
            wanted.setdefault(axis, []).append(_parse(axis, value.strip(), item))
    for axis, values in wanted.items():
        present = _present(cells, axis)
        for value in values:
            if not any(_same(p, value) for p in present):
                shown = ", ".join(f"{p:g}" if isinstance(p, float) else str(p) for p in present) or "none"
                raise SuiteError(f"--only {axis}={value:g}: no cell has {axis} {value:g}; values: {shown}"
                                 if isinstance(value, float) else
                                 f"--only {axis}={value}: no cell has {axis} {show(value)}"
                                 f"{did_you_mean(value, present)}; values: {shown}")
    return [c for c in cells if all(any(_same(c.axes()[a], v) for v in vs) for a, vs in wanted.items())]


def _parse(axis: str, text: str, item: str) -> Any:
    if axis not in _NUMERIC:
        return text
    try:
        return float(text)
    except ValueError:
        raise SuiteError(f"--only {show(item)}: {axis} is a number, got {show(text)}") from None


def _present(cells: list[Cell], axis: str) -> list[Any]:
    values = {c.axes()[axis] for c in cells if c.axes()[axis] is not None}
    return sorted(values, key=lambda v: (str(type(v)), v))


def _same(cell_value: Any, wanted: Any) -> bool:
    if cell_value is None:
        return False
    if isinstance(wanted, float):
        return float(cell_value) == wanted
    return str(cell_value) == wanted
