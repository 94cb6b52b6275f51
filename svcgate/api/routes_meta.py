"""``GET /api/openapi.json``: the control plane's OpenAPI 3.1 document."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, current_app

from svcgate.api.context import access
from svcgate.api.openapi import build_document, documented

bp = Blueprint("meta", __name__, url_prefix="/api")


@bp.get("/openapi.json")
@access("public")
@documented("This OpenAPI document", response={"type": "object"})
async def openapi() -> dict[str, Any]:
    return build_document(current_app)
