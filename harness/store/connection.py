"""Opening a store file: DuckDB's open errors as one-line `StoreError`s, then the schema check.

Why a module of its own: every entry point (the runner writing, `harness query` reading, an import of a
baseline) opens the same file the same way, and each failure has one fix a user can act on — a
missing file (run a suite first), a lock held by another process (wait for it, or query a copy),
a newer schema (update the code). DuckDB allows one writing process per file, and a writer excludes
readers in other processes too.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from harness.store.errors import StoreError, one_line
from harness.store.migrations import migrate

DEFAULT_PATH = Path("results/harness.duckdb")
MEMORY = ":memory:"


def connect(path: str | Path = DEFAULT_PATH, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection to a migrated store: writable ones are created (with their folder) and migrated,
    read-only ones must exist at the current schema version. `":memory:"` is a fresh in-memory store."""
    memory = str(path) == MEMORY
    if memory and read_only:
        raise StoreError("an in-memory store cannot be opened read-only (it would be empty)")
    path = Path(path) if not memory else path
    if not memory:
        if read_only and not path.exists():
            raise StoreError(f"no result store at {path}: run a suite first (`harness run`) or point --db at one")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        raise _open_error(path, exc, read_only) from exc
    try:
        migrate(con, read_only=read_only, name=str(path))
    except BaseException:
        con.close()
        raise
    return con


def _open_error(path, exc: duckdb.Error, read_only: bool) -> StoreError:
    message = str(exc)
    if "Could not set lock" in message:
        pid = re.search(r"PID (\d+)", message)
        holder = f"process {pid.group(1)}" if pid else "another process"
        return StoreError(
            f"{path} is locked by {holder} (a running suite?): wait for it to finish, or query a copy "
            f"(cp {path} /tmp/snapshot.duckdb)"
        )
    if "not a valid DuckDB database" in message:
        return StoreError(f"{path} is not a DuckDB database: point --db at a harness store")
    mode = "read-only" if read_only else "writable"
    return StoreError(f"cannot open {path} ({mode}): {one_line(exc)}")
