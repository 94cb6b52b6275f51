"""SQLite state store: one writer connection, a small pool of readers, WAL.

Resource handling: :func:`open_store` is an async context manager that opens the database,
applies migrations (:func:`migrate`: forward-only, all pending ones in one transaction), and
closes every connection on exit. Writes go through one connection
behind ``CapacityLimiter(1)``; reads use a pool of read-only connections behind their own
limiter. Blocking sqlite calls always run in worker threads (DESIGN.md rule 5).

Error handling: a write function runs inside ``BEGIN IMMEDIATE`` ... ``COMMIT``; any exception
rolls the whole transaction back, so a change and the audit row that records it commit
together or not at all (THREATS.md G1). ``synchronous=FULL`` makes acknowledged writes
durable across power loss (G3); ``busy_timeout`` absorbs lock contention with an operator
CLI or backup (G4). Calls are not abandoned on cancellation: a transaction that started
finishes (commit or rollback) before the cancellation is delivered. A database that cannot be
opened or migrated raises :class:`StoreOpenError` (:class:`MigrationError` for a failed or
too-new schema) with one line for the operator, and is left untouched.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import trio

from svcgate.migrations import MIGRATIONS

T = TypeVar("T")

READERS = 4
BUSY_TIMEOUT_MS = 10_000


class StoreUnavailable(Exception):
    """The database refused a write (disk full, read-only, I/O error)."""


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA query_only = ON")
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.row_factory = sqlite3.Row
    return conn


class StoreOpenError(Exception):
    """The database cannot be opened; ``str()`` is one line for the operator."""


class MigrationError(StoreOpenError):
    """The schema cannot be brought up to date; the database is left as it was."""


def statements(script: str) -> list[str]:
    """Split a migration script into complete SQL statements (``sqlite3.complete_statement``)."""
    found: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            found.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement at the end of a migration: {pending!r}")
    return found


def migrate(conn: sqlite3.Connection, migrations: Sequence[str] = MIGRATIONS) -> int:
    """Apply pending migrations; return the resulting schema version.

    Forward-only: a database newer than ``migrations`` is refused. Every pending migration
    and the version bump run in **one** transaction, so a failing migration (at any step)
    rolls back to the version the database had: it is left exactly as it was.
    Raises :class:`MigrationError`.
    """
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    target = len(migrations)
    if version > target:
        raise MigrationError(
            f"the database has schema version {version}, newer than this svcgate's {target}:"
            " run the svcgate version that wrote it, or restore a backup taken before the upgrade"
        )
    if version == target:
        return target
    number = version
    conn.execute("BEGIN IMMEDIATE")
    try:
        for offset, script in enumerate(migrations[version:]):
            number = version + 1 + offset
            for statement in statements(script):
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {target}")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        conn.execute("ROLLBACK")
        raise MigrationError(
            f"schema migration {number} failed ({type(exc).__name__}: {exc}); the database"
            f" is unchanged at schema version {version}"
        ) from exc
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return target


class Store:
    """Async facade over SQLite. Create with :func:`open_store`."""

    def __init__(self, path: Path, writer: sqlite3.Connection) -> None:
        self.path = path
        self._writer = writer
        self._write_limiter = trio.CapacityLimiter(1)
        self._readers: list[sqlite3.Connection] = []
        self._read_limiter = trio.CapacityLimiter(READERS)

    def _run_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._writer
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in one write transaction; commit iff it returns."""
        try:
            return await trio.to_thread.run_sync(self._run_write, fn, limiter=self._write_limiter)
        except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            raise StoreUnavailable(type(exc).__name__) from exc

    def _run_read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._readers.pop() if self._readers else _connect(self.path, readonly=True)
        try:
            return fn(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._readers.append(conn)

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on a read-only connection (a consistent snapshot per statement)."""
        return await trio.to_thread.run_sync(self._run_read, fn, limiter=self._read_limiter)

    def close(self) -> None:
        for conn in self._readers:
            conn.close()
        self._readers.clear()
        self._writer.close()


@asynccontextmanager
async def open_store(path: Path) -> AsyncIterator[Store]:
    """Open (creating and migrating) the database at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # SQLite gives the -wal and -shm files the database file's mode: create it 0600 first.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)

    def _open() -> sqlite3.Connection:
        try:
            conn = _connect(path, readonly=False)
        except sqlite3.Error as exc:
            raise StoreOpenError(f"cannot open {path} ({exc})") from exc
        try:
            migrate(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreOpenError(f"cannot read the schema version of {path} ({exc})") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    writer = await trio.to_thread.run_sync(_open)
    store = Store(path, writer)
    try:
        yield store
    finally:
        store.close()
