"""Users, sessions and view-as state: SQL helpers that run inside the store's threads.

Every function takes a connection; mutating ones expect to run inside ``Store.write`` so their
audit rows commit with them. Only SHA-256 hashes of session tokens are stored.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from svcgate import audit
from svcgate.clock import now_epoch, now_iso
from svcgate.oidc import Identity
from svcgate.roles import Role
from svcgate.tokens import new_session_token, sha256_hex

IMPERSONATION_MAX_MINUTES = 60


@dataclass(frozen=True)
class User:
    id: int
    email: str
    display_name: str
    role: Role

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "email": self.email,
            "display_name": self.display_name,
            "role": self.role,
        }

    @classmethod
    def from_row(cls, row: sqlite3.Row, prefix: str = "") -> User:
        return cls(
            id=row[f"{prefix}id"],
            email=row[f"{prefix}email"],
            display_name=row[f"{prefix}display_name"],
            role=row[f"{prefix}role"],
        )


@dataclass(frozen=True)
class SessionInfo:
    """The caller of a control-plane request: the real user and, under view-as, the target."""

    token_hash: str
    real_user: User
    viewed_user: User | None
    impersonation_expires_at: float | None

    @property
    def user(self) -> User:
        """The effective user: the target while impersonating, else the real user."""
        return self.viewed_user or self.real_user

    @property
    def impersonating(self) -> bool:
        return self.viewed_user is not None


_USER_COLS = "id, email, display_name, role"


def upsert_user(conn: sqlite3.Connection, identity: Identity, role: Role) -> User:
    now = now_iso()
    row = conn.execute(
        "INSERT INTO users (issuer, subject, email, display_name, role, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (issuer, subject) DO UPDATE SET email = excluded.email,"
        " display_name = excluded.display_name, role = excluded.role,"
        " updated_at = excluded.updated_at"
        f" RETURNING {_USER_COLS}",
        (identity.issuer, identity.subject, identity.email, identity.display_name, role, now, now),
    ).fetchone()
    return User.from_row(row)


def create_session(conn: sqlite3.Connection, user_id: int, ttl: float) -> str:
    """Insert a session and return its plaintext token (shown once, in the cookie)."""
    token = new_session_token()
    now = now_epoch()
    conn.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,))
    conn.execute(
        "INSERT INTO sessions (token_hash, user_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
        (sha256_hex(token), user_id, now, now + ttl),
    )
    return token


def delete_session(conn: sqlite3.Connection, token_hash: str) -> bool:
    return conn.execute("DELETE FROM sessions WHERE token_hash = ?", (token_hash,)).rowcount > 0


def lookup_session(conn: sqlite3.Connection, token: str) -> SessionInfo | None:
    now = now_epoch()
    row = conn.execute(
        "SELECT s.token_hash, s.imp_expires_at,"
        " u.id, u.email, u.display_name, u.role,"
        " v.id AS v_id, v.email AS v_email, v.display_name AS v_display_name, v.role AS v_role"
        " FROM sessions s JOIN users u ON u.id = s.user_id"
        " LEFT JOIN users v ON v.id = s.imp_user_id AND s.imp_expires_at > ?"
        " WHERE s.token_hash = ? AND s.expires_at > ?",
        (now, sha256_hex(token), now),
    ).fetchone()
    if row is None:
        return None
    viewed = User.from_row(row, "v_") if row["v_id"] is not None else None
    return SessionInfo(
        token_hash=row["token_hash"],
        real_user=User.from_row(row),
        viewed_user=viewed,
        impersonation_expires_at=row["imp_expires_at"] if viewed else None,
    )


def get_user(conn: sqlite3.Connection, user_id: int) -> User | None:
    row = conn.execute(f"SELECT {_USER_COLS} FROM users WHERE id = ?", (user_id,)).fetchone()
    return User.from_row(row) if row else None


def list_users(conn: sqlite3.Connection) -> list[User]:
    rows = conn.execute(f"SELECT {_USER_COLS} FROM users ORDER BY id").fetchall()
    return [User.from_row(row) for row in rows]


def clamp_ttl_minutes(value: object) -> int:
    """SPEC: a TTL above 60 or invalid (not a positive integer) is clamped to 60."""
    if isinstance(value, bool) or not isinstance(value, int):
        return IMPERSONATION_MAX_MINUTES
    if value < 1 or value > IMPERSONATION_MAX_MINUTES:
        return IMPERSONATION_MAX_MINUTES
    return value


def party(user: User) -> str:
    return f"{user.id}:{user.email}" if user.email else str(user.id)


def start_impersonation(
    conn: sqlite3.Connection, session: SessionInfo, target: User, minutes: int
) -> None:
    conn.execute(
        "UPDATE sessions SET imp_user_id = ?, imp_expires_at = ? WHERE token_hash = ?",
        (target.id, now_epoch() + minutes * 60, session.token_hash),
    )
    audit.record(
        conn,
        kind="admin",
        decision="impersonate_start",
        user_id=target.id,
        detail=f"actor={party(session.real_user)} subject={party(target)} ttl={minutes}m",
    )


def stop_impersonation(conn: sqlite3.Connection, session: SessionInfo) -> None:
    conn.execute(
        "UPDATE sessions SET imp_user_id = NULL, imp_expires_at = NULL WHERE token_hash = ?",
        (session.token_hash,),
    )
    if session.viewed_user is not None:
        audit.record(
            conn,
            kind="admin",
            decision="impersonate_stop",
            user_id=session.viewed_user.id,
            detail=f"actor={party(session.real_user)} subject={party(session.viewed_user)}",
        )
