"""Task registry: a task is a YAML file named `<task>.yaml` in a tasks directory; nothing is registered in
code. Directories searched: `tasks_dirs=` when given, then $HARNESS_TASKS_DIR (os.pathsep-separated), then
the built-in `inputs/tasks/`. A name defined in two directories is an error, not a silent override.

Lazy: listing tasks only lists file names; `get_task` parses one file (and what it includes); a dataset
loader ("module:function") is imported only when `load_task` needs its data.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import yaml

from inputs.tasks.selection import content_hash, select_subset
from inputs.tasks.sources import DATASETS
from inputs.tasks.spec import FILE_KEYS, TaskConfigError, TaskSample, TaskSpec, did_you_mean, spec_from_dict

TASKS_DIR_ENV = "HARNESS_TASKS_DIR"
BUILTIN_TASKS_DIR = Path(__file__).resolve().parent
TASK_SUFFIX = ".yaml"

PathLike = str | os.PathLike[str]


class UnknownTaskError(LookupError):
    """No task file has this name; the message lists the valid names."""

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class TaskData:
    """A task's spec with the samples a run uses and the fingerprint of that data."""

    spec: TaskSpec
    samples: tuple[TaskSample, ...]
    n_samples: int | None  # as requested; len(samples) may be smaller when the dataset is
    seed: int
    content_hash: str

    def __len__(self) -> int:
        return len(self.samples)


def task_dirs(tasks_dirs: PathLike | Iterable[PathLike] | None = None) -> list[Path]:
    """The directories searched for task files, in order."""
    if isinstance(tasks_dirs, (str, os.PathLike)):
        tasks_dirs = [tasks_dirs]
    extra = [Path(d).expanduser() for d in (tasks_dirs or [])]
    extra += [Path(d).expanduser() for d in os.environ.get(TASKS_DIR_ENV, "").split(os.pathsep) if d]
    for d in extra:
        if not d.is_dir():
            raise TaskConfigError(f"tasks directory {d} does not exist (from tasks_dirs= or {TASKS_DIR_ENV})")
    dirs: list[Path] = []
    for d in [*extra, BUILTIN_TASKS_DIR]:
        if d.resolve() not in [x.resolve() for x in dirs]:
            dirs.append(d)
    return dirs


def task_files(tasks_dirs: PathLike | Iterable[PathLike] | None = None) -> dict[str, Path]:
    """Task name -> its YAML file."""
    files: dict[str, Path] = {}
    for d in task_dirs(tasks_dirs):
        for path in sorted(d.glob(f"*{TASK_SUFFIX}")):
            name = path.name[: -len(TASK_SUFFIX)]
            if name in files:
                raise TaskConfigError(f"task {name!r} is defined twice: {files[name]} and {path}")
            files[name] = path
    return files


def list_tasks(tasks_dirs: PathLike | Iterable[PathLike] | None = None) -> list[str]:
    return sorted(task_files(tasks_dirs))


def get_task(name: str, tasks_dirs: PathLike | Iterable[PathLike] | None = None) -> TaskSpec:
    files = task_files(tasks_dirs)
    return spec_from_dict(name, _merged_keys(name, files, ()), source=str(_task_path(name, files)))


def load_task(task: str | TaskSpec, *, n_samples: int | None = None, seed: int = 0,
              data_dir: PathLike | None = None, hub: bool = True,
              tasks_dirs: PathLike | Iterable[PathLike] | None = None) -> TaskData:
    """Read a task's data (data directory first, then the hub), keep its first `spec.turns` user turns,
    take the seeded subset and fingerprint it."""
    spec = task if isinstance(task, TaskSpec) else get_task(task, tasks_dirs)
    loader = resolve_loader(spec.dataset)
    _check_dataset_args(spec, loader)
    samples = [_first_turns(spec, s) for s in loader(spec.split, data_dir=data_dir, hub=hub, **spec.dataset_args)]
    seen: set[str] = set()
    for s in samples:
        if s.id in seen:
            raise TaskConfigError(f"task {spec.name!r}: duplicate sample id {s.id!r}")
        seen.add(s.id)
    if not samples:
        raise TaskConfigError(f"task {spec.name!r}: dataset {spec.dataset!r} [{spec.split}] has no samples")
    chosen = select_subset(samples, n_samples, seed)
    return TaskData(spec=spec, samples=chosen, n_samples=n_samples, seed=seed,
                    content_hash=content_hash(spec, chosen))


def resolve_loader(dataset: str) -> Callable[..., Sequence[TaskSample]]:
    """A built-in dataset name or "package.module:function" -> the loader function."""
    target = DATASETS.get(dataset, dataset)
    if ":" not in target:
        raise TaskConfigError(f"unknown dataset {dataset!r}{did_you_mean(dataset, list(DATASETS))}; built-in "
                              f"datasets: {', '.join(sorted(DATASETS))}, or give \"package.module:function\"")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise TaskConfigError(f"dataset {dataset!r}: cannot import {module_name!r} ({e})") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TaskConfigError(f"dataset {dataset!r}: module {module_name!r} has no {attr!r}") from None


def _check_dataset_args(spec: TaskSpec, loader: Callable[..., Any]) -> None:
    try:
        sig = inspect.signature(loader)
    except (TypeError, ValueError):
        return
    params = sig.parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        valid = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n not in ("data_dir", "hub")]
        for key in spec.dataset_args:
            if key not in valid:
                raise TaskConfigError(f"task {spec.name!r}: dataset {spec.dataset!r} takes no argument {key!r}"
                                      f"{did_you_mean(key, valid)} (valid: {', '.join(valid) or 'none'})")
    try:
        sig.bind(spec.split, data_dir=None, hub=True, **spec.dataset_args)
    except TypeError as e:
        raise TaskConfigError(f"task {spec.name!r}: dataset {spec.dataset!r}: {e}") from None


def _first_turns(spec: TaskSpec, sample: TaskSample) -> TaskSample:
    if len(sample.turns) < spec.turns:
        raise TaskConfigError(f"task {spec.name!r} plays {spec.turns} turns but sample {sample.id!r} has "
                              f"{len(sample.turns)}")
    if len(sample.turns) == spec.turns and len(sample.references) <= spec.turns:
        return sample
    return TaskSample(id=sample.id, turns=sample.turns[: spec.turns], references=sample.references[: spec.turns],
                      metadata=sample.metadata)


def _task_path(name: str, files: dict[str, Path]) -> Path:
    if name not in files:
        valid = sorted(files)
        raise UnknownTaskError(f"unknown task {name!r}{did_you_mean(name, valid)}; valid tasks: "
                               f"{', '.join(valid) or 'none'} (task files are searched in "
                               f"{', '.join(str(d) for d in _dirs_of(files))}; add one with {TASKS_DIR_ENV})")
    return files[name]


def _dirs_of(files: dict[str, Path]) -> list[Path]:
    out: list[Path] = []
    for p in files.values():
        if p.parent not in out:
            out.append(p.parent)
    return out or [BUILTIN_TASKS_DIR]


def _merged_keys(name: str, files: dict[str, Path], stack: tuple[str, ...]) -> dict[str, Any]:
    """The task file's keys with `include:` resolved (the included task's keys, then this file's)."""
    if name in stack:
        raise TaskConfigError(f"include cycle: {' -> '.join([*stack, name])}")
    path = _task_path(name, files)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise TaskConfigError(f"{path}: invalid YAML ({e})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise TaskConfigError(f"{path}: a task file must be a mapping of keys, got {type(raw).__name__}")
    for key in raw:
        if key not in FILE_KEYS:
            raise TaskConfigError(f"{path}: unknown key {key!r}{did_you_mean(str(key), FILE_KEYS)} "
                                  f"(valid keys: {', '.join(FILE_KEYS)})")
    raw = dict(raw)
    parent = raw.pop("include", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise TaskConfigError(f"{path}: include must be a task name, got {parent!r}")
    return {**_merged_keys(parent, files, (*stack, name)), **raw}
