"""The one error a suite raises, and the nearest-name hint that makes it actionable.

Every problem with a suite, from malformed YAML to a checkpoint that is not on disk, is a `SuiteError`
whose str() is a single line in the compiler style editors and CI logs link to:

    suites/x.yaml:12:5: drafters.dspark.methd: unknown key 'methd' (did you mean 'method'?)

The parts stay available as attributes, so tests and tools need not parse the line. A value is shown
quoted and cut short (`show`), and a whole line is capped (`MAX_LINE`), so a 1 MB field or an included
file that is no suite gives a line a terminal can hold, not the file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable

MAX_VALUE = 60  # characters of a value an error line quotes
MAX_LINE = 1000  # characters of a whole error line


@dataclass(frozen=True)
class Mark:
    """Where something is written: a file and a 1-based line and column."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class SuiteError(ValueError):
    """A suite cannot be loaded, expanded or run as written."""

    def __init__(self, message: str, *, mark: Mark | None = None, path: str = "") -> None:
        self.message = message
        self.mark = mark
        self.path = path  # dotted location inside the document, e.g. "drafters.dspark.method"
        prefix = "".join(f"{part}: " for part in (str(mark) if mark else "", clip(path, MAX_VALUE)) if part)
        line = prefix + message
        super().__init__(line if len(line) <= MAX_LINE else line[:MAX_LINE] + f"… ({len(line)} characters)")

    def __str__(self) -> str:
        return str(self.args[0])


def did_you_mean(word: Any, choices: Iterable[Any]) -> str:
    """' (did you mean 'x'?)' for the closest of `choices`, or '' when none is close."""
    names = [str(c) for c in choices]
    if len(str(word)) > 4 * MAX_VALUE:  # nothing long is a typo of a name, and difflib would be slow on it
        return ""
    close = difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def one_of(noun: str, value: Any, choices: Iterable[Any]) -> str:
    """"unknown <noun> 'x' (did you mean 'y'?); valid: a, b, c" — the message for a value outside a set."""
    names = [str(c) for c in choices]
    return f"unknown {noun} {show(value)}{did_you_mean(value, names)}; valid: {', '.join(names) or 'none'}"


def show(value: Any) -> str:
    """A value as the YAML author wrote it: strings quoted, true/false/null lower-case."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if len(value) <= MAX_VALUE else f"{value[:MAX_VALUE]!r}… ({len(value)} characters)"
    if isinstance(value, int) and abs(value) >= 10 ** MAX_VALUE:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)


def clip(text: str, limit: int) -> str:
    """`text`, cut to `limit` characters with an ellipsis."""
    return text if len(text) <= limit else text[:limit] + "…"
