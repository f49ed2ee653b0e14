"""`StoreError`: every failure of the store a user can act on, as one line that says what to do.

DuckDB's own errors are multi-line (a caret diagram, a "Did you mean") and name its internals; the
harness prints `StoreError`s as they are, so each one names the file and the next step instead.
"""

from __future__ import annotations

from typing import Any


class StoreError(Exception):
    """A result store cannot be opened, migrated, written or queried; the message is one line."""


def one_row(cursor: Any, what: str) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate, a setting, a pragma): a missing one means
    the store is not what it should be, and says so instead of failing on `None[0]`."""
    row = cursor.fetchone()
    if row is None:
        raise StoreError(f"{what}: the store returned no row (is it a harness store?)")
    return row


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (DuckDB puts the gist there)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
