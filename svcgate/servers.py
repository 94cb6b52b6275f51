"""The server catalogue: installed servers, and the legacy ``echo`` fallback.

A server without a manifest is the legacy fallback selected by ``SVC_ECHO_BIN``: when the
setting is present the ``echo`` row exists (created idempotently at every start). Unsetting
the variable later does not delete the row or its profile assignments; such a server is
skipped at spawn with a log line.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from svcgate.clock import now_iso

LEGACY_SERVER = "echo"
SERVER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


def list_servers(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT id, name FROM servers ORDER BY name").fetchall()
    return [{"id": row["id"], "name": row["name"]} for row in rows]


def ensure_legacy_server(conn: sqlite3.Connection) -> None:
    conn.execute(
        "INSERT INTO servers (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
        (LEGACY_SERVER, now_iso()),
    )
