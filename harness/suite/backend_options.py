"""`check_backend_options`: each backend's `backend_options` checked at load, by that backend's rules.

Why here and not in the backends: a backend reads its options when its first cell starts, so an unknown
key or a negative count used to fail every cell of the suite, one by one, after the other backends'
cells had run. The rules below mirror the adapters' own options (tests check the two agree): the
in-house engine and the OpenAI client take a closed set of typed keys; vLLM and SGLang take their
adapter's typed keys, and every other key is passed to the server as a flag (`key: v` → `--key v`),
which only the server can judge, so those need only be finite scalars or lists of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.suite.document import Locations
from harness.suite.errors import one_of, show


@dataclass(frozen=True)
class Option:
    """One typed option: its Python types, bounds for numbers, a closed set of values for strings."""

    types: tuple[type, ...]
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] = ()

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) and bool not in self.types or not isinstance(value, self.types):
            names = " or ".join({bool: "true/false", int: "an integer", float: "a number", str: "a string",
                                 list: "a list"}[t] for t in self.types)
            return f"expected {names}, got {show(value)}"
        if self.choices and value not in self.choices:
            return one_of("value", value, self.choices)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                return f"must be a finite number, got {show(value)}"
            if self.low is not None and value < self.low:
                return f"must be at least {self.low:g}, got {show(value)}"
            if self.high is not None and value > self.high:
                return f"must be at most {self.high:g}, got {show(value)}"
        return None


_STR, _BOOL = Option((str,)), Option((bool,))
_SECONDS = Option((int, float), low=1e-3, high=7 * 24 * 3600.0)
_PORT = Option((int,), low=1, high=65535)
_SERVER = {"python": _STR, "port": _PORT, "host": _STR, "env": Option((str, list)), "startup_timeout_s": _SECONDS,
           "log_path": _STR, "timeout_s": _SECONDS}

OPTIONS: dict[str, dict[str, Option]] = {
    "inhouse": {"device": _STR, "num_slots": Option((int,), low=1, high=4096),
                "max_context": Option((int,), low=16, high=1 << 20), "num_threads": Option((int,), low=1, high=1024)},
    "openai": {"base_url": _STR, "model": _STR, "api_key_env": _STR, "chat": _BOOL, "tokenizer": _STR,
               "timeout_s": _SECONDS, "logprobs": _BOOL, "metrics": _BOOL},
    "vllm": {**_SERVER, "python_env": _STR, "export_dir": _STR, "draft_layout": Option((str,), choices=("dspark", "dflash")),
             "dspark_draft_topk": Option((int,), low=1, high=1 << 20),
             "per_request_spec_decode_metrics": Option((str, bool), choices=("detailed", "summary", "none", False))},
    "sglang": dict(_SERVER),
}
PASSES_FLAGS = ("vllm", "sglang")  # other keys become server flags


def check_backend_options(backend_options: dict[str, dict[str, Any]], locations: Locations) -> None:
    """Raise a SuiteError at the first option its backend would refuse."""
    for backend, options in backend_options.items():
        known = OPTIONS.get(backend, {})
        for key, value in options.items():
            where = ("backend_options", backend, key)
            option = known.get(key)
            if option is None and backend not in PASSES_FLAGS:
                raise locations.error(where, f"{one_of(f'{backend} backend option', key, known)}", at="key")
            problem = option.problem(value) if option is not None else _flag_problem(value)
            if key == "env" and problem is None:
                entries = [value] if isinstance(value, str) else value
                bad = [e for e in entries if not isinstance(e, str) or "=" not in e]
                problem = f"env entries are NAME=value strings, got {show(bad[0])}" if bad else None
            if problem:
                raise locations.error(where, problem)


def _flag_problem(value: Any) -> str | None:
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, float) and not math.isfinite(item):
            return f"a server flag's value must be a finite number, got {show(item)}"
    return None
