"""The audit log: one append-only table, written inside the caller's transaction.

Pure SQL helpers taking a connection; callers run them inside ``Store.write`` together with
the change they record, so the change and its row commit together (THREATS.md G1).

Keyset pagination: ``id < before ORDER BY id DESC LIMIT n`` walks the primary key (and
``audit_user_id`` for a per-user view), so a deep page costs the same as the first one with
millions of rows. There is no OFFSET anywhere.

Decision names written by this module's callers:

- kind ``auth``: ``login``, ``login_failed``, ``logout``
- kind ``admin``: ``impersonate_start``, ``impersonate_stop`` (attributed to the target user,
  detail names both parties), ``profile_*`` actions (see docs/api.md)
- kind ``egress``: ``allow`` and the denial reasons of the egress proxy
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, Literal

from svcgate.clock import now_iso

Kind = Literal["egress", "auth", "admin"]
KINDS: tuple[Kind, ...] = ("egress", "auth", "admin")
MAX_PAGE = 200
DEFAULT_PAGE = 50
_DETAIL_MAX = 1024


def record(
    conn: sqlite3.Connection,
    *,
    kind: Kind,
    decision: str,
    user_id: int = 0,
    profile_id: int = 0,
    server: str = "",
    host: str = "",
    detail: str = "",
) -> int:
    """Append one event; return its id. Must be called inside a write transaction."""
    if kind not in KINDS:
        raise ValueError(f"unknown audit kind {kind!r}")
    cur = conn.execute(
        "INSERT INTO audit (ts, kind, user_id, profile_id, server, host, decision, detail)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (now_iso(), kind, user_id, profile_id, server, host, decision, detail[:_DETAIL_MAX]),
    )
    assert cur.lastrowid is not None
    return cur.lastrowid


@dataclass(frozen=True)
class AuditQuery:
    """A validated page request. ``user_id`` None means every user's events."""

    before: int | None
    limit: int
    user_id: int | None


def page_sql(query: AuditQuery) -> tuple[str, tuple[Any, ...]]:
    """The page query and its parameters (one extra row tells whether another page exists)."""
    clauses: list[str] = []
    params: list[Any] = []
    if query.user_id is not None:
        clauses.append("user_id = ?")
        params.append(query.user_id)
    if query.before is not None:
        clauses.append("id < ?")
        params.append(query.before)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    sql = (
        "SELECT id, ts, kind, user_id, profile_id, server, host, decision, detail FROM audit"
        f" {where} ORDER BY id DESC LIMIT ?"
    )
    return sql, (*params, query.limit + 1)


def page(conn: sqlite3.Connection, query: AuditQuery) -> dict[str, Any]:
    """Return ``{"events": [...], "next_before": int}``; ``next_before`` is 0 on the last page."""
    rows = conn.execute(*page_sql(query)).fetchall()
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    events = [dict(row) for row in rows]
    return {"events": events, "next_before": events[-1]["id"] if more and events else 0}
