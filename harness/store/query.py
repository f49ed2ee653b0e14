"""`read_only_query`: what `harness query` runs — any SQL over a store that cannot change it.

Why read-only at the connection, not by inspecting the SQL: DuckDB then refuses every write (INSERT,
UPDATE, DROP, CREATE, a write hidden in a CTE or a second statement) itself, and the harness only turns
its refusal into a one-line message. The store must exist and be at this code's schema version, so
the views named in `VIEWS.md` are there. The connection is sandboxed (`harness.store.connection`): a
statement that would reach another file, the network or an extension (`COPY … TO`, `EXPORT DATABASE`,
`read_csv('/etc/passwd')`, `ATTACH`, `INSTALL`, `LOAD`) or change a setting is refused by DuckDB, and
the harness says so in one line; `harness export` is the deliberate way to write files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from harness.store.errors import StoreError
from harness.store.store import Store


def read_only_query(
    path: str | Path, sql: str, params: Sequence[Any] | dict | None = None
) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of `sql` over the store at `path`, opened read-only; StoreError on any
    failure, "… tried to write …" when the SQL would modify the store."""
    if not sql.strip():
        raise StoreError("empty query: give the SQL to run, e.g. \"SELECT * FROM v_runs\"")
    with Store.open(path, read_only=True) as store:
        return store.query(sql, params)
