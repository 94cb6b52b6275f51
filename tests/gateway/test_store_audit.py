"""The store and the audit table: migrations, transactions, query plans at scale."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from svcgate import audit
from svcgate.migrations import MIGRATIONS
from svcgate.store import MigrationError, StoreUnavailable, open_store


async def test_migrations_are_applied_once_and_recorded(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with open_store(db):
        pass
    async with open_store(db):
        pass
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(MigrationError, match="newer"):
        async with open_store(db):
            pass


async def test_a_failed_write_rolls_back_the_change_and_its_audit_row(tmp_path: Path) -> None:
    async with open_store(tmp_path / "s.db") as store:

        def change(conn: sqlite3.Connection) -> None:
            audit.record(conn, kind="admin", decision="profile_create", detail="slug=x")
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await store.write(change)
        count = await store.read(lambda c: c.execute("SELECT count(*) FROM audit").fetchone()[0])
        assert count == 0


async def test_disk_full_is_reported_as_unavailable_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "s.db") as store:

        def fill(conn: sqlite3.Connection) -> None:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
            for _ in range(200):
                audit.record(conn, kind="auth", decision="login", detail="x" * 1000)

        with pytest.raises(StoreUnavailable):
            await store.write(fill)
        count = await store.read(lambda c: c.execute("SELECT count(*) FROM audit").fetchone()[0])
        assert count == 0


async def test_concurrent_writers_serialise_without_busy_errors(tmp_path: Path) -> None:
    async with open_store(tmp_path / "s.db") as store:

        async def writer(n: int) -> None:
            for i in range(20):
                await store.write(
                    lambda conn, i=i: audit.record(conn, kind="auth", decision="login", user_id=n)
                )

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(writer, n)
        count = await store.read(lambda c: c.execute("SELECT count(*) FROM audit").fetchone()[0])
        assert count == 160


def _plan(conn: sqlite3.Connection, query: audit.AuditQuery) -> str:
    sql, params = audit.page_sql(query)
    rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
    return " | ".join(str(row[-1]) for row in rows)


@pytest.mark.parametrize(
    "query",
    [
        audit.AuditQuery(before=None, limit=50, user_id=None),
        audit.AuditQuery(before=500_000, limit=50, user_id=None),
        audit.AuditQuery(before=None, limit=50, user_id=7),
        audit.AuditQuery(before=500_000, limit=50, user_id=7),
    ],
)
async def test_audit_pages_use_an_index_and_never_sort(
    tmp_path: Path, query: audit.AuditQuery
) -> None:
    async with open_store(tmp_path / "s.db"):
        pass
    with sqlite3.connect(tmp_path / "s.db") as conn:
        plan = _plan(conn, query)
    assert "TEMP B-TREE" not in plan  # rows come out in id order: no sort of the table
    if query.user_id is not None:
        assert "audit_user_id" in plan


async def test_deep_pages_read_only_their_rows_with_many_events(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with open_store(db):
        pass
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO audit (ts, kind, user_id, decision) VALUES ('t', 'auth', ?, 'login')",
            ((i % 10,) for i in range(200_000)),
        )
    async with open_store(db) as store:
        page = await store.read(
            lambda c: audit.page(c, audit.AuditQuery(before=100, limit=50, user_id=None))
        )
        assert [e["id"] for e in page["events"]] == list(range(99, 49, -1))
        # The virtual-machine step count bounds the work independently of table size.
        for query in (
            audit.AuditQuery(before=None, limit=50, user_id=None),
            audit.AuditQuery(before=150_000, limit=50, user_id=None),
            audit.AuditQuery(before=None, limit=50, user_id=3),
            audit.AuditQuery(before=150_000, limit=50, user_id=3),
        ):
            steps: list[int] = []

            def count_steps(
                conn: sqlite3.Connection,
                query: audit.AuditQuery = query,
                steps: list[int] = steps,
            ) -> None:
                def tick() -> int:
                    steps.append(1)
                    return 0

                conn.set_progress_handler(tick, 100)
                try:
                    audit.page(conn, query)
                finally:
                    conn.set_progress_handler(None, 0)

            await store.read(count_steps)
            assert len(steps) < 100, query  # < 10,000 VM steps for 50 of 200,000 rows


async def test_database_files_are_private(tmp_path: Path) -> None:
    async with open_store(tmp_path / "s.db") as store:
        await store.write(lambda c: audit.record(c, kind="auth", decision="login"))
        for name in ("s.db", "s.db-wal", "s.db-shm"):
            assert ((tmp_path / name).stat().st_mode & 0o777) == 0o600, name
