"""Opening a store file: DuckDB's open errors as one-line `StoreError`s, then the schema check.

Why a module of its own: every entry point (the runner writing, `harness query` reading, an import of a
baseline) opens the same file the same way, and each failure has one fix a user can act on — a
missing file (run a suite first), a lock held by another process (wait for it, or query a copy),
a newer schema (update the code). DuckDB allows one writing process per file, and a writer excludes
readers in other processes too.

Why read-only connections are sandboxed: they run user SQL (`harness query`, `history --where`) and
back every read path (report, history, compare, gate). DuckDB's own settings make the sandbox — no
file or network beyond the store (`enable_external_access=false`: COPY TO, EXPORT DATABASE, read_csv,
read_text, glob, ATTACH, INSTALL and LOAD are refused), no extension installed or loaded on demand, and
the configuration locked so no statement can turn these back on. `harness export` is the deliberate
way to write files: it asks for `sandbox=False`. Writable connections never run user SQL.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb

from harness.store.errors import StoreError, one_line, one_row
from harness.store.migrations import migrate

DEFAULT_PATH = Path("results/harness.duckdb")
MEMORY = ":memory:"


# Given at connect: extensions are never fetched nor loaded on demand (the JSON functions are built in).
_NO_EXTENSIONS = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                  "allow_community_extensions": False}
# Set once the store is open (the file itself must still be opened), then locked.
_SANDBOX = ("SET enable_external_access = false", "SET lock_configuration = true")


def connect(path: str | Path = DEFAULT_PATH, *, read_only: bool = False,
            sandbox: bool | None = None) -> duckdb.DuckDBPyConnection:
    """A connection to a migrated store: writable ones are created (with their folder) and migrated,
    read-only ones must exist at the current schema version. `":memory:"` is a fresh in-memory store.
    `sandbox` (default: `read_only`): no file, network or extension beyond the store, settings locked."""
    sandbox = read_only if sandbox is None else sandbox
    memory = str(path) == MEMORY
    if memory and read_only:
        raise StoreError("an in-memory store cannot be opened read-only (it would be empty)")
    name = str(path)
    if not memory:
        file = Path(path)
        if read_only and not file.exists():
            raise StoreError(f"no result store at {file}: run a suite first (`harness run`) or point --db at one")
        if not read_only:
            file.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(name, read_only=read_only, config=dict(_NO_EXTENSIONS))
    except duckdb.Error as exc:
        raise _open_error(path, exc, read_only) from exc
    try:
        if not memory:
            _check_intact(con, Path(path), verify_blocks=not read_only)
        migrate(con, read_only=read_only, name=name)
        # A second connection to a file this process holds open shares its (already locked) settings.
        if sandbox and not one_row(con.execute("SELECT current_setting('lock_configuration')"), name)[0]:
            for statement in _SANDBOX:
                con.execute(statement)
    except duckdb.Error as exc:
        con.close()
        raise damaged(path, exc) from exc
    except BaseException:
        con.close()
        raise
    return con


# A DuckDB file is its headers (one file header and two database headers of 4 KiB) then whole blocks.
_HEADER_BYTES = 3 * 4096
_DAMAGE = ("Corrupt database file", "Could not read enough bytes", "checksum", "Invalid block")


def _check_intact(con: duckdb.DuckDBPyConnection, path: Path, *, verify_blocks: bool) -> None:
    """Refuse a store that lost its tail (cheap: the headers say how many blocks the file holds) and,
    before a writer appends, one whose blocks do not match their checksums (DuckDB verifies a block's
    checksum whenever it reads it; a scan of every column reads them all, ~0.1 s per 4 MB)."""
    block_size, total_blocks, free_blocks = one_row(con.execute(
        "SELECT block_size, total_blocks, free_blocks FROM pragma_database_size()"
        " WHERE database_name = current_database()"
    ), str(path))
    # Whole blocks after the headers; free blocks at the end need not exist on disk (DuckDB does not write
    # them), so the file must hold at least the used ones: a cut inside a block, or past the used blocks,
    # is damage (a cut between used blocks is found when the block is read, or by the writer's scan below).
    size, block_size = path.stat().st_size, int(block_size)
    at_least = _HEADER_BYTES + (int(total_blocks) - int(free_blocks)) * block_size
    replayed = Path(f"{path}.wal").exists()  # a write-ahead log replayed at open may count blocks not yet written
    if not replayed and (size < at_least or (size > _HEADER_BYTES and (size - _HEADER_BYTES) % block_size)):
        expected = _HEADER_BYTES + int(total_blocks) * block_size
        raise StoreError(f"{path} is damaged: truncated to {size} of its {expected} bytes; restore it from a copy "
                         f"or point --db at another store (nothing was read or written)")
    if verify_blocks and total_blocks:
        tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
                             " AND schema_name = 'main'").fetchall()
        for (table,) in tables:
            con.execute(f'SELECT sum(hash(COLUMNS(*))) FROM "{table}"').fetchall()


def damaged(path, exc: BaseException) -> StoreError:
    """The one line for a DuckDB error met while reading a store: 'damaged' when it is the file's fault."""
    if isinstance(exc, StoreError):
        return exc
    message = one_line(exc)
    if any(needle in message for needle in _DAMAGE):
        return StoreError(f"{path} is damaged ({message}); restore it from a copy or point --db at another store "
                          f"(nothing was written)")
    return StoreError(f"cannot read {path}: {message}")


def _open_error(path, exc: duckdb.Error, read_only: bool) -> StoreError:
    message = str(exc)
    if "Could not set lock" in message:
        pid = re.search(r"PID (\d+)", message)
        holder = f"process {pid.group(1)}" if pid else "another process"
        return StoreError(
            f"{path} is locked by {holder} (a running suite?): wait for it to finish, or query a copy "
            f"(cp {path} /tmp/snapshot.duckdb)"
        )
    if any(needle in message for needle in _DAMAGE):
        return damaged(path, exc)
    if "not a valid DuckDB database" in message:
        return StoreError(f"{path} is not a DuckDB database: point --db at a harness store")
    mode = "read-only" if read_only else "writable"
    return StoreError(f"cannot open {path} ({mode}): {one_line(exc)}")


_REFUSALS = (  # DuckDB's sandbox errors, as what the user asked for and what to do instead
    ("file system operations are disabled", "reaches a file, the network or an extension beyond the store"),
    ("Loading external extensions is disabled", "loads an extension"),
    ("the configuration has been locked", "changes a setting"),
)


def sandbox_refusal(message: str) -> str | None:
    """The one line for a statement the read-only sandbox refused, or None for any other error."""
    for needle, what in _REFUSALS:
        if needle in message:
            return (f"refused: the query {what}; read paths reach nothing beyond the store "
                    "(write files with `harness export` or `harness baseline export`)")
    return None
