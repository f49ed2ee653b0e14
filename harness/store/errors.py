"""`StoreError`: every failure of the store a user can act on, as one line that says what to do.

DuckDB's own errors are multi-line (a caret diagram, a "Did you mean") and name its internals; the
harness prints `StoreError`s as they are, so each one names the file and the next step instead.
"""

from __future__ import annotations


class StoreError(Exception):
    """A result store cannot be opened, migrated, written or queried; the message is one line."""


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (DuckDB puts the gist there)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
