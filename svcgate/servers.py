"""The server catalogue: installed servers, and the legacy ``echo`` fallback.

A server without a manifest is the legacy fallback selected by ``SVC_ECHO_BIN``: when the
setting is present the ``echo`` row exists (created idempotently at every start). Unsetting
the variable later does not delete the row or its profile assignments; such a server is
skipped at spawn with a log line.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from typing import Any

from svcgate.clock import now_iso

LEGACY_SERVER = "echo"
SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


def list_servers(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT id, name FROM servers ORDER BY name").fetchall()
    return [{"id": row["id"], "name": row["name"]} for row in rows]


def ensure_server_rows(conn: sqlite3.Connection, names: Iterable[str]) -> None:
    """Record configured servers (legacy ``echo``, ``SVC_SERVERS_FILE``) in the catalogue."""
    now = now_iso()
    conn.executemany(
        "INSERT INTO servers (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
        [(name, now) for name in names],
    )


def installed_names(conn: sqlite3.Connection) -> list[str]:
    """Every installed server: the legacy endpoint's bundle."""
    return [row[0] for row in conn.execute("SELECT name FROM servers ORDER BY name")]


def profile_bundle(conn: sqlite3.Connection, profile_id: int) -> list[str]:
    """The server names assigned to a profile (installed or not), sorted."""
    rows = conn.execute(
        "SELECT s.name FROM profile_servers ps JOIN servers s ON s.id = ps.server_id"
        " WHERE ps.profile_id = ? ORDER BY s.name",
        (profile_id,),
    )
    return [row[0] for row in rows]
