"""The suite document: what each section may hold, checked field by field with pydantic (strict, no
unknown keys), and pydantic's errors turned into one-line `SuiteError`s at the offending line.

    version: 1                         # the suite format (harness.suite.document.SUITE_VERSION)
    name: cpu
    description: free text
    include: [common.yaml]             # merged before validation (harness.suite.document)
    defaults: {backend: inhouse, seed: 0, warmup: 2, repeats: 1, policy: full}
    targets:  {embedded: {path: embedded, dtype: float32}}
    drafters: {dspark: {method: dspark, checkpoint: "embedded:dspark", head: markov},
               small: {method: draft_model, checkpoint: Qwen/Qwen3-0.6B}}   # a causal LM as the draft
    tasks:    {gsm8k: {n_samples: 8, max_new_tokens: 48, temperature: 0, multi_turn: true}}
    policies: {thr07: {name: threshold, threshold: 0.7}}
    matrix:   {backend: [...], target: [...], drafter: [...], num_drafts: [...], task: [...],
               temperature: [...], concurrency: [...], rate: [...], policy: [...],
               include: [{...}], exclude: [{...}]}
    sla:      {ttft_s: 2.0, tpot_s: 0.2}
    validity: {min_requests: 4, min_duration_s: 0.5, max_failed_fraction: 0.0}
    gates:    {acceptance_length: {direction: higher, test: paired_bootstrap, relative: 0.01}}
    backend_options: {vllm: {gpu_memory_utilization: 0.9}}
    resources: {inhouse: {num_cpus: 1}, vllm: {num_gpus: 1, num_cpus: 4, memory_gb: 64}}   # optional
    limits:   {max_new_tokens: 32768, concurrency: 4096, ...}   # optional: raise a ceiling (Limits)

Strict means YAML types are taken as written: `n_samples: "8"` is an error, not 8; an integer is
accepted where a number is expected. Checks that span sections (a matrix value naming a defined drafter,
a task known to inputs.tasks) are in `harness.suite.references`; combinations that cannot run (static
γ' > γ) in `harness.suite.expand`.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from typing import Annotated, Any, NoReturn

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from contracts.backend import BACKENDS as BACKEND_REGISTRY
from contracts.names import (CONFIDENCE_METHODS, CONFIDENCE_POLICIES, DTYPES, SUITE_DTYPES, HEADS, LM_METHODS, METHODS,  # noqa: F401
                             POLICIES, TABLE_POLICIES, WEIGHTED_METHODS)
from harness.gate.rules import GateRule, Validity
from harness.suite.document import SUITE_VERSION, DocPath, Locations
from harness.suite.errors import SuiteError, did_you_mean, one_of, show

BACKENDS = tuple(BACKEND_REGISTRY)  # the names below are the contracts' (contracts.names), not copies
DIRECTIONS = ("higher", "lower")
TESTS = ("paired_bootstrap", "mann_whitney", "paired_rounds", "threshold")
LEVELS = ("fail", "warn")
MAX_NUM_DRAFTS = 32
INT64_MAX = 2 ** 63 - 1
INT32_MAX = 2 ** 31 - 1  # INTEGER columns of the store (concurrency, num_drafts, repeat)
EMBEDDED = "embedded"  # target path of the committed embedded default; drafts are "embedded:<name>"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_METRIC = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def fail(message: str, at: DocPath = (), mark: str = "value") -> NoReturn:
    """Reject a value from inside a validator; `at` is a path below the model being validated, `mark`
    whether the error points at that path's key or its value."""
    raise PydanticCustomError("suite", "{message}", {"message": message, "at": at, "mark": mark})


def _choice(noun: str, choices: tuple[str, ...]) -> AfterValidator:
    def check(value: str) -> str:
        if value not in choices:
            fail(one_of(noun, value, choices))
        return value
    return AfterValidator(check)


def _name(value: str) -> str:
    if not _NAME.match(value):
        fail(f"names are letters, digits, '_', '.' and '-' (starting with a letter or digit), got {show(value)}")
    return value


def _metric(value: str) -> str:
    if not _METRIC.match(value):
        fail(f"a gate is keyed by a metric name (letters, digits, '_'), got {show(value)}")
    return value


Name = Annotated[str, AfterValidator(_name)]
Metric = Annotated[str, AfterValidator(_metric)]
Backend = Annotated[str, _choice("backend", BACKENDS)]
Gamma = Annotated[int, Field(ge=1, le=MAX_NUM_DRAFTS)]
Concurrency = Annotated[int, Field(ge=1)]
Rate = Annotated[float, Field(gt=0)]
Temperature = Annotated[float, Field(ge=0)]


class Section(BaseModel):
    """Strict, frozen, and an unknown key is reported with the nearest valid one."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)  # .inf/.nan: never

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise PydanticCustomError("unknown_key", "unknown key {key}",
                                              {"key": key, "valid": tuple(cls.model_fields)})
        return data


def _as_lists(data: Any, keys: tuple[str, ...]) -> Any:
    """`drafter: dspark` is shorthand for `drafter: [dspark]`."""
    if isinstance(data, dict):
        return {k: [v] if k in keys and not isinstance(v, list) else v for k, v in data.items()}
    return data


class TargetEntry(Section):
    path: str  # "embedded", a local directory or a hub id
    dtype: Annotated[str, _choice("dtype", SUITE_DTYPES)] = "float32"

    @model_validator(mode="after")
    def _check(self) -> TargetEntry:
        if not self.path:
            fail("a target needs a path ('embedded', a local directory or a hub id)", ("path",))
        if self.path.startswith(EMBEDDED + ":"):
            fail("the embedded target is written 'embedded'; 'embedded:<name>' names a draft", ("path",))
        return self


_CHECKPOINT_FORMS = {  # by whether the method's checkpoint is a Hugging Face causal LM
    False: "'embedded:<name>', a local directory or a hub id",
    True: "'embedded' for the embedded target, a local directory or a hub id",
}


class DrafterEntry(Section):
    method: Annotated[str, _choice("drafter method", METHODS)]
    # "embedded:<name>", a local directory or a hub id; for draft_model a Hugging Face causal LM: "embedded"
    # (the embedded target), a local directory or a hub id
    checkpoint: str | None = None
    head: Annotated[str, _choice("head", HEADS)] | None = None  # dspark only; None: the checkpoint's
    # Engine speed at a fixed acceptance (NOT lossless: the verifier accepts draft k with these per-position
    # conditional rates, positions past the list at the last one, instead of by the target); in-house only
    synthetic_acceptance: list[Annotated[float, Field(ge=0, le=1)]] | None = None

    @model_validator(mode="after")
    def _check(self) -> DrafterEntry:
        if self.method in WEIGHTED_METHODS and not self.checkpoint:
            fail(f"method {self.method} needs a checkpoint ({_CHECKPOINT_FORMS[self.method in LM_METHODS]})",
                 ("method",))
        if self.method not in WEIGHTED_METHODS and self.checkpoint is not None:
            fail(f"method {self.method} has no weights: remove checkpoint", ("checkpoint",), "key")
        if self.method in LM_METHODS:
            if self.checkpoint is not None and self.checkpoint.startswith(EMBEDDED + ":"):
                fail(f"method {self.method} drafts with a Hugging Face causal LM ({_CHECKPOINT_FORMS[True]}); "
                     f"'embedded:<name>' names one of our DSpark/DFlash/Eagle3 drafts", ("checkpoint",))
        elif self.checkpoint == EMBEDDED or self.checkpoint == EMBEDDED + ":":
            fail("an embedded draft is written 'embedded:<name>' (a directory of models/embedded/drafts/)",
                 ("checkpoint",))
        if self.head is not None and self.method != "dspark":
            fail(f"head applies to method dspark only, not {self.method}", ("head",), "key")
        if self.synthetic_acceptance is not None and (self.method == "none" or not self.synthetic_acceptance):
            fail("synthetic_acceptance needs a drafting method and at least one rate (per-position conditional "
                 "acceptance, e.g. [0.8, 0.6])", ("synthetic_acceptance",))
        return self


class TaskEntry(Section):
    n_samples: Annotated[int, Field(ge=1)]
    max_new_tokens: Annotated[int, Field(ge=1)]  # per generated turn
    temperature: Temperature = 0.0
    multi_turn: bool = True  # play every turn of multi-turn tasks (MT-Bench); false: the first only
    dataset: Name | None = None  # the task run (default: the entry's name): one task at two sizes, in two entries


class PolicyEntry(Section):
    name: Annotated[str, _choice("policy", POLICIES)]
    verify_length: Gamma | None = None  # static: γ' ≤ γ
    threshold: Annotated[float, Field(gt=0, lt=1)] | None = None  # threshold: σ(c_k) cut-off
    # scheduler/budget: SPS(B) table JSON; adaptive: an SPS JSON store holding a step-cost table for the target
    # (dspark_core.costs); relative paths: to the working directory. None: profiled before the first cell.
    sps_table: str | None = None

    @model_validator(mode="after")
    def _check(self) -> PolicyEntry:
        if self.name == "static" and self.verify_length is None:
            fail("policy static needs verify_length (γ' drafts verified per step, 1..γ)", ("name",))
        if self.name == "threshold" and self.threshold is None:
            fail("policy threshold needs threshold (a confidence cut-off in (0, 1))", ("name",))
        if self.name != "static" and self.verify_length is not None:
            fail(f"verify_length applies to policy static only, not {self.name}", ("verify_length",), "key")
        if self.name != "threshold" and self.threshold is not None:
            fail(f"threshold applies to policy threshold only, not {self.name}", ("threshold",), "key")
        if self.name not in TABLE_POLICIES and self.sps_table is not None:
            fail(f"sps_table applies to policies {', '.join(TABLE_POLICIES)} only, not {self.name}", ("sps_table",),
                 "key")
        return self


BUILTIN_POLICIES = {  # usable by name without a `policies:` entry; static and threshold need parameters
    "full": PolicyEntry(name="full"),
    "scheduler": PolicyEntry(name="scheduler"),
    "budget": PolicyEntry(name="budget"),
    "adaptive": PolicyEntry(name="adaptive"),
}
BUILTIN_DRAFTERS = {"none": DrafterEntry(method="none")}  # plain decoding, usable without a `drafters:` entry


def _one_load(entry: BaseModel) -> None:
    if entry.concurrency is not None and entry.rate is not None:  # type: ignore[attr-defined]
        fail("give concurrency (closed loop) or rate (open loop), not both", ("rate",), "key")


class Defaults(Section):
    """Values for matrix axes the matrix leaves out and include entries leave open, and run settings."""

    backend: Backend | None = None
    target: str | None = None
    drafter: str | None = None
    num_drafts: Gamma | None = None
    task: str | None = None
    policy: str | None = None
    concurrency: Concurrency | None = None
    rate: Rate | None = None
    seed: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0  # the store keeps it in a BIGINT
    warmup: Annotated[int, Field(ge=0)] = 0  # first conversations of a cell run but not measured
    repeats: Annotated[int, Field(ge=1)] = 1  # rounds: each cell once per round, interleaved, sampled anew at T > 0 (harness.runner)

    @model_validator(mode="after")
    def _check(self) -> Defaults:
        _one_load(self)
        return self


AXES = ("backend", "target", "drafter", "num_drafts", "task", "temperature", "concurrency", "rate", "policy")


class Combination(Section):
    """One `matrix.include` entry: values for some axes; the rest are filled in (see expand)."""

    backend: Backend | None = None
    target: str | None = None
    drafter: str | None = None
    num_drafts: Gamma | None = None
    task: str | None = None
    temperature: Temperature | None = None
    concurrency: Concurrency | None = None
    rate: Rate | None = None
    policy: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Combination:
        if not self.model_fields_set:
            fail(f"an include entry names at least one axis ({', '.join(AXES)})")
        _one_load(self)
        return self


class ExcludeRule(Section):
    """One `matrix.exclude` rule: a combination matching every key given is dropped; a list matches any
    of its values. `method` matches the drafter's method."""

    backend: list[Backend] | None = None
    target: list[str] | None = None
    drafter: list[str] | None = None
    method: list[Annotated[str, _choice("drafter method", METHODS)]] | None = None
    num_drafts: list[Gamma] | None = None
    task: list[str] | None = None
    temperature: list[Temperature] | None = None
    concurrency: list[Concurrency] | None = None
    rate: list[Rate] | None = None
    policy: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _lists(cls, data: Any) -> Any:
        return _as_lists(data, tuple(cls.model_fields))

    @model_validator(mode="after")
    def _check(self) -> ExcludeRule:
        if not self.model_fields_set:
            fail("an exclude rule names at least one axis (an empty rule would drop every cell)")
        return self


def _non_empty(values: list[Any]) -> list[Any]:
    if not values:
        fail("must not be empty (leave the axis out to use defaults)")
    return values


class Matrix(Section):
    """The axes whose product is the suite's cells; concurrency and rate together form one load axis."""

    backend: Annotated[list[Backend], AfterValidator(_non_empty)] | None = None
    target: Annotated[list[str], AfterValidator(_non_empty)] | None = None
    drafter: Annotated[list[str], AfterValidator(_non_empty)] | None = None
    num_drafts: Annotated[list[Gamma], AfterValidator(_non_empty)] | None = None
    task: Annotated[list[str], AfterValidator(_non_empty)] | None = None
    temperature: Annotated[list[Temperature], AfterValidator(_non_empty)] | None = None
    concurrency: Annotated[list[Concurrency], AfterValidator(_non_empty)] | None = None
    rate: Annotated[list[Rate], AfterValidator(_non_empty)] | None = None
    policy: Annotated[list[str], AfterValidator(_non_empty)] | None = None
    include: list[Combination] = []
    exclude: list[ExcludeRule] = []

    @model_validator(mode="before")
    @classmethod
    def _lists(cls, data: Any) -> Any:
        return _as_lists(data, AXES)


class SLA(Section):
    """harness.metrics.SLA as the suite writes it: the same fields, checked (a test keeps them equal)."""

    ttft_s: Annotated[float, Field(gt=0)] | None = None
    tpot_s: Annotated[float, Field(gt=0)] | None = None
    min_user_tokens_per_s: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _check(self) -> SLA:
        if self.ttft_s is None and self.tpot_s is None and self.min_user_tokens_per_s is None:
            fail("an sla sets ttft_s, tpot_s and/or min_user_tokens_per_s (leave sla out for none)")
        return self


def _default(cls: type, name: str) -> Any:
    """A contract dataclass's own default, so the suite never disagrees with the gate about it."""
    for f in fields(cls):
        if f.name == name and f.default is not MISSING:
            return f.default
    raise KeyError(name)


class GateEntry(Section):
    """harness.gate.rules.GateRule less its metric (the key under `gates:`); defaults are GateRule's."""

    direction: Annotated[str, _choice("direction", DIRECTIONS)]
    test: Annotated[str, _choice("test", TESTS)] = _default(GateRule, "test")
    relative: Annotated[float, Field(ge=0)] | None = _default(GateRule, "relative")
    absolute: Annotated[float, Field(ge=0)] | None = _default(GateRule, "absolute")
    min_effect: Annotated[float, Field(ge=0)] = _default(GateRule, "min_effect")
    min_samples: Annotated[int, Field(ge=1)] = _default(GateRule, "min_samples")
    alpha: Annotated[float, Field(gt=0, lt=1)] = _default(GateRule, "alpha")
    level: Annotated[str, _choice("level", LEVELS)] = _default(GateRule, "level")
    resamples: Annotated[int, Field(ge=1)] = _default(GateRule, "resamples")


class ValidityEntry(Section):
    min_requests: Annotated[int, Field(ge=0)] = _default(Validity, "min_requests")
    min_duration_s: Annotated[float, Field(ge=0)] = _default(Validity, "min_duration_s")
    max_failed_fraction: Annotated[float, Field(ge=0, le=1)] = _default(Validity, "max_failed_fraction")


def _option_values(options: dict[str, Any]) -> dict[str, Any]:
    scalar = (str, int, float, bool, type(None))
    for key, value in options.items():
        ok = isinstance(value, scalar) or (isinstance(value, list) and all(isinstance(v, scalar) for v in value))
        if not ok:
            fail(f"a backend option is a scalar or a list of scalars, got {show(value)}", (key,))
    return options


class ResourcesEntry(Section):
    """What one cell of a backend reserves (harness.executors: Ray schedules by it; cost = wall time × it).
    Not part of a cell's id: it says where a cell runs, not what it measures. Unset: 1 CPU, no GPU."""

    num_cpus: Annotated[float, Field(ge=0)] | None = None
    num_gpus: Annotated[float, Field(ge=0)] | None = None
    memory_gb: Annotated[float, Field(gt=0)] | None = None  # Ray schedules on it; not costed


class Limits(Section):
    """Ceilings on what a cell may ask of a machine, checked at load (harness.suite.limits): a typo such
    as `max_new_tokens: 1000000000` or `concurrency: [100000]` must not allocate hundreds of GB. A suite
    that really needs more raises the ceiling here, in the file, where a reviewer sees it."""

    n_samples: Annotated[int, Field(ge=1, le=INT32_MAX)] = 100_000  # per task
    max_new_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] = 32_768  # per generated turn
    concurrency: Annotated[int, Field(ge=1, le=INT32_MAX)] = 4_096  # requests in flight
    rate: Annotated[float, Field(gt=0, le=1e9)] = 10_000.0  # requests/s, open loop
    repeats: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1_000
    warmup: Annotated[int, Field(ge=0, le=INT32_MAX)] = 10_000
    resamples: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1_000_000  # per gate (bootstrap)
    cells: Annotated[int, Field(ge=1, le=INT32_MAX)] = 10_000  # combinations before exclude


class SuiteDoc(Section):
    """A whole suite document, includes merged."""

    version: Annotated[int, Field(ge=1, le=SUITE_VERSION)]
    name: Name
    description: str = ""
    defaults: Defaults = Defaults()
    targets: dict[Name, TargetEntry] = {}
    drafters: dict[Name, DrafterEntry] = {}
    tasks: dict[Name, TaskEntry] = {}
    policies: dict[Name, PolicyEntry] = {}
    matrix: Matrix
    sla: SLA | None = None
    validity: ValidityEntry = ValidityEntry()
    gates: dict[Metric, GateEntry] = {}
    backend_options: dict[Backend, Annotated[dict[str, Any], AfterValidator(_option_values)]] = {}
    resources: dict[Backend, ResourcesEntry] = {}  # per backend; absent: the hash is as without the field
    limits: Limits = Limits()  # absent: the hash is as without the field


def drafters_of(drafters: dict[str, DrafterEntry]) -> dict[str, DrafterEntry]:
    """The drafters a matrix may name: the built-in `none`, then the defined ones (which may redefine it)."""
    return {**BUILTIN_DRAFTERS, **drafters}


def policies_of(policies: dict[str, PolicyEntry]) -> dict[str, PolicyEntry]:
    """The policies a matrix may name: built-ins full/scheduler/budget, then the defined ones."""
    return {**BUILTIN_POLICIES, **policies}


def validate(data: dict[str, Any], locations: Locations) -> SuiteDoc:
    """The document as a SuiteDoc, or the first problem as a SuiteError at its line (every missing
    required key, when keys are missing: one line each)."""
    try:
        return SuiteDoc.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        missing = [err for err in errors if err["type"] == "missing"]
        if len(missing) < 2:
            raise schema_error(errors[0], locations) from None
        # every missing required key at once, one line each: a first suite should not take one attempt per key
        first, *rest = [schema_error(err, locations) for err in missing]
        raise SuiteError("".join([first.message, *(f"\n{other}" for other in rest)]), mark=first.mark,
                         path=first.path) from None


_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "dict_type": "a mapping",
    "model_type": "a mapping", "model_attributes_type": "a mapping", "list_type": "a list",
}
_BOUNDS = {
    "greater_than_equal": ("at least", "ge"), "greater_than": ("greater than", "gt"),
    "less_than_equal": ("at most", "le"), "less_than": ("less than", "lt"),
}


def schema_error(error: ErrorDetails, locations: Locations) -> SuiteError:
    """One pydantic error as a SuiteError at the line of the key or value it is about."""
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    path: DocPath = tuple(error["loc"])
    at = "value"
    if path and path[-1] == "[key]":  # a mapping key failed (e.g. a drafter name with a space)
        path, at = path[:-1], "key"
    if kind == "unknown_key":
        key, valid = ctx["key"], [str(v) for v in ctx["valid"]]
        hint = did_you_mean(key, valid) or f"; valid keys: {', '.join(valid)}"
        return locations.error((*path, key), f"unknown key {show(key)}{hint}", at="key")
    if kind == "suite":
        return locations.error((*path, *ctx["at"]), ctx["message"], at="key" if at == "key" else ctx["mark"])
    if kind == "missing":
        hint = f" (the suite format version; this harness reads {SUITE_VERSION})" if path == ("version",) else ""
        return locations.error(path[:-1], f"missing required key {path[-1]!r}{hint}", at="key")
    if kind == "extra_forbidden":
        return locations.error(path, f"unknown key {show(path[-1])}", at="key")
    if kind == "finite_number":
        return locations.error(path, f"must be a finite number, got {show(value)}", at=at)
    if kind in _EXPECTED:
        return locations.error(path, f"expected {_EXPECTED[kind]}, got {show(value)}", at=at)
    if kind in _BOUNDS:
        word, bound = _BOUNDS[kind]
        return locations.error(path, f"must be {word} {ctx[bound]}, got {show(value)}", at=at)
    return locations.error(path, f"{error['msg']}, got {show(value)}", at=at)
