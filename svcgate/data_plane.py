"""Data-plane authentication for ``/mcp``, ``/`` and ``/mcp/p/<slug>``.

The MCP aggregation itself arrives with the data-plane issue; until then a request that
passes authentication is answered with 501. Authentication is already final:

- legacy: ``Authorization: Bearer <SVC_BEARER_TOKEN>``, compared in constant time;
- profile: the presented token is re-hashed and looked up as (slug, hash) on every request,
  with no cache, so a rotated or deleted token fails on the next request.

Every failure is the same 401 with ``WWW-Authenticate: Bearer``, whether the slug exists or
not (THREATS.md A1). Tokens in the query string or in cookies are never read (A3).
"""

from __future__ import annotations

import hmac
import re
import sqlite3

from svcgate.asgi_io import Receive, Scope, Send, header, send_json
from svcgate.errors import envelope
from svcgate.store import Store
from svcgate.tokens import sha256_hex

_BEARER = re.compile(rb"^[Bb][Ee][Aa][Rr][Ee][Rr] +([\x21-\x7e]+) *$")
_UNAUTHORIZED = envelope("unauthenticated", "missing or invalid bearer token")
_NOT_YET = envelope("not_implemented", "the MCP data plane is not available in this build")


def bearer_token(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    if value is None:
        return None
    match = _BEARER.match(value)
    return match.group(1).decode("ascii") if match else None


async def _deny(send: Send) -> None:
    await send_json(send, 401, _UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])


class DataPlane:
    def __init__(self, legacy_token: str, store: Store) -> None:
        self._legacy_token = legacy_token.encode()
        self._store = store

    def legacy_authorized(self, scope: Scope) -> bool:
        token = bearer_token(scope)
        # compare_digest on bytes of possibly different lengths is still constant-time in
        # the secret's content; only the length can leak, as for any comparison.
        return token is not None and hmac.compare_digest(token.encode(), self._legacy_token)

    async def profile_id_for(self, slug: str, token: str | None) -> int | None:
        if token is None or not slug:
            return None
        token_hash = sha256_hex(token)

        def lookup(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT id FROM profiles WHERE slug = ? AND token_hash = ?", (slug, token_hash)
            ).fetchone()
            return int(row[0]) if row else None

        return await self._store.read(lookup)

    async def legacy(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.legacy_authorized(scope):
            await _deny(send)
            return
        await send_json(send, 501, _NOT_YET)

    async def profile(self, scope: Scope, receive: Receive, send: Send) -> None:
        slug = scope["path"][len("/mcp/p/") :].split("/", 1)[0]
        if await self.profile_id_for(slug, bearer_token(scope)) is None:
            await _deny(send)
            return
        await send_json(send, 501, _NOT_YET)
