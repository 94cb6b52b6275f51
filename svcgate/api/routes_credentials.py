"""Credentials of the calling user: ``GET /api/credentials``, ``PUT|DELETE .../{server}``.

Scope is the effective user (under view-as the admin sees the target's metadata, read-only).
Secrets are write-only: no response ever carries one or anything derived from it.

Sandboxes receive the credential's placeholder in their environment when they start, so a
change that alters it (a new credential, a new placeholder, a deletion) restarts the warm
runtimes of the user's profiles that hold the server. A change of the secret alone does
not: the egress proxy reads the credential at every request.
"""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response

from svcgate import credentials
from svcgate.api.context import access, caller, json_body, services
from svcgate.api.openapi import array_of, documented

SERVER_PARAM = {
    "name": "server",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"},
}

bp = Blueprint("credentials", __name__, url_prefix="/api/credentials")


class CredentialBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)
    secret: Annotated[str, Field(min_length=1, max_length=65536, pattern=r"^[^\r\n\x00]*$")]
    inject_header: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9-]+$")] | None = None
    inject_format: (
        Annotated[str, Field(max_length=256, pattern=r"^[^\r\n\x00]*\{token\}[^\r\n\x00]*$")] | None
    ) = None
    placeholder: (
        Annotated[str, Field(min_length=8, max_length=256, pattern=r"^[^\x00-\x1f\x7f]*$")] | None
    ) = None
    allowed_hosts: (
        Annotated[
            list[Annotated[str, Field(max_length=253, pattern=r"^(\*\.)?[a-z0-9.-]+$")]],
            Field(max_length=64),
        ]
        | None
    ) = None


@bp.get("")
@access("session")
@documented("Credential metadata of the calling user", response=array_of("CredentialMetadata"))
async def list_credentials() -> list[dict[str, Any]]:
    user_id = caller().user.id
    return await services().store.read(lambda conn: credentials.list_metadata(conn, user_id))


@bp.put("/<server>")
@access("session")
@documented(
    "Create or replace a credential (the secret is write-only)", status=204, request=CredentialBody
)
async def put_credential(server: str) -> Response:
    credentials.check_server_param(server)
    body = await json_body(CredentialBody)
    data = credentials.validate(
        body.secret, body.inject_header, body.inject_format, body.placeholder, body.allowed_hosts
    )
    user_id = caller().user.id
    vault = services().vault

    def store(conn: sqlite3.Connection) -> list[int]:
        changed = credentials.upsert(conn, vault, user_id, server, data)
        return credentials.profiles_using(conn, user_id, server) if changed else []

    changed = await services().store.write(store)
    credentials.mark_changed()
    await _restart(changed)
    return Response(b"", status=204)


async def _restart(profile_ids: list[int]) -> None:
    """Sandboxes get the placeholder at start: restart the runtimes that hold a stale one."""
    if profile_ids:
        await services().runtimes.invalidate(profile_ids, reason="credential changed")


@bp.delete("/<server>")
@access("session")
@documented(
    "Delete a credential (idempotent)", status=204, errors=(400,), parameters=(SERVER_PARAM,)
)
async def delete_credential(server: str) -> Response:
    credentials.check_server_param(server)
    user_id = caller().user.id

    def remove(conn: sqlite3.Connection) -> list[int]:
        gone = credentials.delete(conn, user_id, server)
        return credentials.profiles_using(conn, user_id, server) if gone else []

    changed = await services().store.write(remove)
    credentials.mark_changed()
    await _restart(changed)
    return Response(b"", status=204)
