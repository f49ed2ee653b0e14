"""How a suite's `backend_options` become a server backend's argv and interpreter (vLLM, SGLang, ours).

Shared by the server backends only; the harness never needs it, so it lives among them, not in `contracts`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping


def option_flags(options: dict, skip=()) -> list[str]:
    """A suite's server options as flags, sorted by name: `key: v` → `--key v`, `True` → a bare flag,
    a list → the flag then its values, `False`/None → left out; keys in `skip` are the adapter's own."""
    flags: list[str] = []
    for key, value in sorted(options.items()):
        if key in skip:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *[str(v) for v in value]]
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


def interpreter(options: Mapping[str, Any] | None = None) -> str | None:
    """The engine interpreter a server backend's options name: $<python_env> when that is set, else `python`;
    None: this one."""
    options = options or {}
    name = options.get("python_env")
    return (os.environ.get(str(name)) if name else None) or (str(options["python"]) if options.get("python") else None)
