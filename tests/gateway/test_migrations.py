"""Schema upgrades: every released schema version, with data, migrates to the current one and
keeps its data; a failing migration leaves the database exactly as it was; a daemon refuses a
database it cannot migrate with one line and exit status 1.

"Released schema version k" is the database ``MIGRATIONS[:k]`` produces (migrations are never
edited once released, see svcgate/migrations.py), filled with rows through plain SQL the way
that release wrote them.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx2
import pytest
from data_plane_support import stage_servers
from gateway_support import ACCEPT, INIT, start_gateway
from process_support import public_tmpdir

from devidp.provider import DevIdP
from svcgate.migrations import MIGRATIONS
from svcgate.store import MigrationError, StoreOpenError, migrate, open_store, statements
from svcgate.tokens import sha256_hex

SESSION = "migration-test-session-0123456789abcdef"
PROFILE_TOKEN = "svc_migration-test-profile-token-0123456789abcdef"


def _fill_v1(conn: sqlite3.Connection) -> None:
    """Rows of every table schema version 1 has, as release 1 wrote them."""
    now = time.time()
    conn.executescript(
        """
        INSERT INTO users (id, issuer, subject, email, display_name, role, created_at, updated_at)
          VALUES (1, 'http://idp.invalid', 'alice-sub', 'alice@example.com', 'Alice', 'admin',
                  '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z'),
                 (2, 'http://idp.invalid', 'bob-sub', 'bob@example.com', 'Bob', 'user',
                  '2026-01-02T00:00:00Z', '2026-01-02T00:00:00Z');
        INSERT INTO servers (id, name, created_at) VALUES (1, 'echo', '2026-01-01T00:00:00Z');
        INSERT INTO audit (ts, kind, user_id, profile_id, server, host, decision, detail)
          VALUES ('2026-01-01T00:00:01Z', 'auth', 1, 0, '', '', 'login', ''),
                 ('2026-01-01T00:00:02Z', 'admin', 1, 1, '', '', 'profile_create', 'slug=alpha'),
                 ('2026-01-01T00:00:03Z', 'egress', 2, 1, 'echo', 'api.example.com', 'allow', '');
        """
    )
    conn.execute(
        "INSERT INTO sessions (token_hash, user_id, created_at, expires_at) VALUES (?, 1, ?, ?)",
        (sha256_hex(SESSION), now, now + 3600),
    )
    conn.execute(
        "INSERT INTO profiles (id, slug, name, user_id, token_hash, created_at, updated_at)"
        " VALUES (1, 'alpha', 'Alpha', 1, ?, '2026-01-01T00:00:02Z', '2026-01-01T00:00:02Z')",
        (sha256_hex(PROFILE_TOKEN),),
    )
    conn.execute("INSERT INTO profile_servers (profile_id, server_id) VALUES (1, 1)")


def _fill_v2(conn: sqlite3.Connection) -> None:
    conn.execute(
        "INSERT INTO credentials (user_id, server, ciphertext, wrapped_dek, kek_version,"
        " inject_header, inject_format, placeholder, allowed_hosts, created_at, updated_at)"
        " VALUES (2, 'echo', x'00', x'01', 1, 'Authorization', 'Bearer {secret}', NULL,"
        " '[\"api.example.com\"]', '2026-01-03T00:00:00Z', '2026-01-03T00:00:00Z')"
    )


def _fill_v3(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO servers (id, name, created_at) VALUES (2, 'notes', 't')")
    conn.execute(
        "INSERT INTO installed_servers (server_id, version, image, image_digest, manifest,"
        " runtime, index_version, installed_at, updated_at) VALUES (2, '1.0.0',"
        " 'registry.invalid/notes', 'sha256:00', '{}', '{}', 7, 't', 't')"
    )
    conn.execute(
        "INSERT INTO registry_state (id, version, sha256, expires, accepted_at)"
        " VALUES (1, 7, 'ab', '2027-01-01T00:00:00Z', '2026-01-04T00:00:00Z')"
    )


FILLERS = {1: _fill_v1, 2: _fill_v2, 3: _fill_v3}


def database_at(path: Path, version: int) -> Path:
    """A database at released schema ``version`` holding rows in every table it has."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for step in range(1, version + 1):
            migrate(conn, MIGRATIONS[:step])
            FILLERS[step](conn)
    finally:
        conn.close()
    return path


def tables(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every user table's rows, in rowid/primary-key order."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        return {
            name: conn.execute(f'SELECT * FROM "{name}" ORDER BY 1').fetchall() for name in names
        }
    finally:
        conn.close()


def dump(path: Path) -> tuple[int, list[str]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0], list(conn.iterdump())
    finally:
        conn.close()


def test_every_migration_splits_into_complete_statements() -> None:
    for script in MIGRATIONS:
        parts = statements(script)
        assert parts and all(sqlite3.complete_statement(p) for p in parts)
        assert " ".join(parts).split() == script.split()


def test_every_filler_covers_every_table_its_version_adds(tmp_path: Path) -> None:
    assert set(FILLERS) == set(range(1, len(MIGRATIONS) + 1)), "add a filler for the new schema"
    for version in FILLERS:
        rows = tables(database_at(tmp_path / f"v{version}.db", version))
        # A table no filler writes would go through the upgrade tests untested.
        assert [name for name, content in rows.items() if not content] == []


@pytest.mark.parametrize("version", range(1, len(MIGRATIONS)))
async def test_a_released_schema_with_data_migrates_and_keeps_every_row(
    tmp_path: Path, version: int
) -> None:
    db = database_at(tmp_path / "svcgate.db", version)
    before = tables(db)
    async with open_store(db) as store:
        after_version = await store.read(lambda c: c.execute("PRAGMA user_version").fetchone()[0])
        checks = await store.read(
            lambda c: (
                c.execute("PRAGMA integrity_check").fetchone()[0],
                c.execute("PRAGMA foreign_key_check").fetchall(),
            )
        )
    assert after_version == len(MIGRATIONS)
    assert checks == ("ok", [])
    after = tables(db)
    for name, rows in before.items():
        assert after[name] == rows, f"table {name} changed during the upgrade"
    # Opening again applies nothing.
    async with open_store(db):
        pass
    assert tables(db) == after


BAD = """
    CREATE TABLE half_done (id INTEGER PRIMARY KEY);
    UPDATE users SET email = 'overwritten';
    DELETE FROM audit;
    INSERT INTO no_such_table VALUES (1);
"""


@pytest.mark.parametrize("version", [1, len(MIGRATIONS)])
def test_a_failing_migration_leaves_the_database_untouched(tmp_path: Path, version: int) -> None:
    db = database_at(tmp_path / "svcgate.db", version)
    before = dump(db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        with pytest.raises(MigrationError) as caught:
            migrate(conn, (*MIGRATIONS, BAD))
        assert conn.in_transaction is False
    finally:
        conn.close()
    message = str(caught.value)
    assert f"migration {len(MIGRATIONS) + 1} failed" in message
    assert f"unchanged at schema version {version}" in message
    assert "\n" not in message
    # Earlier pending migrations in the same run are rolled back too.
    assert dump(db) == before


def test_a_newer_database_is_refused_and_not_touched(tmp_path: Path) -> None:
    db = database_at(tmp_path / "svcgate.db", len(MIGRATIONS))
    before = dump(db)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        with pytest.raises(MigrationError, match="newer than this svcgate"):
            migrate(conn, MIGRATIONS[:1])
    finally:
        conn.close()
    assert dump(db) == before


async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "svcgate.db"
    db.write_bytes(b"this is not an SQLite database" * 100)
    with pytest.raises(StoreOpenError, match="cannot open"):
        async with open_store(db):
            pass


@pytest.fixture
def v1_data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    database_at(data / "svcgate.db", 1)
    return data


@pytest.mark.root
def test_a_daemon_upgrades_the_first_schema_and_serves_its_data(
    tmp_path: Path, v1_data_dir: Path, idp: DevIdP
) -> None:
    stage = public_tmpdir("migrate")
    stage_servers(stage)  # the real echo server, runnable by the sandbox uid
    gw = start_gateway(
        tmp_path,
        idp=idp,
        data_dir=v1_data_dir,
        extra_env={
            "SVC_ECHO_BIN": str(stage / "echo_server.py"),
            "SVC_SANDBOX_DIR": str(public_tmpdir("migrate-sb") / "state"),
        },
    )
    try:
        with gw.client(headers={"Cookie": f"svc_session={SESSION}"}) as client:
            me = client.get("/api/me")
            assert me.status_code == 200, me.text
            assert me.json()["user"]["email"] == "alice@example.com"
            profiles = client.get("/api/profiles")
            assert profiles.status_code == 200, profiles.text
            (profile,) = profiles.json()
            assert (profile["slug"], profile["servers"]) == ("alpha", ["echo"])
            audit_page = client.get("/api/audit")
            assert audit_page.status_code == 200, audit_page.text
            decisions = [e["decision"] for e in audit_page.json()["events"]]
            assert {"login", "profile_create", "allow"} <= set(decisions)
        # The profile's token, stored by release 1, still opens its endpoint, whose bundle
        # (the echo server, in its sandbox) starts.
        response = httpx2.post(
            f"{gw.url}/mcp/p/alpha",
            headers={
                "Authorization": f"Bearer {PROFILE_TOKEN}",
                "Accept": ACCEPT,
                "Content-Type": "application/json",
            },
            json=INIT,
            timeout=20.0,
        )
        assert response.status_code == 200, response.text
    finally:
        assert gw.stop() == 0
    assert dump(v1_data_dir / "svcgate.db")[0] == len(MIGRATIONS)


@pytest.mark.root
def test_a_daemon_refuses_a_newer_database_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = database_at(data / "svcgate.db", len(MIGRATIONS))
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    before = dump(db)
    gw = start_gateway(tmp_path, idp=None, data_dir=data, expect_ready=False)
    code = gw.proc.wait(timeout=30)
    gw.stop()
    log = gw.log_text()
    assert code == 1, log
    assert "Traceback" not in log
    (line,) = [x for x in log.splitlines() if x.startswith("svcgate: ")]
    assert "newer than this svcgate" in line and "restore a backup" in line
    assert dump(db) == before


@pytest.mark.root
def test_under_json_logs_the_refusal_is_one_json_object(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    db = database_at(data / "svcgate.db", len(MIGRATIONS))
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    gw = start_gateway(
        tmp_path, idp=None, data_dir=data, expect_ready=False, extra_env={"SVC_LOG_FORMAT": "json"}
    )
    code = gw.proc.wait(timeout=30)
    gw.stop()
    lines = gw.log_text().splitlines()
    assert code == 1
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    (fatal,) = [r for r in records if r["level"] == "CRITICAL"]
    assert fatal["msg"].startswith("database: ") and "newer than this svcgate" in fatal["msg"]
