"""Per-user, per-server API credentials: validation and storage (secrets sealed by the vault).

The secret never leaves this module in plaintext: :func:`read_stored` gives the egress proxy
the sealed blob with the injection settings, and the proxy opens it with the vault only when
a request is about to carry it. Listing returns metadata only.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from svcgate import audit
from svcgate.clock import now_iso
from svcgate.errors import Invalid
from svcgate.host_patterns import HostPatternError, normalize_pattern
from svcgate.vault import Sealed, Vault

SERVER_PARAM = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
HEADER = re.compile(r"^[A-Za-z0-9-]+$")
SECRET_MAX = 64 * 1024
_FORBIDDEN_CHARS = ("\r", "\n", "\x00")

# When a credential was last created, replaced or deleted in this process (monotonic clock):
# the egress proxy trusts no remembered read that started before it (svcgate.egress.service).
_last_change = 0.0


def mark_changed() -> None:
    """Call after a credential change has committed."""
    global _last_change  # one process-wide instant, written from the event loop
    _last_change = time.monotonic()


def last_change() -> float:
    return _last_change


@dataclass(frozen=True)
class CredentialInput:
    secret: str
    inject_header: str | None
    inject_format: str | None
    placeholder: str | None
    allowed_hosts: list[str]


def check_server_param(server: str) -> None:
    if SERVER_PARAM.fullmatch(server) is None:
        raise Invalid("server must match ^[a-z0-9][a-z0-9_-]{0,63}$")


def validate(
    secret: str,
    inject_header: str | None,
    inject_format: str | None,
    placeholder: str | None,
    allowed_hosts: list[str] | None,
) -> CredentialInput:
    """Check every SPEC constraint; raise Invalid naming the field (never echoing the secret)."""
    if not secret:
        raise Invalid("secret must not be empty")
    if len(secret.encode("utf-8")) > SECRET_MAX:
        raise Invalid("secret must be at most 64 KiB")
    if any(c in secret for c in _FORBIDDEN_CHARS):
        raise Invalid("secret must not contain CR, LF or NUL")
    if inject_header is not None and (
        len(inject_header) > 64 or HEADER.fullmatch(inject_header) is None
    ):
        raise Invalid("inject_header must be 1 to 64 characters of A-Z a-z 0-9 -")
    if inject_format is not None:
        if len(inject_format) > 256 or "{token}" not in inject_format:
            raise Invalid("inject_format must be at most 256 characters and contain {token}")
        if any(c in inject_format for c in _FORBIDDEN_CHARS):
            raise Invalid("inject_format must not contain CR, LF or NUL")
    if placeholder is not None:
        if not 8 <= len(placeholder) <= 256:
            raise Invalid("placeholder must be 8 to 256 characters")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in placeholder):
            raise Invalid("placeholder must not contain control characters")
    hosts = allowed_hosts or []
    if len(hosts) > 64:
        raise Invalid("allowed_hosts takes at most 64 entries")
    normalized: list[str] = []
    for host in hosts:
        if len(host) > 253:
            raise Invalid("each allowed_hosts entry must be at most 253 characters")
        try:
            pattern = normalize_pattern(host)
        except HostPatternError as exc:
            raise Invalid(f"allowed_hosts: {exc}") from exc
        if pattern not in normalized:
            normalized.append(pattern)
    return CredentialInput(secret, inject_header, inject_format, placeholder, normalized)


def _metadata(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "server": row["server"],
        "inject_header": row["inject_header"],
        "inject_format": row["inject_format"],
        "placeholder": row["placeholder"],
        "allowed_hosts": json.loads(row["allowed_hosts"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def list_metadata(conn: sqlite3.Connection, user_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT server, inject_header, inject_format, placeholder, allowed_hosts, created_at,"
        " updated_at FROM credentials WHERE user_id = ? ORDER BY server",
        (user_id,),
    ).fetchall()
    return [_metadata(row) for row in rows]


def upsert(
    conn: sqlite3.Connection, vault: Vault, user_id: int, server: str, data: CredentialInput
) -> bool:
    """Create or replace; return whether what sandboxes are given (the placeholder) changed."""
    sealed = vault.seal(user_id, server, data.secret.encode("utf-8"))
    now = now_iso()
    existed = conn.execute(
        "SELECT placeholder FROM credentials WHERE user_id = ? AND server = ?", (user_id, server)
    ).fetchone()
    conn.execute(
        "INSERT INTO credentials (user_id, server, ciphertext, wrapped_dek, kek_version,"
        " inject_header, inject_format, placeholder, allowed_hosts, created_at, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (user_id, server) DO UPDATE SET ciphertext = excluded.ciphertext,"
        " wrapped_dek = excluded.wrapped_dek, kek_version = excluded.kek_version,"
        " inject_header = excluded.inject_header, inject_format = excluded.inject_format,"
        " placeholder = excluded.placeholder, allowed_hosts = excluded.allowed_hosts,"
        " updated_at = excluded.updated_at",
        (
            user_id,
            server,
            sealed.ciphertext,
            sealed.wrapped_dek,
            sealed.kek_version,
            data.inject_header,
            data.inject_format,
            data.placeholder,
            json.dumps(data.allowed_hosts),
            now,
            now,
        ),
    )
    audit.record(
        conn,
        kind="admin",
        decision="credential_update" if existed else "credential_create",
        user_id=user_id,
        server=server,
        detail=f"hosts={len(data.allowed_hosts)}",
    )
    return existed is None or existed[0] != data.placeholder


def delete(conn: sqlite3.Connection, user_id: int, server: str) -> bool:
    """Delete (idempotent); return whether there was a credential."""
    gone = conn.execute(
        "DELETE FROM credentials WHERE user_id = ? AND server = ?", (user_id, server)
    ).rowcount
    if gone:
        audit.record(
            conn, kind="admin", decision="credential_delete", user_id=user_id, server=server
        )
    return bool(gone)


def profiles_using(conn: sqlite3.Connection, user_id: int, server: str) -> list[int]:
    """Ids of ``user_id``'s profiles whose bundle holds ``server``."""
    rows = conn.execute(
        "SELECT p.id FROM profiles p JOIN profile_servers ps ON ps.profile_id = p.id"
        " JOIN servers s ON s.id = ps.server_id WHERE p.user_id = ? AND s.name = ?",
        (user_id, server),
    ).fetchall()
    return [int(row[0]) for row in rows]


@dataclass(frozen=True)
class StoredCredential:
    """A credential row as the egress proxy needs it: injection settings and the sealed secret."""

    inject_header: str | None
    inject_format: str | None
    placeholder: str | None
    # Patterns as stored; a corrupt column reads as no host at all (fail closed).
    allowed_hosts: list[str]
    sealed: Sealed = field(repr=False)


def read_stored(conn: sqlite3.Connection, user_id: int, server: str) -> StoredCredential | None:
    row = conn.execute(
        "SELECT ciphertext, wrapped_dek, kek_version, inject_header, inject_format, placeholder,"
        " allowed_hosts FROM credentials WHERE user_id = ? AND server = ?",
        (user_id, server),
    ).fetchone()
    if row is None:
        return None
    try:
        hosts = json.loads(row[6])
    except ValueError:
        hosts = []
    return StoredCredential(
        inject_header=row[3],
        inject_format=row[4],
        placeholder=row[5],
        allowed_hosts=[h for h in hosts if isinstance(h, str)] if isinstance(hosts, list) else [],
        sealed=Sealed(row[0], row[1], row[2]),
    )
