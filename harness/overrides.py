"""Command-line overrides of a suite (`harness run --seed/--n-samples/--concurrency/--rate/--repeats`) and
the suite `harness run --endpoint URL --model NAME` writes for an existing OpenAI-compatible server.

Why overrides edit the suite document rather than the cells: seed, samples and load are cell parameters,
so a cell run with `--n-samples 4` must have another id than the suite's (the gate pairs on ids), and the
run must store what it ran. Applying them to the merged document (includes resolved) and validating
again gives both: the cells come out of `expand` with honest ids, the resolved suite text the run stores
holds the overridden values, and `--resume` with the same flags finds the same suite hash.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

import yaml

from harness.suite import Suite, SuiteError, load_suite, parse_suite_text
from harness.suite.document import canonical_text
from harness.suite.schema import SuiteDoc


@dataclass(frozen=True)
class Overrides:
    seed: int | None = None  # defaults.seed
    n_samples: int | None = None  # every task's n_samples
    concurrency: tuple[int, ...] = ()  # the whole load axis becomes these closed-loop loads
    rate: tuple[float, ...] = ()  # … or these open-loop rates (both: concurrency values, then rates)
    repeats: int | None = None  # defaults.repeats
    max_new_tokens: int | None = None  # every task's max_new_tokens
    suite_text: str | None = None  # a generated suite (--endpoint) instead of a file

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) not in (None, ()) for f in fields(self))

    def flags(self) -> str:
        """The overrides as the flags that give them, for messages."""
        parts = [f"--seed {self.seed}" if self.seed is not None else "",
                 f"--n-samples {self.n_samples}" if self.n_samples is not None else "",
                 f"--max-new-tokens {self.max_new_tokens}" if self.max_new_tokens is not None else "",
                 " ".join(f"--concurrency {c}" for c in self.concurrency),
                 " ".join(f"--rate {r:g}" for r in self.rate),
                 f"--repeats {self.repeats}" if self.repeats is not None else ""]
        return " ".join(p for p in parts if p)


def apply(data: dict[str, Any], o: Overrides) -> dict[str, Any]:
    """A copy of the merged suite document with the overrides written into it."""
    doc = copy.deepcopy(data)
    defaults = doc.setdefault("defaults", {})
    if o.seed is not None:
        defaults["seed"] = o.seed
    if o.repeats is not None:
        defaults["repeats"] = o.repeats
    for key, value in (("n_samples", o.n_samples), ("max_new_tokens", o.max_new_tokens)):
        if value is not None:
            for task in doc.get("tasks", {}).values():
                task[key] = value
    if o.concurrency or o.rate:
        matrix = doc.setdefault("matrix", {})
        for kind, values in (("concurrency", o.concurrency), ("rate", o.rate)):
            if values:
                matrix[kind] = list(values)
            else:
                matrix.pop(kind, None)
        defaults.pop("concurrency", None)
        defaults.pop("rate", None)
        for entry in matrix.get("include", []):  # an include's load follows the overridden axis (its first value)
            entry.pop("concurrency", None)
            entry.pop("rate", None)
            if not any(k in entry for k in ("backend", "target", "drafter", "num_drafts", "task", "temperature",
                                            "policy")):
                entry["concurrency" if o.concurrency else "rate"] = (o.concurrency or o.rate)[0]
    return doc


def load(suite_path: str | Path | None, o: Overrides | None) -> Suite:
    """The suite at `suite_path` (or `o.suite_text`) with the overrides applied; SuiteError as loading does."""
    if o is not None and o.suite_text is not None:
        base = parse_suite_text(o.suite_text, str(suite_path or "<endpoint>"))
    elif suite_path is not None:
        base = load_suite(suite_path)
    else:
        raise SuiteError("no suite: give a suite file, or an endpoint to measure")
    if not o or o == Overrides(suite_text=o.suite_text):
        return base
    data = apply(yaml.safe_load(base.resolved_text), o)
    text = canonical_text(data, order=SuiteDoc.model_fields)
    try:
        return parse_suite_text(text, base.path)
    except SuiteError as exc:  # the line is of the overridden text: name the flags instead
        raise SuiteError(f"{base.path} with {o.flags()}: {exc.message}") from None


def endpoint_suite(url: str, model: str, tasks: Sequence[str], *, tokenizer: str | None = None, chat: bool = False,
                   n_samples: int = 8, max_new_tokens: int = 128, concurrency: Sequence[int] = (1,)) -> str:
    """A suite of plain cells against an existing OpenAI-compatible server (backend `openai`): the server's
    own speculative decoding, if any, is what it measures. The target names the tokenizer used to send
    token ids (`tokenizer`, else the model name); `chat` sends messages and lets the server tokenise."""
    name = "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in model).strip("-.") or "model"
    options: dict[str, Any] = {"base_url": url, "model": model}
    if chat:
        options["chat"] = True
    doc = {
        "version": 1,
        "name": f"endpoint-{name}",
        "description": f"harness run --endpoint {url} --model {model}",
        "defaults": {"backend": "openai", "seed": 0, "warmup": 1, "repeats": 1},
        "targets": {name: {"path": tokenizer or model}},
        "tasks": {task: {"n_samples": n_samples, "max_new_tokens": max_new_tokens, "temperature": 0}
                  for task in tasks},
        "matrix": {"backend": ["openai"], "target": [name], "drafter": ["none"], "task": list(tasks),
                   "concurrency": list(concurrency)},
        "backend_options": {"openai": options},
    }
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=None)
