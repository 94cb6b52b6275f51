"""``GET /api/audit``: newest first, keyset pagination, visibility by caller."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, request

from svcgate import audit
from svcgate.api.context import access, caller, services
from svcgate.api.openapi import documented, ref
from svcgate.errors import Invalid

MAX_ID = 2**63 - 1

bp = Blueprint("audit", __name__, url_prefix="/api")


def _int_param(name: str, *, low: int, high: int | None = None) -> int | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.lstrip("-").isdigit() or len(raw) > 19:
        raise Invalid(f"{name} must be an integer")
    value = int(raw)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise Invalid(f"{name} must be {bound}")
    return value


@bp.get("/audit")
@access("session")
@documented(
    "Audit events, newest first, keyset pagination",
    response=ref("AuditPage"),
    errors=(400,),
    parameters=(
        {
            "name": "before",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": 200},
        },
        {
            "name": "user_id",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
        },
    ),
)
async def list_audit() -> dict[str, Any]:
    session = caller()
    before = _int_param("before", low=0, high=MAX_ID)
    limit = _int_param("limit", low=1, high=audit.MAX_PAGE) or audit.DEFAULT_PAGE
    requested_user = _int_param("user_id", low=0, high=MAX_ID)
    if session.impersonating:
        user_filter: int | None = session.user.id
    elif session.real_user.role == "admin":
        user_filter = requested_user
    else:
        user_filter = session.real_user.id
    query = audit.AuditQuery(before=before, limit=limit, user_id=user_filter)
    return await services().store.read(lambda conn: audit.page(conn, query))
