"""The profile listing at the store level: the same objects as the detail route, by id, with
sorted bundles, in one query that scales with the number of profiles (no paging, SPEC)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from svcgate import profiles
from svcgate.store import open_store

SERVERS = ("zeta", "alpha", "mid")


def _seed(conn: sqlite3.Connection, count: int) -> None:
    conn.executemany(
        "INSERT INTO users (issuer, subject, role, created_at, updated_at)"
        " VALUES ('https://idp.test', ?, 'user', 't', 't')",
        [("u1",), ("u2",)],
    )
    conn.executemany(
        "INSERT INTO servers (name, created_at) VALUES (?, 't')", [(n,) for n in SERVERS]
    )
    for i in range(count):
        profile, _ = profiles.create_profile(conn, 1 + i % 2, f"Profile {i} é", f"p-{i:04d}")
        # Bundles of 0 to 3 servers, given unsorted.
        profiles.set_servers(conn, profile, list(SERVERS[: i % 4]), profile.user_id)


async def test_the_listing_is_every_visible_profile_as_its_detail_shows_it(
    tmp_path: Path,
) -> None:
    async with open_store(tmp_path / "s.db") as store:
        await store.write(lambda conn: _seed(conn, 12))

        def check(conn: sqlite3.Connection) -> None:
            for owner in (1, 2, None, 3):
                listed = profiles.list_public(conn, owner)
                ids = [
                    row[0]
                    for row in conn.execute(
                        "SELECT id FROM profiles WHERE ? IS NULL OR user_id = ? ORDER BY id",
                        (owner, owner),
                    )
                ]
                assert [p["id"] for p in listed] == ids
                assert listed == [profiles.get_profile(conn, pid, owner).public() for pid in ids]
            everyone = profiles.list_public(conn, None)
            assert {len(p["servers"]) for p in everyone} == {0, 1, 2, 3}
            assert all(p["servers"] == sorted(p["servers"]) for p in everyone)
            assert all("token" not in p for p in everyone)

        await store.read(check)


async def test_the_listing_binds_no_parameter_per_profile(tmp_path: Path) -> None:
    """More profiles than SQLite's bound-parameter limit (32,766 in many builds) still list:
    the query binds the owner only, never a list of every profile id."""
    async with open_store(tmp_path / "s.db") as store:
        await store.write(lambda conn: _seed(conn, 40))

        def listing(conn: sqlite3.Connection) -> int:
            old = conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 4)
            try:
                return len(profiles.list_public(conn, None)) + len(profiles.list_public(conn, 1))
            finally:
                conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, old)

        assert await store.read(listing) == 40 + 20


async def test_an_owners_listing_reads_through_the_owner_index(tmp_path: Path) -> None:
    async with open_store(tmp_path / "s.db"):
        pass
    with sqlite3.connect(tmp_path / "s.db") as conn:
        sql = profiles._LISTING.format(where="WHERE p.user_id = ?")
        plan = " | ".join(str(r[-1]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", (1,)))
    assert "profiles_user" in plan
    assert "SCAN p" not in plan
