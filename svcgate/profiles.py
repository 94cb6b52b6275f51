"""Profiles and their server bundles: SQL helpers run inside the store's transactions.

Tokens: ``svc_`` + 32 random bytes; only the hex SHA-256 is stored and the plaintext exists
only in the create and rotate responses. Audit rows (kind ``admin``) are attributed to the
profile's owner so the owner's audit view is complete; when an admin acts on someone else's
profile the detail names the actor.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from svcgate import audit
from svcgate.accounts import SessionInfo
from svcgate.clock import now_iso
from svcgate.errors import Conflict, Invalid, NotFound
from svcgate.tokens import new_profile_token, sha256_hex

SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
NAME_MAX = 128


@dataclass(frozen=True)
class Profile:
    id: int
    slug: str
    name: str
    user_id: int
    servers: tuple[str, ...]

    def public(self, token: str | None = None) -> dict[str, Any]:
        body = _public(self.id, self.slug, self.name, self.user_id, list(self.servers))
        if token is not None:
            body["token"] = token
        return body


def _public(
    profile_id: int, slug: str, name: str, user_id: int, servers: list[str]
) -> dict[str, Any]:
    """A profile as the API shows it."""
    return {
        "id": profile_id,
        "slug": slug,
        "name": name,
        "user_id": user_id,
        "endpoint": f"/mcp/p/{slug}",
        "servers": servers,
    }


def check_slug(slug: str) -> None:
    if SLUG.fullmatch(slug) is None:
        raise Invalid("slug must match ^[a-z0-9][a-z0-9-]{1,62}$")


def check_name(name: str) -> None:
    if not 1 <= len(name) <= NAME_MAX:
        raise Invalid(f"name must be 1 to {NAME_MAX} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise Invalid("name must not contain control characters")


def _servers_of(conn: sqlite3.Connection, profile_ids: list[int]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {pid: [] for pid in profile_ids}
    if not profile_ids:
        return found
    marks = ",".join("?" * len(profile_ids))
    for row in conn.execute(
        "SELECT ps.profile_id, s.name FROM profile_servers ps JOIN servers s ON s.id = ps.server_id"
        f" WHERE ps.profile_id IN ({marks}) ORDER BY s.name",
        profile_ids,
    ):
        found[row[0]].append(row[1])
    return found


def _build(conn: sqlite3.Connection, rows: list[sqlite3.Row]) -> list[Profile]:
    servers = _servers_of(conn, [row["id"] for row in rows])
    return [
        Profile(
            id=row["id"],
            slug=row["slug"],
            name=row["name"],
            user_id=row["user_id"],
            servers=tuple(servers[row["id"]]),
        )
        for row in rows
    ]


def visible_owner(session: SessionInfo) -> int | None:
    """Whose profiles the caller sees: None means everyone's (an admin not viewing as)."""
    if session.impersonating:
        return session.user.id
    return None if session.real_user.role == "admin" else session.real_user.id


_LISTING = (
    "SELECT p.id, p.slug, p.name, p.user_id, s.name FROM profiles p"
    " LEFT JOIN profile_servers ps ON ps.profile_id = p.id"
    " LEFT JOIN servers s ON s.id = ps.server_id"
    " {where} ORDER BY p.id"
)


def list_public(conn: sqlite3.Connection, owner: int | None) -> list[dict[str, Any]]:
    """The public form (:meth:`Profile.public`) of every profile of ``owner`` (None: all),
    by id, with their servers sorted by name.

    One query in profile order (the profiles, their bundles and the server names joined),
    grouped here, straight into the response's dicts: a listing has no paging (SPEC), so it
    costs per profile, and this keeps that cost to one joined row each (no list of every id
    bound as SQL parameters, no intermediate objects). Bundles are sorted here: sorting
    them in SQL (``ORDER BY p.id, s.name``) costs a sorter per profile, more than the
    whole query otherwise."""
    where, params = ("WHERE p.user_id = ?", (owner,)) if owner is not None else ("", ())
    cursor = conn.cursor()
    cursor.row_factory = None  # plain tuples: cheaper than sqlite3.Row per row
    found: list[dict[str, Any]] = []
    servers: list[str] = []
    unsorted: list[list[str]] = []
    last = None
    for profile_id, slug, name, user_id, server in cursor.execute(
        _LISTING.format(where=where), params
    ):
        if profile_id != last:
            last, servers = profile_id, []
            found.append(_public(profile_id, slug, name, user_id, servers))
        if server is not None:
            servers.append(server)
            if len(servers) == 2:
                unsorted.append(servers)
    for names in unsorted:
        names.sort()  # code point order: SQLite's BINARY collation of UTF-8, as elsewhere
    return found


def get_profile(conn: sqlite3.Connection, profile_id: int, owner: int | None) -> Profile:
    """The profile, or NotFound, identical whether it is missing or someone else's."""
    row = conn.execute(
        "SELECT id, slug, name, user_id FROM profiles WHERE id = ?", (profile_id,)
    ).fetchone()
    if row is None or (owner is not None and row["user_id"] != owner):
        raise NotFound("no such profile")
    return _build(conn, [row])[0]


def _detail(profile: Profile, actor_id: int, extra: str = "") -> str:
    detail = f"slug={profile.slug}"
    if extra:
        detail += f" {extra}"
    if actor_id != profile.user_id:
        detail += f" actor={actor_id}"
    return detail


def _audit(
    conn: sqlite3.Connection, decision: str, profile: Profile, actor: int, extra: str = ""
) -> None:
    audit.record(
        conn,
        kind="admin",
        decision=decision,
        user_id=profile.user_id,
        profile_id=profile.id,
        detail=_detail(profile, actor, extra),
    )


def create_profile(
    conn: sqlite3.Connection, owner: int, name: str, slug: str
) -> tuple[Profile, str]:
    token = new_profile_token()
    now = now_iso()
    try:
        cur = conn.execute(
            "INSERT INTO profiles (slug, name, user_id, token_hash, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (slug, name, owner, sha256_hex(token), now, now),
        )
    except sqlite3.IntegrityError as exc:
        raise Conflict(f"slug {slug!r} is already taken") from exc
    assert cur.lastrowid is not None
    profile = Profile(id=cur.lastrowid, slug=slug, name=name, user_id=owner, servers=())
    _audit(conn, "profile_create", profile, owner)
    return profile, token


def rename_profile(conn: sqlite3.Connection, profile: Profile, name: str, actor: int) -> Profile:
    conn.execute(
        "UPDATE profiles SET name = ?, updated_at = ? WHERE id = ?", (name, now_iso(), profile.id)
    )
    renamed = Profile(profile.id, profile.slug, name, profile.user_id, profile.servers)
    _audit(conn, "profile_rename", renamed, actor)
    return renamed


def rotate_token(conn: sqlite3.Connection, profile: Profile, actor: int) -> str:
    token = new_profile_token()
    conn.execute(
        "UPDATE profiles SET token_hash = ?, updated_at = ? WHERE id = ?",
        (sha256_hex(token), now_iso(), profile.id),
    )
    _audit(conn, "profile_token_rotate", profile, actor)
    return token


def delete_profile(conn: sqlite3.Connection, profile: Profile, actor: int) -> None:
    conn.execute("DELETE FROM profiles WHERE id = ?", (profile.id,))
    _audit(conn, "profile_delete", profile, actor)


def set_servers(
    conn: sqlite3.Connection, profile: Profile, names: list[str], actor: int
) -> Profile:
    wanted = sorted(set(names))
    ids: list[int] = []
    for name in wanted:
        row = conn.execute("SELECT id FROM servers WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise Invalid(f"{name[:64]!r} is not an installed server")
        ids.append(row[0])
    conn.execute("DELETE FROM profile_servers WHERE profile_id = ?", (profile.id,))
    conn.executemany(
        "INSERT INTO profile_servers (profile_id, server_id) VALUES (?, ?)",
        [(profile.id, sid) for sid in ids],
    )
    conn.execute("UPDATE profiles SET updated_at = ? WHERE id = ?", (now_iso(), profile.id))
    updated = Profile(profile.id, profile.slug, profile.name, profile.user_id, tuple(wanted))
    _audit(conn, "profile_servers", updated, actor, "servers=" + ",".join(wanted))
    return updated
