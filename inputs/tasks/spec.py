"""What a task is: a `TaskSpec` (read from a small YAML file) and the `TaskSample`s its dataset yields.

A task file is flat YAML; its name is the file's stem (`gsm8k.yaml` is task `gsm8k`):

    version: 1                    # bump when the data or the prompt changes meaning; part of the content hash
    category: math                # math | code | chat
    dataset: gsm8k                # a built-in dataset name, or "package.module:function" for your own loader
    split: test
    dataset_args: {}              # keyword arguments passed to the loader (e.g. data_file for `jsonl`)
    prompt_template: "{input}\\nPlease reason step by step, and put your final answer within \\\\boxed{}."
    turns: 1                      # user turns per sample that the runner plays (MT-Bench: 2)
    max_new_tokens: 512           # default budget per generated turn; suites may override
    description: ...              # optional
    include: other_task           # optional: start from another task's keys, then override

`prompt_template` is filled by plain substitution of the literal `{input}` with each user turn's text; no
other braces are interpreted, so `\\boxed{}` needs no escaping. Unknown keys are rejected with the nearest
valid key suggested.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

Category = Literal["math", "code", "chat"]
CATEGORIES: tuple[str, ...] = ("math", "code", "chat")
INPUT_PLACEHOLDER = "{input}"


class TaskConfigError(ValueError):
    """A task file or TaskSpec is malformed."""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    version: int
    category: Category
    dataset: str  # built-in dataset name or "module:function"
    split: str = "test"
    prompt_template: str = INPUT_PLACEHOLDER
    turns: int = 1  # user turns played per sample; later turns follow the model's own earlier answers
    max_new_tokens: int = 512  # per generated turn
    dataset_args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    description: str = ""

    def __post_init__(self) -> None:
        where = f"task {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise TaskConfigError("task name must be a non-empty string")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 0:
            raise TaskConfigError(f"{where}: version must be a non-negative integer, got {self.version!r}")
        if self.category not in CATEGORIES:
            raise TaskConfigError(f"{where}: category must be one of {', '.join(CATEGORIES)}, got {self.category!r}"
                                  + did_you_mean(str(self.category), CATEGORIES))
        for key in ("dataset", "split", "prompt_template", "description"):
            if not isinstance(getattr(self, key), str):
                raise TaskConfigError(f"{where}: {key} must be a string, got {getattr(self, key)!r}")
        if not self.dataset:
            raise TaskConfigError(f"{where}: dataset must be set")
        if INPUT_PLACEHOLDER not in self.prompt_template:
            raise TaskConfigError(f"{where}: prompt_template must contain {INPUT_PLACEHOLDER}, "
                                  f"got {self.prompt_template!r}")
        for key in ("turns", "max_new_tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TaskConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
        if not isinstance(self.dataset_args, Mapping):
            raise TaskConfigError(f"{where}: dataset_args must be a mapping, got {self.dataset_args!r}")

    def format_prompt(self, text: str) -> str:
        """One user turn as the model sees it (before the chat template)."""
        return self.prompt_template.replace(INPUT_PLACEHOLDER, text)


@dataclass(frozen=True)
class TaskSample:
    """One dataset item. `turns` are the raw user turns (no template applied); `references[i]`, when
    present, is the reference answer to turn i (GSM8K: the final number; HumanEval: the canonical
    solution; MT-Bench: the reference answers where the dataset has them)."""

    id: str
    turns: tuple[str, ...]
    references: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)  # JSON-serialisable extras

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise TaskConfigError(f"sample id must be a non-empty string, got {self.id!r}")
        if not self.turns or not all(isinstance(t, str) for t in self.turns):
            raise TaskConfigError(f"sample {self.id!r}: turns must be a non-empty sequence of strings")
        # Accept lists from loaders, keep tuples inside.
        object.__setattr__(self, "turns", tuple(self.turns))
        object.__setattr__(self, "references", tuple(self.references))

    @property
    def reference(self) -> str | None:
        """Reference answer to the first turn, if any."""
        return self.references[0] if self.references else None


SPEC_KEYS: tuple[str, ...] = ("version", "category", "dataset", "split", "prompt_template", "turns",
                              "max_new_tokens", "dataset_args", "description")
FILE_KEYS: tuple[str, ...] = SPEC_KEYS + ("include",)


def spec_from_dict(name: str, raw: Mapping[str, Any], source: str = "") -> TaskSpec:
    """Build a TaskSpec from a task file's (already `include:`-merged) keys."""
    where = f" in {source}" if source else ""
    unknown = [k for k in raw if k not in SPEC_KEYS]
    if unknown:
        key = unknown[0]
        raise TaskConfigError(f"task {name!r}: unknown key {key!r}{where}{did_you_mean(str(key), SPEC_KEYS)}"
                              f" (valid keys: {', '.join(FILE_KEYS)})")
    missing = [k for k in ("version", "category", "dataset") if k not in raw]
    if missing:
        raise TaskConfigError(f"task {name!r}: missing required key(s) {', '.join(missing)}{where}")
    values = dict(raw)
    values["dataset_args"] = dict(values.get("dataset_args") or {})
    try:
        return TaskSpec(name=name, **values)
    except TaskConfigError as e:
        raise TaskConfigError(f"{e}{where}") from None


def did_you_mean(word: str, choices: tuple[str, ...] | list[str]) -> str:
    """"; did you mean 'x'?" for the closest of `choices` (task files and names), or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
