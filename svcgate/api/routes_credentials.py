"""Credentials of the calling user: ``GET /api/credentials``, ``PUT|DELETE .../{server}``.

Scope is the effective user (under view-as the admin sees the target's metadata, read-only).
Secrets are write-only: no response ever carries one or anything derived from it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from pydantic import BaseModel, ConfigDict
from quart import Blueprint, Response

from svcgate import credentials
from svcgate.api.context import access, caller, json_body, services

bp = Blueprint("credentials", __name__, url_prefix="/api/credentials")


class CredentialBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)
    secret: str
    inject_header: str | None = None
    inject_format: str | None = None
    placeholder: str | None = None
    allowed_hosts: list[str] | None = None


@bp.get("")
@access("session")
async def list_credentials() -> list[dict[str, Any]]:
    user_id = caller().user.id
    return await services().store.read(lambda conn: credentials.list_metadata(conn, user_id))


@bp.put("/<server>")
@access("session")
async def put_credential(server: str) -> Response:
    credentials.check_server_param(server)
    body = await json_body(CredentialBody)
    data = credentials.validate(
        body.secret, body.inject_header, body.inject_format, body.placeholder, body.allowed_hosts
    )
    user_id = caller().user.id
    vault = services().vault

    def store(conn: sqlite3.Connection) -> None:
        credentials.upsert(conn, vault, user_id, server, data)

    await services().store.write(store)
    return Response(b"", status=204)


@bp.delete("/<server>")
@access("session")
async def delete_credential(server: str) -> Response:
    credentials.check_server_param(server)
    user_id = caller().user.id
    await services().store.write(lambda conn: credentials.delete(conn, user_id, server))
    return Response(b"", status=204)
