"""The caller and the users: ``/api/me``, ``/api/users``, ``/api/admin/impersonate``."""

from __future__ import annotations

import sqlite3
from typing import Any

from pydantic import BaseModel, ConfigDict
from quart import Blueprint, Response

from svcgate import accounts
from svcgate.api.context import access, caller, json_body, services
from svcgate.api.openapi import array_of, documented, ref
from svcgate.errors import Invalid, NotFound

bp = Blueprint("session", __name__, url_prefix="/api")


@bp.get("/me")
@access("session")
@documented("The signed-in (effective) user", response=ref("Me"))
async def me() -> dict[str, Any]:
    session = caller()
    body: dict[str, Any] = {"user": session.user.public(), "impersonating": session.impersonating}
    if session.impersonating:
        body["real_user"] = session.real_user.public()
        body["impersonation_expires_at"] = session.impersonation_expires_at
    return body


@bp.get("/users")
@access("admin")
@documented("All users (admins)", response=array_of("User"))
async def users() -> list[dict[str, Any]]:
    found = await services().store.read(accounts.list_users)
    return [user.public() for user in found]


class ImpersonateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    user_id: int
    # Anything goes here: SPEC clamps a missing, invalid or too large TTL to 60 minutes.
    ttl_minutes: Any = None


@bp.post("/admin/impersonate")
@access("admin")
@documented(
    "Start view-as (TTL clamped to 60 minutes)",
    status=204,
    request=ImpersonateRequest,
    errors=(404,),
)
async def start_impersonation() -> Response:
    session = caller()
    body = await json_body(ImpersonateRequest)
    if body.user_id == session.real_user.id:
        raise Invalid("you cannot impersonate yourself")
    minutes = accounts.clamp_ttl_minutes(body.ttl_minutes)

    def start(conn: sqlite3.Connection) -> None:
        target = accounts.get_user(conn, body.user_id)
        if target is None:
            raise NotFound("no such user")
        accounts.start_impersonation(conn, session, target, minutes)

    await services().store.write(start)
    return Response(b"", status=204)


@bp.delete("/admin/impersonate")
@access("admin")
@documented("Stop view-as", status=204)
async def stop_impersonation() -> Response:
    session = caller()
    await services().store.write(lambda conn: accounts.stop_impersonation(conn, session))
    return Response(b"", status=204)
