"""The suite reference, generated from `harness.suite.schema`: docs/SUITES.md for people and
docs/suite.schema.json for editors, both from one walk over the pydantic sections.

Why generated: the schema is the contract (strict, no unknown keys); a hand-written reference would drift
from it. Every key's type, default, bounds and valid choices are read from the field's annotation
(pydantic `Field` bounds, the `_choice` validators' choice tuples), its description from the comment
written beside the field in schema.py, and the examples are suites that tests load, so an example
that stops validating fails a test instead of misleading a reader.

    python3 -m harness.suite_reference docs/      # rewrite docs/SUITES.md and docs/suite.schema.json
    python3 -m harness.suite_reference --check docs/   # exit 1 when they are out of date
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import AfterValidator, BaseModel
from pydantic.fields import FieldInfo

from harness.suite import schema
from harness.starter import STARTER

MARKDOWN = "SUITES.md"
JSON_SCHEMA = "suite.schema.json"
SCHEMA_ID = "https://dspark-harness.invalid/suite.schema.json"


@dataclass
class Kind:
    """One type as the reference shows it: a scalar, a list, a mapping or a section, with its bounds."""

    name: str  # integer | number | string | boolean | null | any | list | mapping | section | union
    bounds: dict[str, float] = field(default_factory=dict)  # ge / gt / le / lt
    choices: tuple[str, ...] = ()
    noun: str = ""
    item: "Kind | None" = None  # list item, mapping value
    key: "Kind | None" = None  # mapping key
    model: type[BaseModel] | None = None
    options: tuple["Kind", ...] = ()  # union members
    nullable: bool = False  # null is accepted too (the key's default is usually null)
    shorthand: bool = False  # a list that also accepts one bare item (matrix axes, exclude rules)

    # The parts a list, a mapping and a section always have (kind_of sets them).
    @property
    def item_kind(self) -> Kind:
        assert self.item is not None, self
        return self.item

    @property
    def key_kind(self) -> Kind:
        assert self.key is not None, self
        return self.key

    @property
    def section(self) -> type[BaseModel]:
        assert self.model is not None, self
        return self.model


def _shorthand(model: type[BaseModel], name: str) -> bool:
    """`drafter: dspark` means `drafter: [dspark]` for matrix axes and exclude rules."""
    return (model is schema.Matrix and name in schema.AXES) or model is schema.ExcludeRule


def kind_of(annotation: Any, metadata: list | tuple = ()) -> Kind:
    """The Kind of a field's annotation (pydantic keeps the top level's Annotated parts in `metadata`)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        return kind_of(base, [*metadata, *extra])
    kind = _bare(annotation, origin)
    for item in metadata:
        if isinstance(item, FieldInfo):
            for inner in item.metadata:
                _constrain(kind, inner)
        else:
            _constrain(kind, item)
    return kind


def _bare(annotation: Any, origin: Any) -> Kind:
    if origin in (typing.Union, types.UnionType):
        options = tuple(kind_of(a) for a in typing.get_args(annotation))
        real = [o for o in options if o.name != "null"]
        if len(real) == 1:  # Optional[X]: the reference says so in the default instead
            real[0].nullable = True
            return real[0]
        return Kind("union", options=options)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return Kind("list", item=kind_of(item))
    if origin is dict:
        key, value = typing.get_args(annotation)
        return Kind("mapping", key=kind_of(key), item=kind_of(value))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return Kind("section", model=annotation)
    names = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
    return Kind(names.get(annotation, "any"))


def _constrain(kind: Kind, item: Any) -> None:
    for bound in ("ge", "gt", "le", "lt"):
        value = getattr(item, bound, None)
        if isinstance(item, getattr(annotated_types, bound.capitalize())) and value is not None:
            kind.bounds[bound] = value
    if isinstance(item, AfterValidator):
        nonlocals = inspect.getclosurevars(item.func).nonlocals
        if "choices" in nonlocals:
            kind.choices, kind.noun = tuple(nonlocals["choices"]), nonlocals.get("noun", "")
        elif item.func is schema._name:
            kind.noun = "name"
        elif item.func is schema._metric:
            kind.noun = "metric"
        elif item.func is schema._non_empty:
            kind.bounds["min_items"] = 1


# ------------------------------------------------------------------------------------- descriptions


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The comment written beside (or on the lines just above) each field in the model's source."""
    lines = inspect.getsource(model).splitlines()
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^\s{4}(\w+): .*?(?:#\s*(.*))?$", line)
        if match and match.group(1) in model.model_fields:
            text = " ".join(pending + ([match.group(2)] if match.group(2) else []))
            if text:
                out[match.group(1)] = text
        pending = []
    return out


# What each top-level section is for (the sections' own docstrings say how they are checked).
SECTION_TEXT = {
    "version": "The suite format version. Required.",
    "name": "The suite's name: runs are grouped by it (history, the dry-run estimate). Required.",
    "description": "Free text, shown nowhere but the store.",
    "defaults": "Values for matrix axes the matrix leaves out, and run settings (seed, warm-up, repeats).",
    "targets": "Target models by name. `path`: `embedded` (the committed embedded default), a local directory "
               "or a hub id.",
    "drafters": "Drafters by name. The drafter `none` (plain decoding) exists without an entry.",
    "tasks": "Tasks by name: gsm8k, humaneval, mt_bench or a task YAML of inputs/tasks. `n_samples` and "
             "`max_new_tokens` are required.",
    "policies": "Verification policies by name. `full`, `scheduler`, `budget` and `adaptive` exist without an "
                "entry; `static` and `threshold` need parameters.",
    "matrix": "The axes whose product is the cells (required). A bare value is a one-item list. "
              "`include` adds cells, `exclude` drops combinations.",
    "sla": "Service-level targets: the report draws them on the TTFT/TPOT plots; goodput counts requests "
           "within them.",
    "validity": "When a run counts: the gate refuses runs with fewer requests or less time per cell.",
    "gates": "Regression rules by metric name, used by `harness gate`.",
    "backend_options": "Per backend, options handed to it as they are (scalars or lists of scalars), e.g. "
                       "`openai: {base_url: http://127.0.0.1:8000/v1}`.",
    "resources": "Per backend, what one cell reserves (Ray schedules by it; cost = wall time × it).",
}

# Keys whose schema line has no comment: by key name (the axes mean the same in every section that has them).
MEANINGS = {
    "backend": "where the cell runs: the in-house engine, a vLLM or SGLang server the harness starts, or an "
               "existing OpenAI-compatible endpoint (`openai`)",
    "target": "a name defined under `targets:`",
    "drafter": "a name defined under `drafters:`, or `none` (plain decoding)",
    "num_drafts": "γ: drafts proposed per step (plain decoding: ignored)",
    "task": "a name defined under `tasks:`",
    "policy": "a name defined under `policies:`, or a built-in (`full`, `scheduler`, `budget`, `adaptive`)",
    "concurrency": "closed-loop load: users each sending their next request when the last one ends",
    "rate": "open-loop load: Poisson arrivals, requests/s (a cell has concurrency or rate, not both)",
    "temperature": "sampling temperature; 0 is greedy (lossless: equal to plain decoding token for token)",
    "seed": "seeds the task's sample subset and sampling; a cell parameter",
    "n_samples": "conversations measured per cell (a seeded subset of the task's data)",
    "dtype": "weights' dtype; `auto`: bfloat16 where the machine expanding the suite has native bf16 matmuls (CUDA, AVX512-BF16, AMX), else float32",
    "method": "how drafts are made; `dspark`, `dflash`, `eagle3`, `draft_model` need a checkpoint",
    "name": "which policy this entry configures",
    "ttft_s": "time to first token target, seconds (per request)",
    "tpot_s": "time per output token target, seconds (per request, after the first token)",
    "min_requests": "fewest measured requests per cell for a valid run",
    "min_duration_s": "shortest measured window per cell, seconds",
    "max_failed_fraction": "largest fraction of failed requests per cell",
    "direction": "which way is better for the metric",
    "test": "paired bootstrap over prompts (per-prompt ratio metrics and ECE), Mann-Whitney over repeats, or "
            "a plain threshold on means",
    "relative": "smallest relative change called a regression (0.02 = 2 %); null: none",
    "absolute": "smallest change in the metric's own unit called a regression; null: none",
    "min_effect": "changes smaller than this (relative) are never regressions",
    "min_samples": "fewest paired prompts (or repeats) the test needs, else inconclusive",
    "alpha": "significance level of the test",
    "level": "`fail` exits 1 on a regression, `warn` only reports it",
    "resamples": "bootstrap resamples",
    "num_cpus": "CPUs one cell reserves",
    "num_gpus": "GPUs one cell reserves",
    "include": "cells added after the product, whatever the exclude rules say; open axes take defaults",
    "exclude": "combinations dropped from the product when they match every key of a rule",
}

# Rules spanning keys of one section (the sections' `_check` validators).
RULES = {
    "DrafterEntry": "`dspark`, `dflash`, `eagle3` and `draft_model` need `checkpoint`; `none` and `ngram` take "
                    "none. `head` is for `dspark` only. `draft_model`'s checkpoint is a causal LM (`embedded`: "
                    "the embedded target); the others' drafts are `embedded:<name>`, a directory or a hub id.",
    "PolicyEntry": "`static` needs `verify_length` (γ' ≤ γ of its cells), `threshold` needs `threshold`; "
                   "`sps_table` is for `scheduler`, `budget` and `adaptive`. `threshold`, `scheduler` and "
                   "`budget` read draft confidences: `dspark` drafters only.",
    "Defaults": "`concurrency` or `rate`, not both.",
    "Combination": "At least one axis; `concurrency` or `rate`, not both.",
    "ExcludeRule": "At least one key.",
    "Matrix": "An axis left out takes `defaults.<axis>`, else (target, drafter, task) the one entry defined; "
              "policy falls back to `full`, temperature to each task's own.",
    "SLA": "At least one of `ttft_s`, `tpot_s`.",
}

# Each section with a one-line example (YAML flow style), checked by tests/harness/test_suite_reference.py.
EXAMPLES = {
    "defaults": "{backend: inhouse, seed: 0, warmup: 1, repeats: 3, policy: full, concurrency: 1}",
    "targets": "{embedded: {path: embedded, dtype: float32}}",
    "drafters": "{dspark: {method: dspark, checkpoint: 'embedded:dspark'}, ngram: {method: ngram}}",
    "tasks": "{gsm8k: {n_samples: 8, max_new_tokens: 48, temperature: 0}}",
    "policies": "{static3: {name: static, verify_length: 3}, thr07: {name: threshold, threshold: 0.7}}",
    "matrix": "{drafter: [none, dspark], num_drafts: [3, 7], task: gsm8k, concurrency: [1, 4], "
              "exclude: [{num_drafts: 7, concurrency: 1}], include: [{drafter: dspark, num_drafts: 7, "
              "policy: thr07, concurrency: 4}]}",
    "sla": "{ttft_s: 2.0, tpot_s: 0.2}",
    "validity": "{min_requests: 4, min_duration_s: 0.5, max_failed_fraction: 0.0}",
    "gates": "{acceptance_length: {direction: higher, test: paired_bootstrap, relative: 0.01}}",
    "backend_options": "{openai: {base_url: 'http://127.0.0.1:8000/v1', model: embedded}}",
    "resources": "{inhouse: {num_cpus: 1}, vllm: {num_gpus: 1, num_cpus: 4, memory_gb: 64}}",
}


# ------------------------------------------------------------------------------------------ markdown


def type_text(kind: Kind) -> str:
    if kind.name == "list":
        inner = type_text(kind.item_kind)
        return f"list of {inner}" + (f" (or one {inner})" if kind.shorthand else "")
    if kind.name == "mapping":
        return f"mapping {type_text(kind.key_kind)} → {type_text(kind.item_kind)}"
    if kind.name == "section":
        return f"[{kind.section.__name__}](#{kind.section.__name__.lower()})"
    if kind.name == "union":
        return " or ".join(type_text(o) for o in kind.options)
    if kind.noun in ("name", "metric"):
        return f"{kind.noun}"
    return kind.name


_BOUND_WORDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


def bounds_text(kind: Kind) -> str:
    parts = [f"{_BOUND_WORDS[b]} {v:g}" for b, v in kind.bounds.items() if b in _BOUND_WORDS]
    if kind.bounds.get("min_items"):
        parts.append("not empty")
    if kind.choices:
        parts.append("one of " + ", ".join(f"`{c}`" for c in kind.choices))
    if kind.noun == "name":
        parts.append("letters, digits, `_ . -`")
    if kind.item is not None and kind.name in ("list", "mapping"):
        inner = bounds_text(kind.item)
        if inner:
            parts.append(f"each {inner}")
    if kind.key is not None:
        inner = bounds_text(kind.key)
        if inner:
            parts.append(f"keys {inner}")
    return "; ".join(parts)


def default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section defaults)"
    if value is None:
        return "none"
    if value in ({}, [], ""):
        return "empty"
    return f"`{json.dumps(value)}`"


def field_kind(model: type[BaseModel], name: str, info: FieldInfo) -> Kind:
    kind = kind_of(info.annotation, info.metadata)
    if _shorthand(model, name) and kind.name == "list":
        kind.shorthand = True
    return kind


def sections() -> list[type[BaseModel]]:
    """Every section model reachable from SuiteDoc, in reading order."""
    seen: list[type[BaseModel]] = []

    def visit(kind: Kind) -> None:
        for sub in (kind.item, kind.key, *kind.options):
            if sub is not None:
                visit(sub)
        if kind.model is not None and kind.model not in seen:
            walk(kind.model)

    def walk(model: type[BaseModel]) -> None:
        seen.append(model)
        for name, info in model.model_fields.items():
            visit(field_kind(model, name, info))

    walk(schema.SuiteDoc)
    return seen


def _meaning(model: type[BaseModel], name: str, comments: dict[str, str]) -> str:
    if model is schema.SuiteDoc:
        base = SECTION_TEXT.get(name, "")
    else:
        base = MEANINGS.get(name, "")
    text = " ".join(p for p in (base, comments.get(name, "")) if p)
    return text[0].upper() + text[1:] if text else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    out = [
        "# Suite reference",
        "",
        "<!-- generated by `python3 -m harness.suite_reference docs/` from harness/suite/schema.py; "
        "do not edit by hand -->",
        "",
        "A suite is one YAML file (data, never code). Keys are checked strictly: an unknown key is an error with "
        "the nearest valid one, YAML types are taken as written (`n_samples: \"8\"` is an error, an integer is "
        "accepted where a number is expected). Every missing required key is reported at once, each with "
        "`file:line:col`. `harness init suite.yaml` writes a commented starter suite that runs as it is; "
        f"[`{JSON_SCHEMA}`]({JSON_SCHEMA}) is the same schema for editors (YAML language server: "
        f"`# yaml-language-server: $schema=../docs/{JSON_SCHEMA}` on the first line of a file in suites/; the path "
        "is relative to the suite file).",
        "",
        "## A complete suite",
        "",
        "```yaml",
        STARTER.strip(),
        "```",
        "",
        "How the matrix expands into cells (product order, exclude, include, plain decoding's collapsed γ and "
        "policy) is described in `harness/suite/expand.py`. Each cell's id is a hash of its parameters, so "
        "changing a seed, `n_samples` or a load (in the file or with `harness run --seed/--n-samples/"
        "--concurrency/--rate`) makes new cells; `repeats` and `resources` do not.",
        "",
        "Speculative cells are compared with plain decoding of the same backend, target, task, load and seed: "
        "put the drafter `none` in the matrix, or the run warns that their ×plain column stays empty.",
        "",
    ]
    for model in sections():
        title = "top level" if model is schema.SuiteDoc else model.__name__
        out += [f"## {model.__name__}", ""]
        if model is not schema.SuiteDoc and model.__doc__:
            out += [" ".join(model.__doc__.split()), ""]
        elif model is schema.SuiteDoc:
            out += ["The document's " + title + " keys.", ""]
        comments = field_comments(model)
        out += ["| key | type | default | bounds / choices | meaning |", "|---|---|---|---|---|"]
        for name, info in model.model_fields.items():
            kind = field_kind(model, name, info)
            meaning = _meaning(model, name, comments)
            out.append(f"| `{name}` | {_cell(type_text(kind))} | {_cell(default_text(info))} | "
                       f"{_cell(bounds_text(kind))} | {_cell(meaning)} |")
        out.append("")
        if model.__name__ in RULES:
            out += [f"Rules: {RULES[model.__name__]}", ""]
        if model is schema.SuiteDoc:
            out += ["Examples, one per section:", "", "```yaml"]
            out += [f"{name}: {EXAMPLES[name]}" for name in model.model_fields if name in EXAMPLES]
            out += ["```", ""]
    out += [
        "## Built-in names",
        "",
        f"- backends: {', '.join(f'`{b}`' for b in schema.BACKENDS)} (`openai`: any OpenAI-compatible "
        "endpoint at `backend_options.openai.base_url`; see README)",
        f"- drafter methods: {', '.join(f'`{m}`' for m in schema.METHODS)}; with a checkpoint: "
        f"{', '.join(f'`{m}`' for m in schema.WEIGHTED_METHODS)}",
        f"- policies without an entry: {', '.join(f'`{p}`' for p in schema.BUILTIN_POLICIES)}",
        f"- drafters without an entry: {', '.join(f'`{d}`' for d in schema.BUILTIN_DRAFTERS)} (plain decoding)",
        f"- γ (`num_drafts`): 1 … {schema.MAX_NUM_DRAFTS}",
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------------------- JSON Schema


def json_type(kind: Kind) -> dict[str, Any]:
    if kind.nullable:
        inner = json_type(Kind(**{**kind.__dict__, "nullable": False}))
        return {"anyOf": [inner, {"type": "null"}]}
    names = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean", "null": "null"}
    if kind.name in names:
        out: dict[str, Any] = {"type": names[kind.name]}
        bounds = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}
        out.update({bounds[b]: v for b, v in kind.bounds.items() if b in bounds})
        if kind.choices:
            out["enum"] = list(kind.choices)
        if kind.noun == "name":
            out["pattern"] = schema._NAME.pattern
        if kind.noun == "metric":
            out["pattern"] = schema._METRIC.pattern
        return out
    if kind.name == "list":
        out = {"type": "array", "items": json_type(kind.item_kind)}
        if kind.bounds.get("min_items"):
            out["minItems"] = 1
        return {"anyOf": [json_type(kind.item_kind), out]} if kind.shorthand else out
    if kind.name == "mapping":
        return {"type": "object", "propertyNames": json_type(kind.key_kind),
                "additionalProperties": json_type(kind.item_kind)}
    if kind.name == "section":
        return {"$ref": f"#/$defs/{kind.section.__name__}"}
    if kind.name == "union":
        return {"anyOf": [json_type(o) for o in kind.options]}
    return {}


def json_schema() -> dict[str, Any]:
    defs = {}
    for model in sections():
        comments = field_comments(model)
        props = {}
        for name, info in model.model_fields.items():
            prop = json_type(field_kind(model, name, info))
            text = _meaning(model, name, comments)
            if text:
                prop["description"] = text
            if not info.is_required():
                value = info.get_default(call_default_factory=True)
                if not isinstance(value, BaseModel):
                    prop["default"] = value
            props[name] = prop
        entry = {"type": "object", "additionalProperties": False, "properties": props}
        required = [n for n, i in model.model_fields.items() if i.is_required()]
        if required:
            entry["required"] = required
        doc = " ".join((model.__doc__ or "").split()) if model is not schema.SuiteDoc else ""
        if doc or model.__name__ in RULES:
            entry["description"] = " ".join(p for p in (doc, RULES.get(model.__name__, "")) if p)
        defs[model.__name__] = entry
    top = defs.pop(schema.SuiteDoc.__name__)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, "title": "dspark-harness suite",
            **top, "$defs": defs}


def rendered() -> dict[str, str]:
    """File name → text of every generated file."""
    return {MARKDOWN: markdown() + "\n", JSON_SCHEMA: json.dumps(json_schema(), indent=1, ensure_ascii=False) + "\n"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.suite_reference",
                                     description="write docs/SUITES.md and docs/suite.schema.json from the schema")
    parser.add_argument("out", type=Path, nargs="?", default=Path("docs"), help="directory (default: docs)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the files there are not up to date")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(path)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python3 -m harness.suite_reference {args.out})", file=sys.stderr)
        return 1
    return 0




if __name__ == "__main__":
    raise SystemExit(main())
